"""``accel qualify --backend cpu --backend emu``: one report with the two backends side by side.

A small selection (``-k``, ``--ops-k``, no benchmarks) keeps it short: a test that passes on both backends and one
that only runs on an accelerator, so the report must show a pass on each side and emu running what
cpu skips, with the skip's reason code.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accel_emu", reason="the accel-emu plug-in is not installed (pip install -e plugins/accel-emu)")

REPO = Path(__file__).resolve().parents[3]
# passes everywhere / needs an accelerator (skips on cpu with a reason code)
SELECTION = "test_identity_and_availability or test_a_real_device_out_of_memory_is_recognised_and_recovered_from"
#: the quick operator sweep on a few operators that every backend lists in float32 and bfloat16
OPS_SELECTION = "add,mul,sub"
TIMEOUT_S = 300  # a cold build of the emu extension alone can take minutes on a busy machine


def _table_rows(markdown: str, heading: str) -> list[list[str]]:
    """The body rows of the first table after ``heading`` (cells stripped, markdown escapes removed)."""
    section = markdown.split(heading, 1)
    assert len(section) == 2, f"the report has no {heading!r} section:\n{markdown[:3000]}"
    rows = []
    for line in section[1].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip().replace("\\_", "_").strip("*") for cell in line.strip().strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            continue  # the separator row
        rows.append(cells)
    return rows[1:]  # without the header row


def test_qualify_cpu_and_emu_side_by_side(tmp_path):
    """One qualify run, three views of it: the report, summary.json and the operator stage's tables (one test,
    so the run is never repeated by a second xdist worker)."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_DEVICE", "PYTEST_"))}
    env.update(OMP_NUM_THREADS="1", ACCEL_EMU_MEMORY="256MiB")  # a small device fills up quickly
    command = [sys.executable, "-m", "accel.commands.cli", "qualify", "--backend", "cpu", "--backend", "emu",
               "-k", SELECTION, "--ops-k", OPS_SELECTION, "--no-bench", "--json", "-n", "0", "-o", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO, env=env)
    assert result.returncode == 0, f"accel qualify failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    summary = json.loads((out / "summary.json").read_text())
    _check_the_report_shows_cpu_and_emu_side_by_side(out)
    _check_the_summary_names_both_backends(summary)
    _check_the_operator_stage_ran_on_both_backends_and_compared_every_selected_operator(out, summary)


def _check_the_report_shows_cpu_and_emu_side_by_side(out: Path) -> None:
    report = (out / "report" / "report.md").read_text()
    matrix = {row[0]: row for row in _table_rows(report, "## Summary matrix")}
    assert set(matrix) == {"cpu", "emu"}, f"summary matrix rows: {sorted(matrix)}"
    # columns: backend, torch, accel, runs, passed, failed, errors, skipped, ...
    for name, row in matrix.items():
        assert int(row[4]) >= 1, f"{name} passed nothing: {row}"
        assert int(row[5]) == 0 and int(row[6]) == 0, f"{name} failed: {row}"
    assert int(matrix["cpu"][7]) >= 1, f"cpu should skip the accelerator-only test: {matrix['cpu']}"
    assert int(matrix["emu"][4]) > int(matrix["cpu"][4]), "emu should run (and pass) what cpu skips"

    by_backend = {row[0]: row for row in _table_rows(report, "## Pass rate by backend")}
    assert {"cpu", "emu"} <= set(by_backend), f"pass-rate rows: {sorted(by_backend)}"
    assert all(re.match(r"100(\.0)?%", by_backend[name][1]) for name in ("cpu", "emu")), by_backend

    skip_rows = _table_rows(report, "## Skips by reason")
    assert [row[0] for row in skip_rows] == ["not-on-backend"], f"cpu's skip should carry its reason code: {skip_rows}"
    assert "cpu" in skip_rows[0][-1], skip_rows


def _check_the_summary_names_both_backends(summary: dict) -> None:
    assert summary["backends"] == ["cpu", "emu"], summary
    suites = next(stage for stage in summary["stages"] if stage["stage"] == "conformance suites")
    assert suites["exit_code"] == 0 and suites["tests_done"] == 4 and not suites["failing_tests"], suites


def _check_the_operator_stage_ran_on_both_backends_and_compared_every_selected_operator(out: Path, summary: dict) -> None:
    stages = {stage["stage"]: stage for stage in summary["stages"]}
    for name in ("cpu", "emu"):
        assert stages[f"operators ({name})"]["exit_code"] == 0, stages[f"operators ({name})"]
        rows = (out / "ops" / name / "op_support.csv").read_text().splitlines()[1:]
        compared = [r for r in rows if ",passed," in r]
        assert {r.split(",")[0] for r in compared} == {"add", "mul", "sub"}, rows
