"""`accel report`: files written, summary printed, exit codes a CI gate can use."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from accel.commands import report as report_command
from accel.commands.cli import main
from accel_harness.records import SCHEMA

from _report_data import KNOWN_YAML, bench_file, clustered, rec, run_file
from _waits import SAFETY_NET_S


def _steady(seed: float, n: int = 12, scale: float = 1.0) -> list[float]:
    return [scale * (0.5 + 0.005 * ((i * 7 + int(seed * 10)) % 5)) for i in range(n)]


@pytest.fixture(autouse=True)
def _not_under_ci(monkeypatch):
    """--strict's default follows $CI: these tests say what they want, whatever runs them."""
    monkeypatch.delenv("CI", raising=False)


@pytest.fixture
def green(tmp_path):
    return run_file(tmp_path / "green", "green", "cpu", [rec("green", f"test_{i}", "cpu", "passed") for i in range(5)])


def test_clean_results_exit_0_and_print_the_markdown_path(tmp_path, green, capsys):
    out = tmp_path / "out"
    assert main(["report", str(green), "-o", str(out)]) == report_command.EXIT_OK
    printed = capsys.readouterr().out
    assert f"Markdown summary: {out / 'report.md'}" in printed
    assert "1 run, 5 test records, 0 failures (0 not covered by a known issue), 0 benchmark regressions" in printed
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
    assert "(0 not covered by a known issue)" in capsys.readouterr().out
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
    assert 'id="collection-drop"' in html and "6 → 5 (-1, 16.7% of the baseline" in html


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
    (["{green}", "-o", "{a_file}"], "is a file, not a folder"),
    (["{green}", "-o", "{a_file}/sub"], "cannot be made"),
])
def test_usage_and_input_errors_exit_2(tmp_path, green, capsys, args, message):
    future = tmp_path / "future.jsonl"
    future.write_text(json.dumps({"type": "header", "schema": SCHEMA, "schema_version": "9.1", "run_id": "f"}) + "\n")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("issues: [\n")
    (tmp_path / "empty_dir").mkdir()
    a_file = tmp_path / "out.txt"
    a_file.write_text("not a folder")
    values = {"missing": tmp_path / "nope", "out": tmp_path / "out", "green": green, "future": future,
              "bad_yaml": bad_yaml, "empty_dir": tmp_path / "empty_dir", "a_file": a_file}
    argv = ["report"] + [a.format(**values) for a in args]
    assert main(argv) == report_command.EXIT_USAGE
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # not even an empty folder is left behind


def test_a_failed_report_keeps_an_output_folder_that_was_there(tmp_path, capsys):
    (tmp_path / "empty_dir").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    assert main(["report", str(tmp_path / "empty_dir"), "-o", str(out)]) == report_command.EXIT_USAGE
    assert out.is_dir()  # the user's folder: never removed


def test_unreadable_inputs_are_warned_and_exit_2_only_under_strict(tmp_path, capsys):
    folder = tmp_path / "r"
    run_file(folder, "ok", "cpu", [rec("ok", "test_a", "cpu", "passed")])
    (folder / "broken.jsonl").write_text(json.dumps({"type": "header", "schema": SCHEMA, "schema_version": "1.0",
                                                     "run_id": "cut"}) + '\n{"type": "test", "nodeid": "t.py::x", "outc')
    out = str(tmp_path / "out")
    assert main(["report", str(folder), "-o", out, "--no-strict"]) == report_command.EXIT_OK
    err = capsys.readouterr().err
    assert f"unreadable input: {folder / 'broken.jsonl'}:2: incomplete last line" in err
    assert "with --strict (the default under CI) this exits 2" in err
    assert "## Input problems" in (tmp_path / "out" / "report.md").read_text()
    assert main(["report", str(folder), "-o", out, "--strict"]) == report_command.EXIT_INPUT
    assert "1 unreadable input" in capsys.readouterr().err


def test_strict_is_the_default_under_ci(tmp_path, monkeypatch):
    folder = tmp_path / "r"
    run_file(folder, "ok", "cpu", [rec("ok", "test_a", "cpu", "passed")])
    (folder / "empty.jsonl").write_text("")
    out = str(tmp_path / "out")
    assert main(["report", str(folder), "-o", out]) == report_command.EXIT_OK
    monkeypatch.setenv("CI", "true")
    assert report_command.strict_default() is True
    assert main(["report", str(folder), "-o", out]) == report_command.EXIT_INPUT
    assert main(["report", str(folder), "-o", out, "--no-strict"]) == report_command.EXIT_OK
    monkeypatch.setenv("CI", "false")
    assert main(["report", str(folder), "-o", out]) == report_command.EXIT_OK


