"""accel_reports.load.loaders: harness JSONL, JUnit XML and pytest-benchmark JSON into tidy frames, tolerantly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accel_harness.records import SCHEMA
from accel_reports.load.loaders import SchemaVersionError, TEST_COLUMNS, load_benchmark_json, load_junit, load_results

from _report_data import bench_file, clustered, rec, run_file


def test_jsonl_one_row_per_test_per_run_with_run_fields(tmp_path):
    paths = clustered(tmp_path)
    loaded = load_results(paths)
    assert loaded.problems == []
    assert list(loaded.tests.columns) == TEST_COLUMNS
    assert len(loaded.runs) == 2
    assert len(loaded.tests) == 2 * 8 + 3 + 2 * (10 + 5)  # failures + passes/skips/xfail per run
    first = loaded.tests[loaded.tests["run_id"] == "run-xpu-2.7.1"]
    assert set(first["torch_version"]) == {"2.7.1"} and set(first["accel_version"]) == {"0.2.0"}
    assert set(first["backend"]) == {"xpu"}
    # device-neutral ids: the backend's parameter is gone
    assert "suites/test_collectives.py::test_all_gather_0[ws2]" in set(first["test_id"])
    skipped = first[first["outcome"] == "skipped"].set_index("test_id")
    assert skipped.loc["suites/test_core.py::test_four_ranks[ws4]", "reason_code"] == "needs-devices"
    assert skipped.loc["suites/test_core.py::test_plain_skip[ws1]", "reason_code"] == "unspecified"


def test_truncated_and_malformed_lines_are_reported_with_file_and_line_and_the_rest_loads(tmp_path):
    good = run_file(tmp_path, "good", "cpu", [rec("good", f"test_{i}", "cpu", "passed") for i in range(3)])
    broken = run_file(tmp_path, "broken", "cpu", [rec("broken", f"test_{i}", "cpu", "passed") for i in range(4)], interrupted=True)
    lines = broken.read_text().splitlines(keepends=True)
    lines[2] = "{this is not json\n"  # line 3: a record destroyed in the middle
    text = "".join(lines) + '{"type": "test", "run_id": "broken", "nodeid": "x'  # a killed writer's last line
    broken.write_text(text)
    loaded = load_results([good, broken])
    by_line = {(Path(p.path).name, p.line): p.message for p in loaded.problems}
    assert ("broken.jsonl", 3) in by_line and "not valid JSON" in by_line[("broken.jsonl", 3)]
    last = len(text.splitlines())
    assert ("broken.jsonl", last) in by_line and "incomplete last line" in by_line[("broken.jsonl", last)]
    assert len(loaded.tests[loaded.tests["run_id"] == "good"]) == 3
    assert len(loaded.tests[loaded.tests["run_id"] == "broken"]) == 3  # 4 written, one destroyed
    assert bool(loaded.runs.set_index("run_id").loc["broken", "interrupted"]) is True


def test_empty_file_is_a_problem_not_a_crash(tmp_path):
    good = run_file(tmp_path, "good", "cpu", [rec("good", "test_a", "cpu", "passed")])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    loaded = load_results([tmp_path])
    assert [(Path(p.path).name, p.line) for p in loaded.problems] == [("empty.jsonl", 1)]
    assert "empty" in loaded.problems[0].message
    assert list(loaded.tests["run_id"]) == ["good"]
    assert str(good) in loaded.files


def test_unknown_schema_version_is_refused_naming_file_and_version(tmp_path):
    path = tmp_path / "future.jsonl"
    path.write_text(json.dumps({"type": "header", "schema": SCHEMA, "schema_version": "7.0", "run_id": "r"}) + "\n")
    with pytest.raises(SchemaVersionError) as info:
        load_results([path])
    assert "future.jsonl" in str(info.value) and "7.0" in str(info.value)


def test_same_run_twice_is_loaded_once(tmp_path):
    path = run_file(tmp_path, "one", "cpu", [rec("one", "test_a", "cpu", "failed", "AssertionError: x")])
    copy = tmp_path / "sub" / "copy.jsonl"
    copy.parent.mkdir()
    copy.write_text(path.read_text())
    loaded = load_results([tmp_path])
    assert len(loaded.tests) == 1
    assert any("already loaded" in p.message for p in loaded.problems)


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="2" tests="6" time="3.2" timestamp="2025-06-01T10:00:00" hostname="lab-7">
<properties><property name="torch_version" value="2.8.0"/><property name="accel_version" value="0.2.0"/></properties>
<testcase classname="suites.test_a" name="test_ok[cuda-ws1]" time="0.1"><properties><property name="accel_backend" value="cuda"/><property name="accel_world_size" value="1"/></properties></testcase>
<testcase classname="suites.test_a.TestGroup" name="test_fail[cuda-ws2]" time="0.2"><failure message="AssertionError: 3 != 4">def test_fail():
&gt;       assert 3 == 4
E       AssertionError: 3 != 4

suites/test_a.py:10: AssertionError</failure></testcase>
<testcase classname="suites.test_a" name="test_err[cuda-ws1]" time="0.0"><error message="failed on setup with &quot;RuntimeError: no device&quot;">RuntimeError: no device 0</error></testcase>
<testcase classname="suites.test_a" name="test_skip[cuda-ws4]" time="0.0"><skipped type="pytest.skip" message="[needs-devices] needs 4 cuda devices, found 1">suites/test_a.py:20: [needs-devices] needs 4</skipped></testcase>
<testcase classname="suites.test_a" name="test_xf[cuda-ws1]" time="0.0"><skipped type="pytest.xfail" message="known bug"/></testcase>
<testcase classname="suites.test_a" name="test_last[cuda-ws1]" time="0.1"/>
</testsuite></testsuites>
"""


