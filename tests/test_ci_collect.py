"""python -m ci.collect: cells found, the cells table, baselines, one report over several cells."""

from __future__ import annotations

import json
from pathlib import Path

from _ci_data import REPO  # noqa: F401  (puts the checkout on sys.path for `ci`)
from _report_data import bench_file, longrepr, rec, run_file

from ci import collect


def cell(root: Path, cid: str, torch: str, records: list | None, status: str = "ok", **extra) -> Path:
    folder = root / f"cell-{cid}"  # as actions/download-artifact lays artifacts out
    folder.mkdir(parents=True)
    data = {"id": cid, "status": status, "runner": ["ubuntu-latest"], "torch": {"requested": torch, "installed": f"{torch}+cpu"},
            "python": {"requested": "3.11", "version": "3.11.7"}, "duration_s": 75.4, **extra}
    if records is not None:
        run_file(folder / "results", f"run-{cid}", "cpu", records, torch=f"{torch}+cpu", accel="0.1.0")
        counts: dict[str, int] = {}
        for r in records:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        data["suites"] = {"exit_code": 1 if "failed" in counts else 0, "verdict": "x", "counts": counts}
    (folder / "cell.json").write_text(json.dumps(data))
    return folder


def records(run_id: str, fail: bool = False) -> list:
    out = [rec(run_id, f"test_ok_{i}", "cpu", "passed", module="suites/test_collectives.py") for i in range(3)]
    out.append(rec(run_id, "test_four", "cpu", "skipped", "Skipped: [needs-devices] needs 4", module="suites/test_collectives.py"))
    if fail:
        out.append(rec(run_id, "test_broken", "cpu", "failed", longrepr(["AssertionError: loss is nan"]), module="suites/test_training.py"))
    else:
        out.append(rec(run_id, "test_broken", "cpu", "passed", module="suites/test_training.py"))
    return out


def test_cells_table_lists_counts_failures_and_missing_cells(tmp_path):
    cell(tmp_path, "cpu-torch2.13.0-py3.11", "2.13.0", records("a"), bench={"mode": "quick", "benchmarks": 23, "exit_code": 0})
    cell(tmp_path, "cpu-torch2.14.1-py3.11", "2.14.1", None, status="environment-failed", error="pip | failed")
    cells = collect.find_cells([tmp_path])
    assert [d["id"] for _, d in cells] == ["cpu-torch2.13.0-py3.11", "cpu-torch2.14.1-py3.11"]
    table = collect.cells_table(cells, ["cpu-torch2.13.0-py3.11", "cpu-torch2.14.1-py3.11", "cuda-torch2.13.0-py3.11"])
    rows = [line for line in table.splitlines() if line.startswith("| cpu") or line.startswith("| cuda")]
    assert rows[0].split(" | ")[5:9] == ["4", "0", "0", "1"] and "quick: 23 (exit 0)" in rows[0] and "1m15s" in rows[0]
    assert "environment-failed" in rows[1] and "missing" in rows[2]
    assert "**cpu-torch2.14.1-py3.11**: environment-failed: pip \\| failed" in table  # escaped for Markdown
    assert "**cuda-torch2.13.0-py3.11**: missing" in table
    assert collect.report_inputs(cells) == [str((tmp_path / "cell-cpu-torch2.13.0-py3.11" / "results").resolve())]


def test_baseline_inputs_expand_cell_folders_and_skip_absent_ones(tmp_path):
    base = tmp_path / "baseline"
    cell(base, "cpu-torch2.13.0-py3.11", "2.13.0", records("old"))
    (tmp_path / "empty").mkdir()
    found = collect.baseline_inputs([str(base), str(tmp_path / "absent"), str(tmp_path / "empty")])
    assert found == [str((base / "cell-cpu-torch2.13.0-py3.11" / "results").resolve())]  # not cell.json itself


def test_no_results_exits_2_and_still_writes_the_summary(tmp_path, capsys):
    cell(tmp_path / "cells", "cpu-torch2.13.0-py3.11", "2.13.0", None, status="environment-failed", error="no python")
    code = collect.main([str(tmp_path / "cells"), "-o", str(tmp_path / "report")])
    assert code == collect.EXIT_NO_RESULTS and "no cell left any results" in capsys.readouterr().err
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "No cell left any results" in summary and "no python" in summary


