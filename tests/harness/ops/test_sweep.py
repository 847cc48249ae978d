"""The operator sweep end to end: crash and hang isolation, every outcome named, the command's files."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel_harness.ops.plan import Selection
from accel_harness.ops.runner import run_sweep
from accel_harness.records import read_records

pytest.importorskip("expecttest")

#: the command's environment: the misbehaving entries (tests/support/_ops_entries.py) importable by its workers
_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / "support"), os.environ.get("PYTHONPATH", "")])}

_MISBEHAVING = Selection(kinds=(), dtypes=("float32",), directions=("forward",), variants=("function",), limit=2,
                         extra_opinfos=("_ops_entries:entries",))


#: per-sample limit of the misbehaving sweep: the hanging entry's two samples each cost it, and the other
#: entries' samples (a tensor of four elements, in a worker that has already imported everything) end far below it
_HANG_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def misbehaving_sweep():
    return run_sweep("cpu", _MISBEHAVING, workers=2, timeout=_HANG_TIMEOUT_S, census=False)


def test_a_crash_and_a_hang_each_cost_one_case_and_every_row_gets_its_reason(misbehaving_sweep):
    rows = {row.op: row for row in misbehaving_sweep.rows}
    assert set(rows) == {f"accel_test.{n}" for n in ("good", "wrong", "crash", "hang", "raises", "no_dtype")}
    assert (rows["accel_test.good"].outcome, rows["accel_test.good"].reason_code) == ("passed", "passed")
    assert rows["accel_test.wrong"].reason_code == "mismatch"
    assert rows["accel_test.wrong"].max_abs_err == pytest.approx(1.0)
    assert rows["accel_test.crash"].reason_code == "crash" and "SIGSEGV" in rows["accel_test.crash"].message
    assert rows["accel_test.hang"].reason_code == "timeout"
    assert rows["accel_test.raises"].reason_code == "error" and "device says no" in rows["accel_test.raises"].message
    assert rows["accel_test.no_dtype"].reason_code == "unsupported-dtype"
    for name in ("wrong", "crash", "hang", "raises", "no_dtype"):
        assert rows[f"accel_test.{name}"].outcome == "failed"
    # both samples of the crashing and hanging entries were tried, each in a fresh worker
    assert rows["accel_test.crash"].samples == 2 and rows["accel_test.hang"].samples == 2
    assert misbehaving_sweep.restarts == 4


def test_a_known_issue_naming_the_operator_turns_its_failure_known(misbehaving_sweep):
    from accel_harness.known_issues import KnownIssues
    from accel_harness.ops.output import apply_known_issues

    rows = [dataclasses.replace(row) for row in misbehaving_sweep.rows]
    known = KnownIssues.from_data([{"id": "demo-wrong", "ops": ["accel_test.wr*"], "reason": "known-limitation"}])
    assert apply_known_issues(rows, known, "cpu", "2.13.0") == 1
    by_op = {row.op: row for row in rows}
    assert (by_op["accel_test.wrong"].outcome, by_op["accel_test.wrong"].known_issue) == ("known", "demo-wrong")
    assert by_op["accel_test.crash"].outcome == "failed"


def test_the_command_writes_the_tables_the_records_and_exits_1_on_a_failure(tmp_path):
    out = tmp_path / "ops"
    done = subprocess.run([sys.executable, "-m", "accel.commands.cli", "ops", "--backend", "cpu", "--quick",
                           "--databases", "op", "--extra-opinfos",
                           "_ops_entries:entries", "-k", "accel_test.good,accel_test.wrong,nn.functional.relu",
                           "-n", "2", "-o", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=_ENV)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED accel_test.wrong function float32 forward: mismatch" in done.stdout
    with open(out / "op_support.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0])[:9] == ["op", "variant", "dtype", "direction", "outcome", "reason_code", "max_abs_err",
                                 "max_rel_err", "message"]
    by_key = {(r["op"], r["dtype"]): r for r in rows}
    assert by_key[("nn.functional.relu", "float32")]["outcome"] == "passed"
    assert by_key[("accel_test.wrong", "float32")]["reason_code"] == "mismatch"
    census = list(csv.DictReader(open(out / "census.csv", newline="")))
    assert len(census) > 1000 and {r["kind"] for r in census} >= {"device-kernel", "composite-implicit"}
    header, records, problems = read_records(out / "results" / "ops-cpu.jsonl")
    assert not problems and header["extra"]["stage"] == "operators"
    assert {r["outcome"] for r in records} >= {"passed", "failed"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["headline"]["operators_passed"]["float32"]["compared"] >= 3
    assert "accel_test.wrong" in (out / "ops.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--dtypes", "float33"], "--dtypes: unknown value(s) float33"),
    (["--samples", "-1"], "--samples must be >= 0"),
    (["--extra-opinfos", "nocolon"], "write MODULE:ATTRIBUTE"),
    (["--timeout", "0"], "--timeout must be > 0"),
])
def test_bad_options_are_named(tmp_path, argv, message):
    done = subprocess.run([sys.executable, "-m", "accel.commands.cli", "ops", "--backend", "cpu", *argv, "-o", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "o").exists()