def test_junit_outcomes_nodeids_and_properties(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    run, rows, problems = load_junit(path)
    assert problems == []
    assert run["torch_version"] == "2.8.0" and run["host"] == "lab-7" and run["backends"] == "cuda"
    by_id = {r["nodeid"]: r for r in rows}
    assert by_id["suites/test_a.py::test_ok[cuda-ws1]"]["outcome"] == "passed"
    failed = by_id["suites/test_a.py::TestGroup::test_fail[cuda-ws2]"]
    assert failed["outcome"] == "failed" and failed["signature"] == "AssertionError: <N> != <N>"
    assert failed["test_id"] == "suites/test_a.py::TestGroup::test_fail[ws2]"
    assert by_id["suites/test_a.py::test_err[cuda-ws1]"]["outcome"] == "error"
    assert by_id["suites/test_a.py::test_err[cuda-ws1]"]["when"] == "setup"
    skip = by_id["suites/test_a.py::test_skip[cuda-ws4]"]
    assert (skip["outcome"], skip["reason_code"]) == ("skipped", "needs-devices")
    assert by_id["suites/test_a.py::test_xf[cuda-ws1]"]["outcome"] == "xfailed"
    assert by_id["suites/test_a.py::test_ok[cuda-ws1]"]["world_size"] == 1


def test_truncated_junit_keeps_the_cases_before_the_break(tmp_path):
    path = tmp_path / "cut.xml"
    cut = JUNIT.index('<testcase classname="suites.test_a" name="test_xf')
    path.write_text(JUNIT[:cut + 30])
    run, rows, problems = load_junit(path)
    assert len(rows) == 4
    assert len(problems) == 1 and problems[0].line == JUNIT[:cut].count("\n") + 1
    assert "not well-formed" in problems[0].message


def test_junit_external_entities_are_never_resolved(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    path = tmp_path / "xxe.xml"
    path.write_text(f'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY x SYSTEM "file://{secret}">]>'
                    '<testsuite><testcase classname="a" name="t"><failure message="&x;">&x;</failure></testcase></testsuite>')
    loaded = load_results([path])
    assert "TOP-SECRET" not in loaded.tests.to_string()
    assert loaded.problems and loaded.problems[0].path == str(path)


def test_benchmark_json_rows_and_problems(tmp_path):
    good = bench_file(tmp_path, "bench", "cuda", {"test_step": [0.5, 0.51, 0.49, 0.5, 0.52]})
    rows, problems = load_benchmark_json(good)
    assert problems == [] and len(rows) == 1
    row = rows[0]
    assert row["backend"] == "cuda" and row["torch_version"] == "2.8.0" and row["higher_is_better"] is True
    assert row["n_samples"] == 5 and row["value"] == pytest.approx(128 / 0.5)  # throughput from work_size / time
    assert row["bench_id"] == "suites/benchmarks/test_perf.py::test_step[bf16-ws1]"

    empty = tmp_path / "xdist.json"
    empty.write_text("")
    rows, problems = load_benchmark_json(empty)
    assert rows == [] and problems[0].line == 1 and "xdist" in problems[0].message

    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "benchmarks": [\n    {"name": "x",\n')
    rows, problems = load_benchmark_json(broken)
    assert rows == [] and problems[0].line == 4

    doc = json.loads(good.read_text())
    doc["benchmarks"].append({"name": "no_stats", "fullname": "t.py::no_stats"})
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(doc, indent=1))
    rows, problems = load_benchmark_json(partial)
    assert len(rows) == 1 and "no_stats" in problems[0].message and problems[0].line > 1


def test_folder_search_finds_every_kind_and_notes_other_json(tmp_path):
    clustered(tmp_path / "runs")
    bench_file(tmp_path / "bench" / "deep", "b", "xpu", {"test_step": [0.5] * 5})
    (tmp_path / "junit.xml").write_text(JUNIT)
    (tmp_path / "package.json").write_text('{"name": "not a benchmark"}')
    loaded = load_results([tmp_path])
    assert set(loaded.runs["format"]) == {"jsonl", "junit"}
    assert len(loaded.benchmarks) == 1
    assert [Path(p.path).name for p in loaded.problems] == ["package.json"]
    assert "not pytest-benchmark" in loaded.problems[0].message


def test_missing_path_is_a_problem(tmp_path):
    loaded = load_results([tmp_path / "nowhere"])
    assert loaded.empty and "no such file" in loaded.problems[0].message


def test_junit_written_next_to_the_harness_results_is_not_counted_twice(tmp_path):
    records = [rec("r1", "test_ok", "cuda", "passed"), rec("r1", "test_fail", "cuda", "failed", "AssertionError: 3 != 4")]
    run_file(tmp_path, "r1", "cuda", records, start="2025-06-01T10:00:00.000+00:00")
    cases = "".join(f'<testcase classname="suites.test_core" name="{n}[cuda-ws1]" time="0.1"/>' for n in ("test_ok", "test_fail"))
    same = f'<testsuite timestamp="2025-06-01T10:00:01.5+00:00" hostname="cuda-lab-01">{cases}</testsuite>'
    (tmp_path / "same.xml").write_text(same)
    later = same.replace("2025-06-01T10:00:01.5", "2025-06-02T10:00:00")  # the next night's run: a run of its own
    (tmp_path / "later.xml").write_text(later)
    loaded = load_results([tmp_path])
    assert sorted(loaded.runs["source"].map(lambda s: Path(s).name)) == ["later.xml", "r1.jsonl"]
    assert len(loaded.tests) == 4
    assert [Path(p.path).name for p in loaded.problems] == ["same.xml"] and "same pytest session" in loaded.problems[0].message


def test_junit_of_another_cell_in_another_folder_is_its_own_run(tmp_path):
    """Two matrix cells on one host, minutes apart: each folder's JUnit file is not the other's copy."""
    records = [rec("r1", "test_ok", "cuda", "passed")]
    (tmp_path / "cell_a").mkdir()
    (tmp_path / "cell_b").mkdir()
    run_file(tmp_path / "cell_a", "r1", "cuda", records, start="2025-06-01T10:00:00.000+00:00")
    cases = '<testcase classname="suites.test_core" name="test_ok[cuda-ws1]" time="0.1"/>'
    (tmp_path / "cell_b" / "junit.xml").write_text(
        f'<testsuite timestamp="2025-06-01T10:02:00+00:00" hostname="cuda-lab-01">{cases}</testsuite>')
    loaded = load_results([tmp_path])
    assert sorted(loaded.runs["format"]) == ["jsonl", "junit"]
    assert not loaded.problems


# ---------------------------------------------------------------------------- schema checks
def test_problems_have_a_kind(tmp_path):
    run_file(tmp_path, "good", "cpu", [rec("good", "test_a", "cpu", "passed")])
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "junk.jsonl").write_text('{"type": "header", "schema": "accel.results", "schema_version": "1.0", "run_id": "j"}\n[1]\n')
    (tmp_path / "xdist.json").write_text("")
    kinds = {Path(p.path).name: p.kind for p in load_results([tmp_path]).problems}
    assert kinds == {"empty.jsonl": "unreadable", "junk.jsonl": "invalid", "xdist.json": "note"}


@pytest.mark.parametrize("field, value, expected", [
    ("duration", "1.5", "expected a finite number, got string '1.5'"),
    ("world_size", 2.0, "expected an integer, got number 2.0"),
    ("world_size", True, "expected an integer, got boolean True"),
    ("known_issue", 7, "expected a string, got integer 7"),
    ("when", "later", "expected one of setup, call, teardown, got string 'later'"),
    ("extra", [1], "expected an object, got array [1]"),
    ("message", {"a": 1}, "expected a string, got object {'a': 1}"),
])
def test_a_record_field_of_a_wrong_type_is_named_and_emptied_and_the_record_kept(tmp_path, field, value, expected):
    path = run_file(tmp_path, "w", "cpu", [rec("w", "test_a", "cpu", "passed"), rec("w", "test_b", "cpu", "failed", "AssertionError: x")])
    lines = path.read_text().splitlines()
    record = json.loads(lines[2])
    record[field] = value
    lines[2] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    loaded = load_results([path])
    assert [(p.path, p.line, p.kind) for p in loaded.problems] == [(str(path), 3, "invalid")]
    message = loaded.problems[0].message
    assert message.startswith("test record 'suites/test_core.py::test_b[cpu-ws1]': field ") and f"field {field!r}" in message
    assert expected in message and message.endswith("the field is left empty")
    assert len(loaded.tests) == 2
    row = loaded.tests.set_index("nodeid").loc["suites/test_core.py::test_b[cpu-ws1]"]
    assert row["outcome"] == "failed"  # still a failure for the gate
    if field in ("world_size", "known_issue", "when", "message"):
        assert row[field] is None


@pytest.mark.parametrize("change, fragment", [
    ({"nodeid": 12}, "field 'nodeid': expected a non-empty string, got integer 12; ignored"),
    ({"nodeid": ""}, "field 'nodeid': expected a non-empty string"),
    ({"outcome": "exploded"}, "field 'outcome': expected one of passed, failed"),
    ({"outcome": None}, "test record without outcome; ignored"),
])
def test_a_record_without_a_usable_nodeid_or_outcome_is_left_out(tmp_path, change, fragment):
    path = run_file(tmp_path, "w", "cpu", [rec("w", "test_a", "cpu", "passed"), rec("w", "test_b", "cpu", "passed")])
    lines = path.read_text().splitlines()
    record = json.loads(lines[1])
    record.update(change)
    lines[1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    loaded = load_results([path])
    assert [(p.line, p.kind) for p in loaded.problems] == [(2, "invalid")] and fragment in loaded.problems[0].message
    assert list(loaded.tests["nodeid"]) == ["suites/test_core.py::test_b[cpu-ws1]"]


def test_a_header_field_of_a_wrong_type_is_emptied_and_the_run_loads(tmp_path):
    path = run_file(tmp_path, "h", "cpu", [rec("h", "test_a", "cpu", "passed")])
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    head.update(torch_version=2.8, backends="cpu", device_models={"cpu": "x86"})
    lines[0] = json.dumps(head)
    path.write_text("\n".join(lines) + "\n")
    loaded = load_results([path])
    fields = sorted(p.message.split("field ")[1].split(":")[0] for p in loaded.problems)
    assert fields == ["'backends'", "'device_models'", "'torch_version'"]
    assert {(p.line, p.kind) for p in loaded.problems} == {(1, "invalid")}
    assert len(loaded.tests) == 1 and loaded.tests.iloc[0]["torch_version"] == "unknown"


def test_non_utf8_bytes_and_lone_surrogates_in_a_results_file(tmp_path):
    path = run_file(tmp_path, "u", "cpu", [rec("u", "test_a", "cpu", "failed", "AssertionError: x")])
    lines = path.read_bytes().split(b"\n")
    record = json.loads(lines[1])
    record["message"] = "bad \ud800 text"  # json.dumps writes the escape "\ud800", which JSON allows
    lines[1] = json.dumps(record).encode().replace(b"AssertionError", b"Assertion\xffError")  # a byte UTF-8 cannot decode
    path.write_bytes(b"\n".join(lines))
    loaded = load_results([path])
    assert [(p.line, p.kind) for p in loaded.problems] == [(2, "invalid")] and "not valid UTF-8" in loaded.problems[0].message
    row = loaded.tests.iloc[0]
    assert row["message"] == "bad \ufffd text" and "Assertion\ufffdError" in row["traceback"]


def test_junit_attributes_of_a_wrong_type_are_named(tmp_path):
    path = tmp_path / "j.xml"
    path.write_text(JUNIT.replace('name="test_skip[cuda-ws4]" time="0.0"', 'name="test_skip[cuda-ws4]" time="soon"'))
    run, rows, problems = load_junit(path)
    assert len(rows) == 6
    assert [(p.kind, p.line) for p in problems] == [("invalid", JUNIT[:JUNIT.index('name="test_skip')].count("\n") + 1)]
    assert "attribute 'time': expected a number of seconds, got 'soon'" in problems[0].message


def test_a_failure_cut_short_in_junit_is_kept_and_the_file_unreadable(tmp_path):
    path = tmp_path / "cut.xml"
    cut = JUNIT.index("<failure") + 60
    path.write_text(JUNIT[:cut])
    run, rows, problems = load_junit(path)
    failed = [r for r in rows if r["outcome"] == "failed"]
    assert len(failed) == 1 and "cut short" in failed[0]["message"]
    assert [p.kind for p in problems] == ["unreadable"] and "is kept as failed" in problems[0].message
    assert run["interrupted"] is True


def test_benchmark_fields_of_a_wrong_type_are_named(tmp_path):
    good = bench_file(tmp_path, "bench", "cuda", {"test_step": [0.5, 0.51, 0.49]})
    doc = json.loads(good.read_text())
    doc["benchmarks"][0]["extra_info"]["world_size"] = "two"
    doc["benchmarks"][0]["group"] = ["a"]
    doc["machine_info"] = "a string"
    good.write_text(json.dumps(doc, indent=1))
    rows, problems = load_benchmark_json(good)
    assert len(rows) == 1 and rows[0]["world_size"] is None and rows[0]["group"] is None
    messages = sorted(p.message for p in problems)
    assert {p.kind for p in problems} == {"invalid"} and len(messages) == 3
    assert any("field 'extra_info.world_size': expected an integer, got string 'two'" in m for m in messages)
    assert any("field 'group': expected a string, got array" in m for m in messages)
    assert any("field 'machine_info': expected an object" in m for m in messages)


def test_a_loader_failure_on_one_file_is_a_problem_not_a_crash(tmp_path, monkeypatch):
    from accel_reports.load import loaders

    run_file(tmp_path, "good", "cpu", [rec("good", "test_a", "cpu", "passed")])
    (tmp_path / "odd.xml").write_text(JUNIT)

    def broken(path):
        raise AttributeError("unforeseen")

    monkeypatch.setattr(loaders, "load_junit", broken)
    loaded = load_results([tmp_path])
    assert len(loaded.tests) == 1
    assert [(Path(p.path).name, p.kind) for p in loaded.problems] == [("odd.xml", "invalid")]
    assert "AttributeError: unforeseen" in loaded.problems[0].message


def test_display_names_of_non_utf8_files(tmp_path):
    import os

    from accel_reports.load.loaders import display_path, display_text

    assert display_path(b"a\xffb.jsonl") == "a\ufffdb.jsonl"
    assert display_text("x\udcff") == "x\ufffd" and display_text("plain ✓") == "plain ✓" and display_text(None) is None
    path = run_file(tmp_path, "n", "cpu", [rec("n", "test_a", "cpu", "passed")])
    odd = os.path.join(os.fsencode(tmp_path), b"n\xff.jsonl")
    os.rename(path, odd)
    loaded = load_results([tmp_path])
    shown = str(tmp_path / "n\ufffd.jsonl")
    assert loaded.files == [shown] and set(loaded.tests["source"]) == {shown}
    assert [(p.path, p.kind) for p in loaded.problems] == [(shown, "note")]


def test_a_failure_on_a_cut_short_last_line_is_kept(tmp_path):
    path = run_file(tmp_path, "k", "cpu", [rec("k", "test_a", "cpu", "passed")], interrupted=True)
    line = json.dumps(rec("k", "test_b", "cpu", "failed", "AssertionError: " + "x" * 500).to_dict())
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line[: line.index('"outcome"') + 40])  # killed while writing the traceback
    loaded = load_results([path])
    assert [p.kind for p in loaded.problems] == ["unreadable"]
    assert "the failed test it records (suites/test_core.py::test_b[cpu-ws1]) is kept" in loaded.problems[0].message
    row = loaded.tests.set_index("test_id").loc["suites/test_core.py::test_b[ws1]"]
    assert row["outcome"] == "failed" and row["backend"] == "cpu" and "cut short" in row["message"]
