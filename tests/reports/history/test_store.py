"""accel_reports.history.store: the SQLite run store, idempotent imports, flakiness, first failure, trends."""

from __future__ import annotations

import random
import sqlite3

import pandas as pd
import pytest

from accel_reports.analyse.benchmarks import compare_benchmarks
from accel_reports.history.store import SCHEMA_VERSION, History, HistoryConflict, HistoryError, open_history
from accel_reports.load.loaders import BENCH_COLUMNS, RUN_COLUMNS, TEST_COLUMNS, load_results

from _report_data import bench_file, longrepr, rec, run_file
from _report_postgres import postgres_server  # noqa: F401  (fixture)

FAIL = longrepr(["AssertionError: loss is nan"])


@pytest.fixture(params=["sqlite", "postgres"])
def target(request, tmp_path):
    """A new, empty history: an SQLite file, or a database on a real PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "h.db")
    return request.getfixturevalue("postgres_server").new_database()


def _count(target, table: str) -> int:
    with History(target) as history:
        return history._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def _run(folder, day: int, outcomes: dict[str, str], *, torch: str = "2.8.0", run_id: str | None = None):
    run_id = run_id or f"run-{torch}-{day:02d}"
    records = [rec(run_id, name, "cpu", outcome, FAIL if outcome == "failed" else None) for name, outcome in outcomes.items()]
    return run_file(folder, run_id, "cpu", records, torch=torch, start=f"2025-06-{day:02d}T00:00:00.000+00:00")


def _times(median: float, seed: int, n: int = 12, spread: float = 0.03) -> list[float]:
    rng = random.Random(seed)
    return [median * rng.lognormvariate(0, spread) for _ in range(n)]


def test_schema_is_created_versioned_and_checked(tmp_path):
    path = tmp_path / "deep" / "history.db"
    with open_history(path) as history:
        assert history.run_ids() == []
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(HistoryError, match=f"schema version {SCHEMA_VERSION + 1}"):
        History(path)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(HistoryError, match="not an accel history"):
        History(other)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(HistoryError, match="not an accel history"):
        History(garbage)
    with pytest.raises(HistoryError, match="folder"):
        History(tmp_path)


def test_import_is_idempotent_and_round_trips_the_frames(tmp_path, target):
    _run(tmp_path / "r", 1, {"test_a": "passed", "test_b": "failed", "test_c": "skipped"})
    bench_file(tmp_path / "r", "bench-1", "cpu", {"test_step": _times(0.5, 1)}, when="2025-06-01T01:00:00")
    loaded = load_results([tmp_path / "r"])
    with History(target) as history:
        first = history.ingest(loaded)
        assert sorted(first.added) == sorted(["run-2.8.0-01", "bench:bench-1@2025-06-01T01:00:00"]) and first.already == []
        again = history.ingest(load_results([tmp_path / "r"]))
        assert again.added == [] and sorted(again.already) == sorted(first.added)
        back = history.load()
    assert _count(target, "tests") == 3  # not 6
    assert _count(target, "benchmarks") == 1
    assert list(back.tests.columns) == TEST_COLUMNS and list(back.runs.columns) == RUN_COLUMNS
    assert list(back.benchmarks.columns) == BENCH_COLUMNS
    ordered = loaded.tests.sort_values("nodeid").reset_index(drop=True)
    restored = back.tests.sort_values("nodeid").reset_index(drop=True)
    for column in ("run_id", "test_id", "outcome", "backend", "torch_version", "signature", "traceback", "duration"):
        assert restored[column].tolist() == ordered[column].tolist(), column
    assert back.benchmarks.iloc[0]["samples"] == pytest.approx(loaded.benchmarks.iloc[0]["samples"])
    assert isinstance(back.benchmarks.iloc[0]["samples"], tuple) and back.benchmarks.iloc[0]["quick"] is False
    assert back.problems == []  # nothing of what was stored needed a note
    assert back.runs.iloc[0]["run_id"] == "run-2.8.0-01" and len(back.files) == 1
    assert ("postgresql://" in back.files[0]) == target.startswith("postgresql://")


def test_the_same_run_id_with_other_content_is_refused_and_nothing_is_written(tmp_path, target):
    _run(tmp_path / "a", 1, {"test_a": "passed"}, run_id="nightly")
    _run(tmp_path / "b", 2, {"test_x": "passed"})
    _run(tmp_path / "b", 3, {"test_a": "failed"}, run_id="nightly")  # another run reusing the id
    with History(target) as history:
        history.ingest(load_results([tmp_path / "a"]))
        with pytest.raises(HistoryConflict, match="'nightly'.*other content"):
            history.ingest(load_results([tmp_path / "b"]))
        assert history.run_ids() == ["nightly"]  # run-2.8.0-02 of the refused import was not written either


def test_a_moved_file_is_still_the_same_run(tmp_path, target):
    _run(tmp_path / "a", 1, {"test_a": "passed"})
    with History(target) as history:
        history.ingest(load_results([tmp_path / "a"]))
        (tmp_path / "a").rename(tmp_path / "moved")
        assert history.ingest(load_results([tmp_path / "moved"])).already == ["run-2.8.0-01"]


def test_flakiness_counts_flips_across_runs(tmp_path, target):
    sequences = {
        "test_steady": "PPPPP",
        "test_flaky": "PFPFP",   # 4 flips
        "test_broke": "PPPFF",   # one flip: a change, not flakiness
        "test_once": "PPFPP",    # 2 flips: failed once among passes
    }
    for day in range(5):
        _run(tmp_path / "r", day + 1, {name: {"P": "passed", "F": "failed"}[seq[day]] for name, seq in sequences.items()})
    with History(target) as history:
        history.ingest(load_results([tmp_path / "r"]))
        table = history.flakiness().set_index("test_id")
    assert set(table.index) == {f"suites/test_core.py::{n}[ws1]" for n in sequences}
    flaky = table.loc["suites/test_core.py::test_flaky[ws1]"]
    assert (flaky["runs"], flaky["passes"], flaky["failures"], flaky["flips"], flaky["flaky"]) == (5, 3, 2, 4, True)
    assert table.loc["suites/test_core.py::test_steady[ws1]", "flips"] == 0
    assert not table.loc["suites/test_core.py::test_steady[ws1]", "flaky"]
    assert table.loc["suites/test_core.py::test_broke[ws1]", "flips"] == 1
    assert not table.loc["suites/test_core.py::test_broke[ws1]", "flaky"]
    assert table.loc["suites/test_core.py::test_once[ws1]", "flaky"]
    assert table.index[0] == "suites/test_core.py::test_flaky[ws1]"  # flakiest first


def test_first_failed_names_the_run_where_the_current_streak_began(tmp_path, target):
    _run(tmp_path / "r", 1, {"test_a": "failed", "test_b": "passed", "test_c": "passed"})
    _run(tmp_path / "r", 2, {"test_a": "passed", "test_b": "passed", "test_c": "failed"})
    _run(tmp_path / "r", 3, {"test_a": "failed", "test_b": "passed", "test_c": "failed"})
    _run(tmp_path / "r", 4, {"test_a": "skipped", "test_b": "failed", "test_c": "failed"})  # a skip does not break a streak
    _run(tmp_path / "r", 5, {"test_a": "failed", "test_b": "failed", "test_c": "failed"})
    _run(tmp_path / "r", 1, {"test_a": "failed"}, torch="2.7.1")  # another cell: its own latest run
    with History(target) as history:
        history.ingest(load_results([tmp_path / "r"]))
        table = history.first_failed()
    by = {(row["torch_version"], row["test_id"].split("::")[1]): row for row in table.to_dict("records")}
    assert set(by) == {("2.8.0", "test_a[ws1]"), ("2.8.0", "test_b[ws1]"), ("2.8.0", "test_c[ws1]"), ("2.7.1", "test_a[ws1]")}
    a = by[("2.8.0", "test_a[ws1]")]
    assert (a["first_failed_run"], a["streak"], a["last_passed_run"]) == ("run-2.8.0-03", 2, "run-2.8.0-02")
    assert a["first_failed_time"].startswith("2025-06-03") and a["latest_run"] == "run-2.8.0-05"
    assert (by[("2.8.0", "test_b[ws1]")]["first_failed_run"], by[("2.8.0", "test_b[ws1]")]["streak"]) == ("run-2.8.0-04", 2)
    assert (by[("2.8.0", "test_c[ws1]")]["first_failed_run"], by[("2.8.0", "test_c[ws1]")]["streak"]) == ("run-2.8.0-02", 4)
    never = by[("2.7.1", "test_a[ws1]")]
    assert never["first_failed_run"] == "run-2.7.1-01" and never["last_passed_run"] is None
    assert "AssertionError: loss is nan" in a["signature"]


def test_load_last_keeps_the_newest_runs_of_each_cell(tmp_path, target):
    for day in range(1, 5):
        _run(tmp_path / "r", day, {"test_a": "passed"})
    _run(tmp_path / "r", 1, {"test_a": "passed"}, torch="2.7.1")
    with History(target) as history:
        history.ingest(load_results([tmp_path / "r"]))
        assert sorted(history.load(last=2).runs["run_id"]) == ["run-2.7.1-01", "run-2.8.0-03", "run-2.8.0-04"]
        assert len(history.load().runs) == 5
        with pytest.raises(ValueError, match="at least 1"):
            history.load(last=0)


def _bench_history(folder, medians: list[float], *, quick_from: int | None = None, seed: int = 0):
    """One benchmark file per median (a step time), a day apart; quick from index ``quick_from``."""
    for i, median in enumerate(medians):
        path = bench_file(folder, f"bench-{i:02d}", "cpu", {"test_step": _times(median, seed + i)},
                          when=f"2025-06-{i + 1:02d}T00:00:00")
        if quick_from is not None and i >= quick_from:
            text = path.read_text().replace('"unit": "samples/s"', '"unit": "samples/s", "quick": true')
            path.write_text(text)


def _statuses(history: History, folder, count: int) -> list[str]:
    """Each run compared, in turn, with the runs stored before it (as ``accel report --history`` does)."""
    statuses = []
    for i in range(count):
        loaded = load_results([folder / f"bench-{i:02d}.json"])
        history.ingest(loaded)
        table = compare_benchmarks(loaded.benchmarks, history=history.benchmarks_frame())
        statuses.append(table.iloc[0]["status"])
    return statuses


def test_identical_runs_on_a_noisy_machine_never_regress(tmp_path, target):
    # run-to-run scatter of 6 % (lognormal), one wild run at -40 %: never a regression
    rng = random.Random(7)
    medians = [0.5 * rng.lognormvariate(0, 0.06) for _ in range(12)]
    medians[6] = 0.5 / 0.6
    _bench_history(tmp_path / "b", medians)
    with History(target) as history:
        statuses = _statuses(history, tmp_path / "b", len(medians))
        trend = history.trends()
    assert statuses[0] == "no reference"
    assert "regression" not in statuses and "improvement" not in statuses
    assert statuses[6] in ("suspect", "too noisy")
    assert list(trend["status"]) == statuses and trend["history_runs"].tolist() == [min(i, 10) for i in range(12)]  # window 10
    assert (trend["band_low"].dropna() < trend["band_high"].dropna()).all()


def test_a_planted_20_percent_slowdown_is_suspect_then_a_regression(tmp_path, target):
    medians = [0.50, 0.51, 0.49, 0.505, 0.495, 0.60, 0.60]
    _bench_history(tmp_path / "b", medians)
    with History(target) as history:
        statuses = _statuses(history, tmp_path / "b", len(medians))
        frame = history.benchmarks_frame()
    assert statuses == ["no reference", "unchanged", "unchanged", "unchanged", "unchanged", "suspect", "regression"]
    last = load_results([tmp_path / "b" / "bench-06.json"]).benchmarks
    row = compare_benchmarks(last, history=frame).iloc[0]
    assert row["history_runs"] == 6 and row["band_low"] < row["ref_value"] < row["band_high"]
    assert row["value"] < row["band_low"]  # a throughput: slower is below the band
    assert "confirmed" in row["evidence"] and row["change"] == pytest.approx(0.5 / 0.6 - 1, abs=0.03)
    assert row["ref_source"] == "history: last 6 full run(s)"


def test_a_quick_run_is_never_compared_with_full_history(tmp_path, target):
    medians = [0.5, 0.5, 0.5, 0.5, 2.0, 2.1]  # the quick runs are 4x slower (smaller problems, other figures)
    _bench_history(tmp_path / "b", medians, quick_from=4)
    with History(target) as history:
        statuses = _statuses(history, tmp_path / "b", len(medians))
        trend = history.trends()
    assert statuses[4] == "quick: not compared"
    assert statuses[5] == "unchanged"  # 5 % off the one quick run before it; 4x off the full ones, never compared
    assert trend.groupby("quick")["history_runs"].max().to_dict() == {False: 3, True: 1}
    row = compare_benchmarks(load_results([tmp_path / "b" / "bench-04.json"]).benchmarks,
                             history=pd.concat([load_results([tmp_path / "b" / f"bench-0{i}.json"]).benchmarks for i in range(4)])).iloc[0]
    assert row["quick"] and row["status"] == "quick: not compared" and "never compared" in row["evidence"]


def test_an_import_killed_half_way_leaves_nothing(tmp_path, target, monkeypatch):
    _run(tmp_path / "r", 1, {"test_a": "passed", "test_b": "passed"})
    bench_file(tmp_path / "r", "bench-1", "cpu", {"test_step": _times(0.5, 1)})
    loaded = load_results([tmp_path / "r"])
    history = History(target)
    real = History._bench_runs

    def broken(loaded_):
        for entry in real(loaded_):
            entry["rows"][0]["value"] = object()  # not storable: fails inside the transaction, after the test run's rows
            yield entry

    monkeypatch.setattr(History, "_bench_runs", staticmethod(broken))
    with pytest.raises(TypeError):
        history.ingest(loaded)
    assert history.run_ids() == []
    monkeypatch.setattr(History, "_bench_runs", staticmethod(real))
    assert len(history.ingest(loaded).added) == 2
    history.close()


# ---------------------------------------------------------------------------- accel report --history
def _report(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "accel.commands.cli", "report", *args], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "CI": ""})


@pytest.fixture
def report(monkeypatch, capsys):
    """``accel report ARGS`` through main() in this process, in ``_report``'s environment: a result with
    ``returncode``, ``stdout`` and ``stderr`` as ``_report`` gives (no new process importing pandas each time)."""
    from types import SimpleNamespace

    from accel.commands.cli import main

    monkeypatch.setenv("CI", "")

    def run(*args):
        capsys.readouterr()
        code = main(["report", *args])
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run


def test_accel_report_appends_to_the_history_and_renders_from_it(tmp_path, target, report):
    db = target
    days = [{"test_flaky": "passed", "test_broke": "passed", "test_ok": "passed"},
            {"test_flaky": "failed", "test_broke": "passed", "test_ok": "passed"},
            {"test_flaky": "passed", "test_broke": "failed", "test_ok": "passed"},
            {"test_flaky": "failed", "test_broke": "failed", "test_ok": "passed"}]
    for day, outcomes in enumerate(days, start=1):
        folder = tmp_path / f"night{day}"
        _run(folder, day, outcomes)
        proc = report(str(folder), "--history", str(db), "-o", str(tmp_path / f"out{day}"), "--fail-on", "none")
        assert proc.returncode == 0, proc.stderr
        assert "1 run(s) added, 0 already stored" in proc.stderr
    again = report(str(tmp_path / "night4"), "--history", str(db), "-o", str(tmp_path / "again"), "--fail-on", "none")
    assert again.returncode == 0 and "0 run(s) added, 1 already stored" in again.stderr
    with History(db) as history:
        assert len(history.run_ids()) == 4  # the second import of night 4 stored nothing
    proc = report("--history", str(db), "-o", str(tmp_path / "all"), "--fail-on", "none")
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "all" / "report.html").read_text()
    md = (tmp_path / "all" / "report.md").read_text()
    assert "Run history" in html and "test_flaky" in html.split('id="history"')[1].split("</section>")[0]
    assert "first failed in run run-2.8.0-03" in html and "last passed in run run-2.8.0-02" in html
    assert "## Run history" in md and "1 flaky test" in md
    last = report("--history", str(db), "--last", "1", "-o", str(tmp_path / "last"), "--fail-on", "none")
    assert last.returncode == 0 and "1 run," in last.stdout


def test_accel_report_history_usage_errors(tmp_path, report):
    proc = report("-o", str(tmp_path / "o"))
    assert proc.returncode == 2 and "--history DB" in proc.stderr
    (tmp_path / "bad.db").write_bytes(b"not a database" * 50)
    proc = report("--history", str(tmp_path / "bad.db"), "-o", str(tmp_path / "o"))
    assert proc.returncode == 2 and "not an accel history" in proc.stderr
    _run(tmp_path / "r", 1, {"test_a": "passed"})
    proc = report(str(tmp_path / "r"), "--last", "2", "-o", str(tmp_path / "o"))
    assert proc.returncode == 2 and "--last" in proc.stderr


def test_a_version_1_history_is_upgraded_with_a_unique_import_order(tmp_path):
    for day in (1, 2, 3):
        _run(tmp_path / "r", day, {"test_a": "passed"})
    path = tmp_path / "h.db"
    with History(path) as history:
        history.ingest(load_results([tmp_path / "r"]))
    db = sqlite3.connect(path)  # as concurrent imports of the version-1 accel left it: repeated numbers
    db.execute("DROP INDEX runs_seq")
    db.execute("UPDATE runs SET seq = 1 WHERE run_id IN ('run-2.8.0-01', 'run-2.8.0-02')")
    db.execute("UPDATE runs SET seq = 2 WHERE run_id = 'run-2.8.0-03'")
    db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with History(path) as history:
        assert history.run_ids() == ["run-2.8.0-01", "run-2.8.0-02", "run-2.8.0-03"]
        assert [r[0] for r in history._db.execute("SELECT seq FROM runs ORDER BY seq")] == [1, 2, 3]
        assert history._db.version() == SCHEMA_VERSION == 2
        with pytest.raises(sqlite3.IntegrityError):
            history._db.execute("UPDATE runs SET seq = 1 WHERE run_id = 'run-2.8.0-03'")


def _tamper(db, kind: str, source: str, *, strip_devices: bool = False) -> None:
    """Point every stored row of ``kind`` at ``source``, as an edited CI cache could."""
    conn = sqlite3.connect(db)
    info = "json_remove(json_set(info, '$.source', ?), '$.devices')" if strip_devices else "json_set(info, '$.source', ?)"
    conn.execute(f"UPDATE runs SET source = ?, info = {info} WHERE kind = ?", (source, source, kind))
    table = "tests" if kind == "tests" else "benchmarks"
    conn.execute(f"UPDATE {table} SET \"row\" = json_set(\"row\", '$.source', ?)", (source,))
    conn.commit()
    conn.close()


@pytest.mark.parametrize("where", ["/dev/zero", "fifo", "outside"])
def test_files_a_history_row_names_are_never_read(tmp_path, where, report):
    import json
    import os

    _run(tmp_path / "r", 1, {"test_a": "passed", "test_b": "failed"})
    bench_file(tmp_path / "r", "bench-1", "cpu", {"test_step": _times(0.5, 1)})
    db = tmp_path / "hist" / "history.db"
    proc = report(str(tmp_path / "r"), "--history", str(db), "-o", str(tmp_path / "first"), "--fail-on", "none")
    assert proc.returncode == 0, proc.stderr
    if where == "fifo":
        source = str(tmp_path / "hist" / "run.jsonl")
        os.mkfifo(source)  # opening it for reading would block until a writer comes: never
    elif where == "outside":
        source = str(tmp_path / "elsewhere" / "secret.json")
        os.makedirs(os.path.dirname(source))
        secret = {"type": "header", "host": "SECRET-HOST", "os": "SECRET-OS",
                  "machine_info": {"node": "SECRET-NODE"}, "benchmarks": [], "commit_info": {"id": "SECRET-COMMIT"}}
        with open(source, "w") as fh:
            fh.write(json.dumps(secret) + "\n")
    else:
        source = where
    _tamper(db, "tests", source, strip_devices=True)
    _tamper(db, "benchmarks", source)
    proc = _report("--history", str(db), "-o", str(tmp_path / "out"), "--fail-on", "none")  # a hang fails at the timeout
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "out" / "report.html").read_text()
    md = (tmp_path / "out" / "report.md").read_text()
    assert "SECRET" not in html and "SECRET" not in md
    assert "cpu-lab-01" in html and "lab-01" in html  # the stored environment of the run and of the benchmarks
    assert "stored by an older accel without their device details" in proc.stderr
    assert "never read" in proc.stderr


def test_a_postgres_url_without_the_driver_names_the_extra(tmp_path):
    import subprocess
    import sys

    code = ("import sys; sys.modules['psycopg'] = None; from accel.commands.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "report", "--history", "postgresql://u:pw@/db?host=/nowhere",
                           "-o", str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'accel[postgres]'" in proc.stderr and "Traceback" not in proc.stderr


def test_a_postgres_url_that_cannot_connect_is_one_clear_error_without_the_password(tmp_path):
    pytest.importorskip("psycopg", reason="the PostgreSQL driver (accel[postgres]) is not installed")
    with pytest.raises(HistoryError, match="cannot connect") as caught:
        History(f"postgresql://someone:hunter2@/db?host={tmp_path}&port=1&connect_timeout=5")
    assert "hunter2" not in str(caught.value)
    assert "postgresql://someone:***@" in str(caught.value)


def test_a_write_lock_not_obtained_in_time_is_a_history_error(tmp_path, monkeypatch):
    import accel_reports.history.db as history_db

    _run(tmp_path / "r", 1, {"test_a": "passed"})
    path = tmp_path / "h.db"
    History(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process importing, for longer than the wait
    monkeypatch.setattr(history_db, "BUSY_TIMEOUT", 0.2)  # where the connection reads it
    try:
        with History(path) as history:
            # the short wait is the one in force, not the production default
            assert history._db.execute("PRAGMA busy_timeout").fetchone()[0] == 200
            with pytest.raises(HistoryError, match="SQLite database failed: database is locked"):
                history.ingest(load_results([tmp_path / "r"]))
            assert history.run_ids() == []  # a reader is not blocked by the writer (WAL)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_stored_values_of_a_wrong_type_are_left_empty_with_a_note(tmp_path, report):
    _run(tmp_path / "r", 1, {"test_a": "passed", "test_b": "failed", "test_c": "passed"})
    bench_file(tmp_path / "r", "bench-1", "cpu", {"test_step": _times(0.5, 1), "test_other": _times(0.2, 2)})
    db = tmp_path / "history.db"
    with History(db) as history:
        history.ingest(load_results([tmp_path / "r"]))
    conn = sqlite3.connect(db)  # an edited history: wrong types where the report expects text and numbers
    conn.execute("""UPDATE tests SET "row" = json_set("row", '$.message', json('{"x": 1}'), '$.duration', 'slow')
                    WHERE test_id LIKE '%::test_b%'""")
    conn.execute("""UPDATE tests SET "row" = json_set("row", '$.outcome', 5) WHERE test_id LIKE '%::test_c%'""")
    conn.execute("UPDATE runs SET info = json_set(info, '$.host', json('[1, 2]')) WHERE kind = 'tests'")
    conn.execute("""UPDATE benchmarks SET "row" = json_set("row", '$.value', 'fast') WHERE bench_id LIKE '%test_other%'""")
    conn.execute("""UPDATE benchmarks SET "row" = json_set("row", '$.samples', json('["a"]'))
                    WHERE bench_id LIKE '%test_step%'""")
    conn.commit()
    conn.close()
    with History(db) as history:
        loaded = history.load()
    notes = " ".join(p.message for p in loaded.problems)
    assert "6 stored value(s) of a wrong type were left empty" in notes  # message, duration, outcome, host, value, samples
    assert "1 stored test record(s) without a valid outcome and 1 benchmark row(s)" in notes
    assert sorted(loaded.tests["test_id"].str.split("::").str[-1]) == ["test_a[ws1]", "test_b[ws1]"]
    row_b = loaded.tests[loaded.tests["test_id"].str.contains("test_b")].iloc[0]
    assert row_b["message"] is None and row_b["duration"] == 0.0 and row_b["outcome"] == "failed"
    assert loaded.runs.iloc[0]["host"] is None and list(loaded.benchmarks["bench_id"].str.contains("test_step")) == [True]
    proc = report("--history", str(db), "-o", str(tmp_path / "out"), "--fail-on", "none")
    assert proc.returncode == 0, proc.stderr
    assert "wrong type" in proc.stderr
