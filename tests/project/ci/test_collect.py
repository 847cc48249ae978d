"""python -m ci.collect: cells found, the cells table, baselines, one report over several cells."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from _ci_data import REPO  # noqa: F401  (puts the checkout on sys.path for `ci`)
from _report_data import bench_file, longrepr, rec, run_file

from ci import collect


@pytest.fixture
def report_here(monkeypatch):
    """collect's ``accel report`` command run through main() in this process (no new process importing pandas
    for each report); test_one_report_over_two_torch_versions_with_a_baseline runs it as its own process."""
    from accel.commands.cli import main

    def call(command):
        assert command[:4] == [sys.executable, "-m", "accel.commands.cli", "report"], command
        return main(command[3:])

    monkeypatch.setattr(collect.subprocess, "call", call)


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


@pytest.mark.usefixtures("report_here")
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


@pytest.mark.usefixtures("report_here")
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


@pytest.mark.usefixtures("report_here")
def test_history_appends_every_cell_once_and_refuses_a_conflicting_run(tmp_path, capsys):
    from accel_reports.history.store import History

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


# ---------------------------------------------------------------------------- operator sweep rows
def ops_rows(fail: str | None = None, known: str | None = None) -> list:
    """Operator rows as accel ops folds them; ``fail`` names an operator whose float32 row fails."""
    from accel_harness.ops.plan import Row

    rows = []
    for op in ("add", "mul", "nn.functional.relu"):
        for dtype in ("float32", "bfloat16"):
            broken = op == fail and dtype == "float32"
            rows.append(Row("op", op, "function", dtype, "forward", "failed" if broken else "passed",
                            "mismatch" if broken else "passed", samples=3,
                            message="12 of 64 elements differ" if broken else None))
    if known:
        rows.append(Row("op", known, "function", "float32", "forward", "known", "missing-kernel",
                        message="no kernel", known_issue="emu-sparse"))
    return rows


def ops_cell(root: Path, cid: str, torch: str, rows: list, exit_code: int = 0) -> Path:
    """A cell that ran the suites and ``accel ops``: the sweep's files written by accel ops' own writer."""
    from accel_harness.ops.output import write_outputs
    from accel_harness.ops.runner import SweepResult

    folder = cell(root, cid, torch, records(f"{root.name}-{cid}"), ops={
        "mode": "full", "exit_code": exit_code, "verdict": "x", "rows": len(rows),
        "counts": {"failed": sum(r.outcome == "failed" for r in rows)}, "results": "ops/results"})
    write_outputs(SweepResult(backend="cpu", device="cpu", device_type="cpu", torch=f"{torch}+cpu", rows=rows,
                              tasks=3, cases=len(rows), workers=2, seconds=1.0), folder / "ops")
    return folder


def test_ops_results_are_report_inputs_and_baseline_inputs(tmp_path):
    folder = ops_cell(tmp_path / "cells", "cpu-torch2.13.0-py3.11", "2.13.0", ops_rows())
    bare = cell(tmp_path / "cells", "cpu-torch2.14.1-py3.11", "2.14.1", records("b"))
    (bare / "ops" / "results").mkdir(parents=True)  # a sweep that left nothing: no input
    cells = collect.find_cells([tmp_path / "cells"])
    ops_results = str((folder / "ops" / "results").resolve())
    assert collect.report_inputs(cells) == [str((folder / "results").resolve()), ops_results,
                                            str((bare / "results").resolve())]
    assert ops_results in collect.baseline_inputs([str(tmp_path / "cells")])
    assert (folder / "ops" / "results" / "ops-cpu.jsonl").is_file()  # where accel ops puts its records


def test_cells_table_shows_the_operator_sweep(tmp_path):
    ops_cell(tmp_path, "cpu-torch2.13.0-py3.11", "2.13.0", ops_rows(fail="mul"), exit_code=1)
    cell(tmp_path, "cuda-torch2.13.0-py3.11", "2.13.0", records("c"), ops={"mode": "off"})
    table = collect.cells_table(collect.find_cells([tmp_path]), ["xpu-torch2.13.0-py3.11"])
    lines = table.splitlines()
    header = [h.strip() for h in lines[2].strip("|").split("|")]
    assert header[header.index("suites") + 1] == "ops"
    rows = {line.split(" | ")[0].lstrip("| "): [c.strip() for c in line.strip("|").split("|")]
            for line in lines[4:] if line.startswith("| ")}
    assert rows["cpu-torch2.13.0-py3.11"][header.index("ops")] == "full: 6 rows, 1 failed (exit 1)"
    assert rows["cuda-torch2.13.0-py3.11"][header.index("ops")] == "off"
    assert all(len(row) == len(header) for row in rows.values())  # the missing cell's row too
    assert rows["xpu-torch2.13.0-py3.11"][header.index("environment")] == "missing"


@pytest.mark.usefixtures("report_here")
def test_an_operator_row_that_passed_in_the_baseline_and_fails_now_fails_the_gate(tmp_path, capsys):
    cells_root, base_root = tmp_path / "cells", tmp_path / "baseline"
    ops_cell(base_root, "cpu-torch2.13.0-py3.11", "2.13.0", ops_rows())
    ops_cell(cells_root, "cpu-torch2.13.0-py3.11", "2.13.0", ops_rows(fail="mul", known="to_sparse"), exit_code=1)
    known = tmp_path / "known.yaml"
    known.write_text("issues:\n  - id: emu-sparse\n    title: no sparse layouts\n    ops: [to_sparse*]\n")
    db = tmp_path / "history.db"
    code = collect.main([str(cells_root), "-o", str(tmp_path / "report"), "--baseline", str(base_root), "--history", str(db),
                         "--known-issues", str(known)])
    assert code == 1  # a new untracked failure, though the suites all passed
    report = (tmp_path / "report" / "report.md").read_text()
    assert "mul\\[op-function-float32-forward\\]" in report
    assert "full: 7 rows, 1 failed (exit 1)" in (tmp_path / "report" / "summary.md").read_text()
    from accel_reports.history.store import History

    with History(db) as history:
        tests = history.load().tests
        assert any(str(t).startswith("suites/test_ops.py::mul[") for t in tests["nodeid"])
    # the same sweep without the new failure: the known one stays known, the gate passes
    ops_cell(tmp_path / "fixed", "cpu-torch2.13.0-py3.11", "2.13.0", ops_rows(known="to_sparse"))
    code = collect.main([str(tmp_path / "fixed"), "-o", str(tmp_path / "report2"), "--baseline", str(base_root),
                         "--known-issues", str(known)])
    assert code == 0, capsys.readouterr().out
