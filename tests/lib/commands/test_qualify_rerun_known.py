"""`accel qualify --rerun-known`: only the tests known issues cover run, and each entry whose tests now
pass is named; qualify's children are not shadowed by folders named accel or pytest in the caller's
working folder (PYTHONSAFEPATH)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel.commands import qualify
from accel.commands.cli import main
from accel_harness.known_issues import KnownIssues, rerun_verdicts

CONTRACT = "suites/test_backend_contract.py::test_identity_and_availability"

KNOWN = f"""\
issues:
  - id: fixed-long-ago
    title: identity used to fail
    tests: ["{CONTRACT}"]
  - id: error-text-only
    error: "text that never appears"
"""


def _bogus_folder(root: Path) -> Path:
    """A working folder whose ``accel`` and ``pytest`` packages break any import that finds them."""
    for name in ("accel", "pytest"):
        package = root / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"raise ImportError('the bogus {name} in the working folder was imported')\n")
    return root


def _accel_script() -> str:
    script = Path(sys.executable).with_name("accel")
    if not script.is_file():
        pytest.skip("the accel console script is not installed beside this interpreter")
    return str(script)


def test_rerun_known_runs_only_covered_tests_and_names_those_that_pass(tmp_path):
    known = tmp_path / "known.yaml"
    known.write_text(KNOWN)
    cwd = _bogus_folder(tmp_path / "work")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTEST_ADDOPTS", "ACCEL_DEVICE")}
    proc = subprocess.run([_accel_script(), "qualify", "--backend", "cpu", "-n", "0", "--rerun-known", "--known-issues", str(known),
                           "-o", str(out), "--json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "known issue fixed-long-ago now passes (1 of 1 test(s)): remove it" in proc.stdout
    assert "known issue error-text-only: matched by error text only" in proc.stdout
    assert "bogus" not in proc.stdout + (out / "logs" / "suites.log").read_text() + (out / "logs" / "report.log").read_text()
    records = [json.loads(line) for path in (out / "results").glob("*.jsonl") for line in path.read_text().splitlines()]
    tests = [r for r in records if r["type"] == "test"]
    assert [r["nodeid"] for r in tests] == [f"{CONTRACT}[cpu-ws1]"] and tests[0]["outcome"] == "passed"
    assert not (out / "bench").exists()  # no benchmarks in a re-run
    summary = json.loads((out / "summary.json").read_text())
    assert [(v["id"], v["status"]) for v in summary["rerun_known"]] == [("fixed-long-ago", "now-passes"),
                                                                        ("error-text-only", "not-rerunnable")]
    md = (out / "report" / "report.md").read_text()
    assert md.startswith("# accel qualify --rerun-known") and "| fixed-long-ago | identity used to fail | 1 | 0 | now passes: remove it |" in md


def test_children_run_with_a_safe_path(tmp_path, monkeypatch):
    cwd = _bogus_folder(tmp_path / "work")
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    command = [sys.executable, "-m", "pytest", "--version"]
    # the control: without a safe path the caller's folder shadows pytest
    shadowed = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert shadowed.returncode != 0 and "the bogus pytest in the working folder was imported" in shadowed.stderr
    assert qualify.child_environment()["PYTHONSAFEPATH"] == "1"
    log = tmp_path / "step.log"
    assert qualify._step("probe", command, log) == 0
    assert "pytest" in log.read_text() and "bogus" not in log.read_text()
    log = tmp_path / "cli.log"
    assert qualify._step("probe", [sys.executable, "-m", "accel.commands.cli", "report", "--help"], log) == 0
    assert "--collection-threshold" in log.read_text()


def test_rerun_known_without_known_issues_is_a_usage_error(tmp_path, capsys):
    assert main(["qualify", "--backend", "cpu", "--rerun-known", "-o", str(tmp_path / "out")]) == 2
    assert "--rerun-known needs known issues that name tests" in capsys.readouterr().err
    only_errors = tmp_path / "k.yaml"
    only_errors.write_text("- {id: e1, error: boom}\n")
    assert main(["qualify", "--backend", "cpu", "--rerun-known", "--known-issues", str(only_errors),
                 "-o", str(tmp_path / "out2")]) == 2


def test_rerun_verdicts():
    known = KnownIssues.from_data([
        {"id": "fixed", "tests": ["t.py::test_a*"]},
        {"id": "broken", "tests": ["t.py::test_b"]},
        {"id": "elsewhere", "tests": ["t.py::test_c"], "backends": ["xpu"]},
        {"id": "skipped-here", "tests": ["t.py::test_d"]},
        {"id": "text", "error": "boom"},
    ])
    records = [
        {"nodeid": "t.py::test_a[cpu-ws1]", "test_id": "t.py::test_a[ws1]", "backend": "cpu", "outcome": "passed"},
        {"nodeid": "t.py::test_a2[cpu]", "test_id": "t.py::test_a2", "backend": "cpu", "outcome": "xpassed"},
        {"nodeid": "t.py::test_b[cpu]", "test_id": "t.py::test_b", "backend": "cpu", "outcome": "passed"},
        {"nodeid": "t.py::test_b[cpu-ws2]", "test_id": "t.py::test_b[ws2]", "backend": "cpu", "outcome": "xfailed"},
        {"nodeid": "t.py::test_c[cpu]", "test_id": "t.py::test_c", "backend": "cpu", "outcome": "failed"},
        {"nodeid": "t.py::test_d[cpu]", "test_id": "t.py::test_d", "backend": "cpu", "outcome": "skipped"},
    ]
    verdicts = {v.issue.id: v for v in rerun_verdicts(known, records, "2.8.0")}
    assert {k: v.status for k, v in verdicts.items()} == {"fixed": "now-passes", "broken": "still-fails",
                                                          "elsewhere": "not-run", "skipped-here": "not-run",
                                                          "text": "not-rerunnable"}
    assert verdicts["fixed"].line() == "known issue fixed now passes (2 of 2 test(s)): remove it"
    assert verdicts["broken"].line() == "known issue broken still fails (1 of 2 test(s), e.g. t.py::test_b[cpu-ws2])"


def test_the_selection_plugin_deselects_what_no_entry_covers(tmp_path):
    (tmp_path / "test_sel.py").write_text("def test_keep():\n    pass\n\ndef test_other():\n    pass\n\n"
                                          "def test_keep_too():\n    pass\n")
    known = tmp_path / "k.yaml"
    known.write_text("- {id: k1, tests: ['test_sel.py::test_keep*']}\n- {id: k2, error: boom}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "ACCEL_DEVICE")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "accel_harness.known_issues",
                           "--accel-rerun-known", str(known), "test_sel.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed, 1 deselected" in proc.stdout
