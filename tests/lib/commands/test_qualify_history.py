"""`accel qualify --history DB`: the run's suite results and benchmarks are appended to the run history."""

from __future__ import annotations

from pathlib import Path

from accel.commands import qualify
from accel.commands.cli import main
from accel_reports.history.store import History

from _report_data import bench_file, rec, run_file


def _fake_steps(monkeypatch, run_id: str, outcome: str = "passed") -> list[str]:
    """Stand-ins for the child processes: the suites leave one harness run, the benchmarks one JSON."""
    titles = []

    def fake_step(title, command, log, *rest, **kwargs):
        titles.append(title)
        if title == "conformance suites":
            folder = Path(command[command.index("--results-dir") + 1])
            run_file(folder, run_id, "cpu", [rec(run_id, "test_a", "cpu", outcome), rec(run_id, "test_b", "cpu", "passed")])
        elif title.startswith("operators"):
            folder = Path(command[command.index("-o") + 1]) / "results"
            run_file(folder, f"ops-{run_id}", "cpu", [rec(f"ops-{run_id}", "add", "cpu", "passed")])
        elif title.startswith("benchmarks"):
            folder = Path(command[command.index("--results-dir") + 1])
            bench_file(folder, f"bench-{run_id}", "cpu", {"test_step": [0.5, 0.51, 0.49, 0.5, 0.52]})
        return 0

    monkeypatch.setattr(qualify, "_step", fake_step)
    return titles


def test_qualify_appends_its_run_to_the_history(tmp_path, monkeypatch, capsys):
    db = tmp_path / "history.db"
    titles = _fake_steps(monkeypatch, "q-1")
    assert main(["qualify", "--backend", "cpu", "-o", str(tmp_path / "q1"), "--history", str(db)]) == 0
    assert titles[:3] == ["conformance suites", "operators (cpu)", "benchmarks (cpu)"]
    out = capsys.readouterr().out
    assert f"accel qualify: history {db}: 3 run(s) added, 0 already stored" in out
    with History(db) as history:
        loaded = history.load()
    assert sorted(loaded.runs["run_id"]) == ["ops-q-1", "q-1"] and len(loaded.tests) == 3
    assert list(loaded.benchmarks["bench_id"]) == ["suites/benchmarks/test_perf.py::test_step[bf16-ws1]"]


def test_without_benchmarks_and_with_a_conflicting_run(tmp_path, monkeypatch, capsys):
    db = tmp_path / "history.db"
    _fake_steps(monkeypatch, "q-1")
    assert main(["qualify", "--backend", "cpu", "-o", str(tmp_path / "q1"), "--no-bench", "--ops", "none", "--history", str(db)]) == 0
    assert "1 run(s) added" in capsys.readouterr().out
    # the same run id with other results (a copied folder re-run by hand): refused, named, exit 2 (bad input,
    # as accel report --history exits)
    _fake_steps(monkeypatch, "q-1", outcome="failed")
    assert main(["qualify", "--backend", "cpu", "-o", str(tmp_path / "q2"), "--no-bench", "--ops", "none", "--history", str(db)]) == 2
    err = capsys.readouterr().err
    assert "'q-1'" in err and "other content" in err
    with History(db) as history:
        assert set(history.load().tests["outcome"]) == {"passed"}


def test_no_history_option_no_database(tmp_path, monkeypatch):
    _fake_steps(monkeypatch, "q-1")
    assert main(["qualify", "--backend", "cpu", "-o", str(tmp_path / "q1"), "--no-bench", "--ops", "none"]) == 0
    assert not list(tmp_path.rglob("*.db"))
