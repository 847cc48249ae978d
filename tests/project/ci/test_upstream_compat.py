"""ci.upstream_compat: the nightly side-by-side measure (command line, summary, verdicts) and its
workflow job."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from _ci_data import REPO as _REPO  # noqa: F401  (puts the checkout on sys.path for `ci`)

from ci import upstream_compat
from tests.reports.analyse.test_vendor import ACCEL, REFERENCE, _run

REPO = Path(__file__).resolve().parents[3]


def test_command_runs_both_sides_without_benchmarks(tmp_path):
    cmd = upstream_compat.build_command("accelerate==1.15.0", tmp_path / "q", project="accelerate", workers=2,
                                        extra=["--pip-args", "--index-url http://mirror"], known_issues=upstream_compat.KNOWN_ISSUES)
    assert cmd[:4] == [sys.executable, "-m", "accel.commands.cli", "qualify"]
    assert cmd[cmd.index("--upstream") + 1] == "accelerate==1.15.0"
    assert cmd[cmd.index("--against") + 1] == "accelerate,accel"
    assert "--no-bench" in cmd and "--json" in cmd and cmd[-2:] == ["--pip-args", "--index-url http://mirror"]
    assert cmd[cmd.index("--known-issues") + 1] == str(REPO / "ci" / "upstream_known_issues.yaml")


def test_the_environment_known_issues_load_and_name_the_examples_gap():
    from accel_harness.known_issues import load_known_issues

    known = load_known_issues(upstream_compat.KNOWN_ISSUES)
    assert known.match_test("tests/test_examples.py::ExampleDifferenceTests::test_nlp_examples",
                            "tests/test_examples.py::ExampleDifferenceTests::test_nlp_examples", "cpu", "2.13.0")
    issue = known.match_failure("tests/test_tracking.py::MLflowTest::test_log", "tests/test_tracking.py::MLflowTest::test_log",
                                "cpu", "2.13.0", "mlflow.exceptions.MlflowException: The filesystem tracking backend "
                                "(e.g., './mlruns') is in maintenance mode")
    assert issue is not None and issue.id == "mlflow-file-store"
    assert upstream_compat._project_of("Some-Project==2.0") == "some_project" and upstream_compat._project_of("/x/tests") is None


def test_summary_and_min_share_verdict(tmp_path, monkeypatch):
    results = tmp_path / "compat" / "qualify" / "results"
    results.mkdir(parents=True)
    _run(results, "ref", "accelerate", REFERENCE)
    _run(results, "acc", "accel", ACCEL)
    lines, shares = upstream_compat.summarise(results)
    assert shares == [0.25] and "1 of the 4 tests" in lines[-1]
    report = tmp_path / "compat" / "qualify" / "report"
    report.mkdir()
    (report / "report.md").write_text("# the report\n")
    monkeypatch.setattr(upstream_compat.subprocess, "run", lambda cmd, check: None)  # the qualify run already "happened"
    out = str(tmp_path / "compat")
    assert upstream_compat.main(["--out", out]) == 0
    text = (tmp_path / "compat" / "compat.md").read_text()
    assert text.startswith("# Upstream compatibility: accelerate==1.15.0") and "# the report" in text
    assert upstream_compat.main(["--out", out, "--min-share", "0.95"]) == 1
    assert upstream_compat.main(["--out", str(tmp_path / "nothing")]) == 2


def test_nightly_workflow_runs_the_measure():
    jobs = yaml.safe_load((REPO / ".github" / "workflows" / "nightly.yml").read_text())["jobs"]
    job = jobs["upstream-compat"]
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "python -m ci.upstream_compat --upstream accelerate==1.15.0" in runs
    assert "torch==2.13.0" in runs  # the measure's environment keeps a fixed torch
    assert not job.get("needs")  # independent of the matrix cells