def test_a_field_of_a_wrong_type_is_exit_2_naming_file_line_and_field_and_the_rest_loads(tmp_path, capsys):
    folder = tmp_path / "r"
    path = run_file(folder, "w", "cpu", [rec("w", "test_a", "cpu", "passed"), rec("w", "test_b", "cpu", "passed")])
    lines = path.read_text().splitlines()
    record = json.loads(lines[2])
    record["duration"] = "fast"  # a string where the schema has a number
    lines[2] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    run_file(folder, "other", "cpu", [rec("other", "test_c", "cpu", "passed")])
    for strictness in ("--strict", "--no-strict"):
        code = main(["report", str(folder), "-o", str(tmp_path / "out"), strictness, "--fail-on", "none"])
        assert code == report_command.EXIT_INPUT  # --fail-on none never turns it off
        captured = capsys.readouterr()
        assert f"invalid input: {path}:3: test record 'suites/test_core.py::test_b[cpu-ws1]': field 'duration': " \
               "expected a finite number, got string 'fast'; the field is left empty" in captured.err
        assert "2 runs, 3 test records" in captured.out  # the record with the bad field and the other run still load
    assert "field &#39;duration&#39;" in (tmp_path / "out" / "report.html").read_text() or \
        "field 'duration'" in (tmp_path / "out" / "report.html").read_text()


def test_invalid_input_comes_before_new_failures(tmp_path, capsys):
    folder = tmp_path / "r"
    run_file(folder, "f", "cpu", [rec("f", "test_a", "cpu", "failed", "AssertionError: x")])
    (folder / "junk.jsonl").write_text("this is not json\n")
    assert main(["report", str(folder), "-o", str(tmp_path / "out")]) == report_command.EXIT_INPUT
    err = capsys.readouterr().err
    assert "junk.jsonl:1: not valid JSON" in err and "cannot be trusted for the gate; exit 2" in err


def test_failing_test_in_a_cut_junit_file_is_never_exit_0(tmp_path, capsys):
    folder = tmp_path / "r"
    folder.mkdir()
    xml = ('<?xml version="1.0"?><testsuite name="pytest" tests="2" hostname="h" timestamp="2025-06-01T00:00:00">\n'
           '<testcase classname="suites.test_j" name="test_ok" time="0.1"/>\n'
           '<testcase classname="suites.test_j" name="test_bad" time="0.1"><failure message="AssertionError: no">E   Assert')
    (folder / "cut.xml").write_text(xml)
    out = str(tmp_path / "out")
    # the failure had begun before the break: it is kept, so even without --strict this is no exit 0
    assert main(["report", str(folder), "-o", out, "--no-strict"]) == report_command.EXIT_NEW_FAILURES
    err = capsys.readouterr().err
    assert "is kept as failed" in err and "unreadable input" in err
    assert main(["report", str(folder), "-o", out, "--strict"]) == report_command.EXIT_INPUT
    # cut before the failure element: the failure is lost, and --strict says the file broke
    (folder / "cut.xml").write_text(xml[: xml.index("<failure")])
    assert main(["report", str(folder), "-o", out, "--strict"]) == report_command.EXIT_INPUT


def test_known_issue_ids_count_only_when_the_known_issues_file_defines_them(tmp_path, capsys):
    folder = tmp_path / "r"
    run_file(folder, "k", "xpu", [
        rec("k", "test_all_gather_a", "xpu", "failed", "RuntimeError: UR", module="suites/test_collectives.py", issue="pytorch-135550"),
        rec("k", "test_made_up", "xpu", "failed", "RuntimeError: other", issue="no-such-issue"),
    ])
    out = str(tmp_path / "out")
    # no known-issues file: no id counts, whatever the results say
    assert main(["report", str(folder), "-o", out]) == report_command.EXIT_NEW_FAILURES
    err = capsys.readouterr().err
    assert "undefined known issue 'no-such-issue'" in err and "no known-issues file is in use" in err
    known = tmp_path / "known.yaml"
    known.write_text(KNOWN_YAML)
    # the file defines pytorch-135550 but not no-such-issue: that failure stays untracked
    assert main(["report", str(folder), "-o", out, "--known-issues", str(known)]) == report_command.EXIT_NEW_FAILURES
    captured = capsys.readouterr()
    assert "2 failures (1 not covered by a known issue)" in captured.out
    assert "undefined known issue 'no-such-issue'" in captured.err and "does not define it" in captured.err
    assert "'pytorch-135550'" not in captured.err
    known.write_text(KNOWN_YAML + "  - id: no-such-issue\n    tests: [\"nothing::matches\"]\n")
    assert main(["report", str(folder), "-o", out, "--known-issues", str(known)]) == report_command.EXIT_OK