def test_one_report_over_two_torch_versions_with_a_baseline(tmp_path, capsys):
    cells_root, base_root = tmp_path / "cells", tmp_path / "baseline"
    cell(base_root, "cpu-torch2.13.0-py3.11", "2.13.0", records("base-a"))
    cell(base_root, "cpu-torch2.14.1-py3.11", "2.14.1", records("base-b"))
    cell(cells_root, "cpu-torch2.13.0-py3.11", "2.13.0", records("now-a"))
    cell(cells_root, "cpu-torch2.14.1-py3.11", "2.14.1", records("now-b", fail=True))
    out = tmp_path / "report"
    code = collect.main([str(cells_root), "-o", str(out), "--baseline", str(base_root), "--expect", "cpu-torch2.13.0-py3.11,cpu-torch2.14.1-py3.11"])
    assert code == 1  # accel report: a new untracked failure
    report = (out / "report.md").read_text()
    assert "| cpu | 2.13.0+cpu |" in report and "| cpu | 2.14.1+cpu |" in report
    assert "test\\_broken\\[ws1\\] | cpu · torch 2.14.1+cpu · accel 0.1.0 | passed | failed" in report  # the diff
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## Cells") and summary.endswith(report) and "No baseline" not in summary
    assert (out / "report.html").stat().st_size > 0
    code = collect.main([str(cells_root), "-o", str(tmp_path / "report2"), "--baseline", str(tmp_path / "absent"), "--fail-on", "none"])
    assert code == 0 and "No baseline" in (tmp_path / "report2" / "summary.md").read_text()
    assert "no baseline in" in capsys.readouterr().out


def bench_cell(root: Path, cid: str, mode: str, seconds: float, when: str) -> None:
    folder = cell(root, cid, "2.13.0", records(f"{root.name}-{cid}"), bench={"mode": mode, "benchmarks": 1, "exit_code": 0})
    times = [seconds * (1 + 0.01 * i) for i in range(10)]
    bench_file(folder / "bench", "bench-1", "cpu", {"test_matmul[cpu-fp32]": times}, torch="2.13.0+cpu", when=when)


def test_only_full_mode_benchmarks_gate_on_regressions(tmp_path, capsys):
    for mode, expected in (("full", 3), ("quick", 0)):
        root = tmp_path / mode
        bench_cell(root / "baseline", "cpu-torch2.13.0-py3.11", mode, 1.0, "2025-06-01T00:00:00")
        bench_cell(root / "cells", "cpu-torch2.13.0-py3.11", mode, 2.0, "2025-06-02T00:00:00")  # half the throughput
        code = collect.main([str(root / "cells"), "-o", str(root / "report"), "--baseline", str(root / "baseline")])
        assert code == expected, mode
        report = (root / "report" / "report.md").read_text()
        assert "test\\_matmul\\[cpu-fp32\\]" in report and "-50.0%" in report  # shown either way
        summary = (root / "report" / "summary.md").read_text()
        assert ("do not fail the nightly" in summary) is (mode == "quick")
    code = collect.main([str(tmp_path / "full" / "cells"), "-o", str(tmp_path / "r3"), "--baseline",
                         str(tmp_path / "full" / "baseline"), "--fail-on", "new-failures"])
    assert code == 0  # regressions not asked for


def test_history_appends_every_cell_once_and_refuses_a_conflicting_run(tmp_path, capsys):
    from accel_reports.history import History

    cells_root = tmp_path / "cells"
    cell(cells_root, "cpu-torch2.13.0-py3.11", "2.13.0", records("night-1"))
    bench_cell(cells_root, "cpu-torch2.14.1-py3.11", "full", 1.0, "2025-06-01T00:00:00")
    db = tmp_path / "store" / "history.db"
    code = collect.main([str(cells_root), "-o", str(tmp_path / "r1"), "--history", str(db), "--fail-on", "none"])
    assert code == 0
    assert "3 run(s) added, 0 already stored" in capsys.readouterr().out  # two test runs, one benchmark run
    # collecting the same cells again (a re-run of the job) stores nothing twice
    assert collect.main([str(cells_root), "-o", str(tmp_path / "r2"), "--history", str(db), "--fail-on", "none"]) == 0
    assert "0 run(s) added, 3 already stored" in capsys.readouterr().out
    with History(db) as history:
        loaded = history.load()
        assert sorted(loaded.runs["run_id"]) == ["cells-cpu-torch2.14.1-py3.11", "night-1"] and len(loaded.tests) == 10
        assert len(loaded.benchmarks) == 1 and loaded.benchmarks.iloc[0]["torch_version"] == "2.13.0+cpu"
    # another night reusing the run id with other results: refused, reported, exit 2
    other = tmp_path / "other"
    cell(other, "cpu-torch2.13.0-py3.11", "2.13.0", records("night-1", fail=True))
    code = collect.main([str(other), "-o", str(tmp_path / "r3"), "--history", str(db), "--fail-on", "none"])
    captured = capsys.readouterr()
    assert code == collect.EXIT_NO_RESULTS and "'night-1'" in captured.err and "other content" in captured.err
    assert "could not be used" in (tmp_path / "r3" / "summary.md").read_text()
    assert (tmp_path / "r3" / "report.md").is_file()  # the report is still written


def test_the_history_is_passed_to_accel_report_when_it_takes_it(tmp_path, monkeypatch):
    cell(tmp_path / "cells", "cpu-torch2.13.0-py3.11", "2.13.0", records("night-1"))
    commands = []

    def fake_call(command):
        commands.append(command)
        out = Path(command[command.index("-o") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text("report\n")
        return 0

    monkeypatch.setattr(collect.subprocess, "call", fake_call)
    db = str(tmp_path / "h.db")
    assert collect.main([str(tmp_path / "cells"), "-o", str(tmp_path / "r"), "--history", db]) == 0
    assert commands[0][commands[0].index("--history") + 1] == db
