"""`accel report`: files written, summary printed, exit codes a CI gate can use."""

from __future__ import annotations

import json

import pytest

from accel.commands import report as report_command
from accel.commands.cli import main
from accel_harness.records import SCHEMA

from _report_data import KNOWN_YAML, bench_file, clustered, rec, run_file


def _steady(seed: float, n: int = 12, scale: float = 1.0) -> list[float]:
    return [scale * (0.5 + 0.005 * ((i * 7 + int(seed * 10)) % 5)) for i in range(n)]


@pytest.fixture
def green(tmp_path):
    return run_file(tmp_path / "green", "green", "cpu", [rec("green", f"test_{i}", "cpu", "passed") for i in range(5)])


def test_clean_results_exit_0_and_print_the_markdown_path(tmp_path, green, capsys):
    out = tmp_path / "out"
    assert main(["report", str(green), "-o", str(out)]) == report_command.EXIT_OK
    printed = capsys.readouterr().out
    assert f"Markdown summary: {out / 'report.md'}" in printed
    assert "1 run, 5 test records, 0 failures (0 untracked), 0 benchmark regressions" in printed
    assert (out / "report.html").is_file() and (out / "report.md").is_file()


def test_untracked_failure_without_baseline_exits_1_and_known_issues_clear_it(tmp_path, capsys):
    results = run_file(tmp_path / "r", "r", "xpu", [
        rec("r", "test_all_gather_a", "xpu", "failed", "RuntimeError: UR", module="suites/test_collectives.py"),
        rec("r", "test_ok", "xpu", "passed"),
    ])
    out = tmp_path / "out"
    assert main(["report", str(results), "-o", str(out)]) == report_command.EXIT_NEW_FAILURES
    known = tmp_path / "known.yaml"
    known.write_text(KNOWN_YAML)
    assert main(["report", str(results), "-o", str(out), "--known-issues", str(known)]) == report_command.EXIT_OK
    assert "(0 untracked)" in capsys.readouterr().out
    assert main(["report", str(results), "-o", str(out), "--fail-on", "none"]) == report_command.EXIT_OK


def test_with_a_baseline_only_new_untracked_failures_fail(tmp_path):
    base = run_file(tmp_path / "base", "base", "cpu", [
        rec("base", "test_old_bug", "cpu", "failed", "AssertionError: old"), rec("base", "test_b", "cpu", "passed")])
    same = run_file(tmp_path / "same", "same", "cpu", [
        rec("same", "test_old_bug", "cpu", "failed", "AssertionError: old"), rec("same", "test_b", "cpu", "passed")])
    worse = run_file(tmp_path / "worse", "worse", "cpu", [
        rec("worse", "test_old_bug", "cpu", "failed", "AssertionError: old"), rec("worse", "test_b", "cpu", "failed", "AssertionError: new")])
    out = str(tmp_path / "out")
    assert main(["report", str(same), "-o", out, "--baseline", str(base)]) == report_command.EXIT_OK
    assert main(["report", str(worse), "-o", out, "--baseline", str(base)]) == report_command.EXIT_NEW_FAILURES
    md = (tmp_path / "out" / "report.md").read_text()
    assert "### New untracked failures (1)" in md and "test\\_b" in md


def test_benchmark_regression_exits_3_and_collection_drop_4_when_asked(tmp_path, green):
    base = tmp_path / "base"
    cur = tmp_path / "cur"
    run_file(base, "base", "cpu", [rec("base", f"test_{i}", "cpu", "passed") for i in range(6)])
    run_file(cur, "cur", "cpu", [rec("cur", f"test_{i}", "cpu", "passed") for i in range(5)])
    bench_file(base, "b", "cpu", {"test_step": _steady(0.1)}, torch="2.8.0")
    bench_file(cur, "c", "cpu", {"test_step": _steady(0.2, scale=1.3)}, torch="2.8.0")  # 30 % slower steps
    out = str(tmp_path / "out")
    assert main(["report", str(cur), "-o", out, "--baseline", str(base)]) == report_command.EXIT_REGRESSIONS
    assert main(["report", str(cur), "-o", out, "--baseline", str(base), "--threshold", "50%"]) == report_command.EXIT_OK
    assert main(["report", str(cur), "-o", out, "--baseline", str(base), "--fail-on", "collection-drop"]) == report_command.EXIT_COLLECTION_DROP
    assert main(["report", str(cur), "-o", out, "--baseline", str(base), "--fail-on", "new-failures"]) == report_command.EXIT_OK
    html = (tmp_path / "out" / "report.html").read_text()
    assert 'id="collection-drop"' in html and "6 → 5 (-1)" in html


def test_new_failures_take_precedence_over_regressions(tmp_path):
    cur = tmp_path / "cur"
    run_file(cur, "cur", "cpu", [rec("cur", "test_a", "cpu", "failed", "AssertionError: x")])
    bench_file(cur, "c1", "cpu", {"test_step": _steady(0.1)}, when="2025-06-01T00:00:00")
    bench_file(cur, "c2", "cpu", {"test_step": _steady(0.3, scale=1.5)}, when="2025-06-02T00:00:00")
    assert main(["report", str(cur), "-o", str(tmp_path / "out")]) == report_command.EXIT_NEW_FAILURES
    assert main(["report", str(cur), "-o", str(tmp_path / "out"), "--fail-on", "regressions"]) == report_command.EXIT_REGRESSIONS


@pytest.mark.parametrize("args, message", [
    (["{missing}", "-o", "{out}"], "no such file or folder"),
    (["{green}", "-o", "{out}", "--format", "pdf"], "expected a comma-separated list"),
    (["{green}", "-o", "{out}", "--fail-on", "everything"], "expected a comma-separated list"),
    (["{green}", "-o", "{out}", "--threshold", "lots"], "expected a fraction"),
    (["{future}", "-o", "{out}"], "schema version 9.1"),
    (["{green}", "-o", "{out}", "--known-issues", "{bad_yaml}"], "not valid YAML"),
    (["{empty_dir}", "-o", "{out}"], "no test results or benchmarks found"),
])
def test_usage_and_input_errors_exit_2(tmp_path, green, capsys, args, message):
    future = tmp_path / "future.jsonl"
    future.write_text(json.dumps({"type": "header", "schema": SCHEMA, "schema_version": "9.1", "run_id": "f"}) + "\n")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("issues: [\n")
    (tmp_path / "empty_dir").mkdir()
    values = {"missing": tmp_path / "nope", "out": tmp_path / "out", "green": green, "future": future,
              "bad_yaml": bad_yaml, "empty_dir": tmp_path / "empty_dir"}
    argv = ["report"] + [a.format(**values) for a in args]
    assert main(argv) == report_command.EXIT_USAGE
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "report.html").exists()


def test_problems_are_warned_on_stderr_and_the_rest_reported(tmp_path, capsys):
    folder = tmp_path / "r"
    clustered(folder)
    (folder / "broken.jsonl").write_text('{"type": "header"\n')
    code = main(["report", str(folder), "-o", str(tmp_path / "out"), "--fail-on", "none", "--format", "md"])
    assert code == report_command.EXIT_OK
    err = capsys.readouterr().err
    assert f"{folder / 'broken.jsonl'}:1:" in err
    assert not (tmp_path / "out" / "report.html").exists()
    assert "## Input problems" in (tmp_path / "out" / "report.md").read_text()