def test_non_utf8_file_name_loads_with_a_display_safe_name(tmp_path, capsys):
    folder = tmp_path / "r"
    path = run_file(folder, "plain", "cpu", [rec("plain", "test_a", "cpu", "passed")])
    odd = os.path.join(os.fsencode(folder), b"run-\xff\xfe.jsonl")
    os.rename(path, odd)
    out = tmp_path / "out"
    assert main(["report", str(folder), "-o", str(out)]) == report_command.EXIT_OK
    captured = capsys.readouterr()
    assert "1 run, 1 test record" in captured.out
    assert "run-\ufffd\ufffd.jsonl:0: path is not valid UTF-8" in captured.err
    html = (out / "report.html").read_bytes()
    assert len(html) > 1000 and "run-\ufffd\ufffd.jsonl" in html.decode("utf-8")
    # the name given on the command line (as the shell passes it) works the same
    assert main(["report", os.fsdecode(odd), "-o", str(out)]) == report_command.EXIT_OK


def test_an_unexpected_exception_is_exit_5_with_the_traceback_never_1(tmp_path, green, capsys, monkeypatch):
    from accel_reports.analyse import analysis

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(analysis, "build_report", broken)
    assert main(["report", str(green), "-o", str(tmp_path / "out")]) == report_command.EXIT_INTERNAL == 5
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError: 'a bug'" in err and "internal error" in err


def test_documented_exit_codes_match_the_constants():
    text = report_command.__doc__ + report_command._EPILOG
    for code in (report_command.EXIT_OK, report_command.EXIT_NEW_FAILURES, report_command.EXIT_INPUT,
                 report_command.EXIT_REGRESSIONS, report_command.EXIT_COLLECTION_DROP, report_command.EXIT_INTERNAL):
        assert f"  {code}  " in text
    assert report_command.EXIT_INPUT == report_command.EXIT_USAGE == 2


def test_a_real_process_with_non_utf8_names_and_a_bad_field(tmp_path):
    """The whole command as CI runs it: UTF-8 stdout that refuses surrogates, byte names, exit codes."""
    import subprocess
    import sys

    folder = os.path.join(os.fsencode(tmp_path), b"res\xe9")  # latin-1 "é": not UTF-8
    os.mkdir(folder)
    run_file(Path(os.fsdecode(folder)), "p", "cpu", [rec("p", "test_a", "cpu", "passed")])
    out = os.path.join(os.fsencode(tmp_path), b"out\xff")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTHONIOENCODING")}
    env.update(LC_ALL="C.UTF-8", PYTHONUTF8="1")
    command = [os.fsencode(sys.executable), b"-m", b"accel.commands.cli", b"report", folder, b"-o", out]
    proc = subprocess.run(command, capture_output=True, env=env, timeout=SAFETY_NET_S)
    assert proc.returncode == report_command.EXIT_OK, proc.stderr.decode("utf-8", "replace")
    assert b"out\xef\xbf\xbd/report.md" in proc.stdout and b"Traceback" not in proc.stderr  # shown with U+FFFD
    assert b"res\xef\xbf\xbd/p.jsonl:0: path is not valid UTF-8" in proc.stderr
    assert os.path.getsize(os.path.join(out, b"report.html")) > 1000
    with open(os.path.join(folder, b"p.jsonl"), "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"type": "test", "nodeid": "t.py::x", "outcome": "passed", "world_size": "2"}) + "\n")
    proc = subprocess.run(command + [b"--no-strict"], capture_output=True, env=env, timeout=SAFETY_NET_S)
    assert proc.returncode == report_command.EXIT_INPUT
    assert b"field 'world_size': expected an integer, got string '2'" in proc.stderr
