"""Fuzz tests of the report loaders and of `accel report`'s exit codes (hypothesis).

Each property writes one damaged input next to a valid run and checks that nothing escapes
``load_results``, that the valid run still loads in full, that every problem names its file (and,
for a field of a wrong type, its line and field), and that `accel report` exits exactly as
documented: 2 for an invalid input always, 2 for an unreadable one under ``--strict`` (a warning
and the other gates without it), never 1 from a traceback and never 0 with damage unreported.

The expected types are written out here on their own (not taken from the loaders), so a schema
check that goes missing fails these tests. Examples are bounded (CI runs them on 2 cores).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from accel.commands import report as report_command  # noqa: E402
from accel.commands.cli import main  # noqa: E402
from accel_harness.records import PROBLEM_KINDS, RecordWriter, RunHeader, SCHEMA  # noqa: E402
from accel_reports.load.loaders import load_results  # noqa: E402

FAST = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
#: properties that run the whole `accel report` (load, analyse, render) per example
SLOW = settings(max_examples=8, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

GOOD_RUN = "good-run"
GOOD_TESTS = 3

# ---------------------------------------------------------------------------- what each field must be
def _text(v):
    return isinstance(v, str)


def _integer(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _object(v):
    return isinstance(v, dict)


#: optional fields of a test record: a value of another type is reported and the field emptied
RECORD_FIELDS = {
    "run_id": _text, "test_id": _text, "backend": _text, "world_size": _integer, "duration": _number,
    "when": lambda v: v in ("setup", "call", "teardown"), "reason_code": _text, "message": _text,
    "signature": _text, "traceback": _text, "known_issue": _text, "extra": _object,
}
HEADER_FIELDS = {
    "run_id": _text, "start_time": _text, "accel_version": _text, "torch_version": _text, "torch_build": _text,
    "python": _text, "os": _text, "kernel": _text, "host": _text, "git_commit": _text,
    "backends": lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
    "device_models": lambda v: isinstance(v, dict) and all(isinstance(m, list) and all(isinstance(i, str) for i in m) for m in v.values()),
    "device_count": _object, "driver_versions": _object, "runtime_versions": _object, "comm_backends": _object,
    "extra": _object,
}
BENCH_FIELDS = {
    ("name",): _text, ("group",): _text,
    ("stats", "median"): _number, ("stats", "data"): lambda v: isinstance(v, list) and all(_number(i) for i in v),
    ("stats", "rounds"): _integer,
    ("extra_info", "backend"): _text, ("extra_info", "metric"): _text, ("extra_info", "unit"): _text,
    ("extra_info", "world_size"): _integer, ("extra_info", "throughput"): _number, ("extra_info", "work_size"): _number,
    ("extra_info", "torch_version"): _text, ("extra_info", "samples"): lambda v: isinstance(v, list) and all(_number(i) for i in v),
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-10**20, max_value=10**20)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


# ---------------------------------------------------------------------------- inputs
def record(run: str, name: str, outcome: str = "passed", changes: dict | None = None, **fields) -> dict:
    """A valid test line of run ``run``, with ``fields`` and then ``changes`` (any field, fuzzed) applied."""
    rec = {"type": "test", "run_id": run, "nodeid": f"suites/test_x.py::{name}[cpu-ws1]", "test_id": f"suites/test_x.py::{name}[ws1]",
           "backend": "cpu", "world_size": 1, "outcome": outcome, "duration": 0.25, "when": "call", "reason_code": None,
           "message": None, "signature": None, "traceback": None, "known_issue": None, "extra": {}}
    rec.update(fields)
    rec.update(changes or {})
    return rec


def header(run: str, changes: dict | None = None) -> dict:
    head = RunHeader(run_id=run, start_time="2025-06-01T00:00:00.000+00:00", accel_version="0.2.0", torch_version="2.8.0",
                     host="lab", backends=["cpu"], device_models={"cpu": ["x86"]}).to_dict()
    head.update(changes or {})
    return head


def jsonl_lines(run_id: str, records: list[dict], head: dict | None = None) -> list[str]:
    lines = [json.dumps(head or header(run_id))] + [json.dumps(r) for r in records]
    lines.append(json.dumps({"type": "run_end", "run_id": run_id, "end_time": "2025-06-01T00:10:00.000+00:00", "counts": {}}))
    return lines


def write_good(folder: Path) -> None:
    """The valid run every property puts next to its damaged input."""
    writer = RecordWriter(folder / "good.jsonl", RunHeader(run_id=GOOD_RUN, start_time="2025-06-01T00:00:00.000+00:00",
                                                            backends=["cpu"], torch_version="2.8.0"))
    for i in range(GOOD_TESTS):
        writer.write(record(GOOD_RUN, f"test_good_{i}"))
    writer.close()


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="0" tests="3" time="1.0" timestamp="2025-06-01T00:00:00" hostname="lab">
<testcase classname="suites.test_j" name="test_ok[cpu-ws1]" time="{time}"><properties><property name="accel_world_size" value="{world}" /></properties></testcase>
<testcase classname="suites.test_j" name="test_bad[cpu-ws1]" time="0.2"><failure message="AssertionError: 3 != 4">def test_bad():
&gt;   assert 3 == 4
E   AssertionError: 3 != 4</failure></testcase>
<testcase classname="suites.test_j" name="test_after[cpu-ws1]" time="0.1" />
</testsuite></testsuites>
"""


def bench_doc(**changes) -> dict:
    bench = {"name": "test_step[cpu]", "fullname": "suites/bench.py::test_step[cpu]", "group": "train",
             "stats": {"median": 0.5, "data": [0.5, 0.51, 0.49], "rounds": 3},
             "extra_info": {"backend": "cpu", "metric": "time", "unit": "s", "world_size": 1, "torch_version": "2.8.0"}}
    for path, value in changes.items():
        keys = path.split(".")
        target = bench
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return {"machine_info": {"node": "lab"}, "datetime": "2025-06-01T00:00:00", "benchmarks": [bench]}


# ---------------------------------------------------------------------------- checks
def report(folder: Path, *options: str) -> tuple[int, str, str]:
    """`accel report` in-process: exit code, stdout, stderr (CI unset: strictness only as asked)."""
    out, err = io.StringIO(), io.StringIO()
    old = os.environ.pop("CI", None)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["report", os.fsdecode(folder), "-o", os.fsdecode(folder / "out"), "--format", "md", *options])
    finally:
        if old is not None:
            os.environ["CI"] = old
    return code, out.getvalue(), err.getvalue()


def loads_the_good_run(folder: Path):
    loaded = load_results([folder])
    good = loaded.tests[loaded.tests["run_id"] == GOOD_RUN]
    assert len(good) == GOOD_TESTS and set(good["outcome"]) == {"passed"}
    assert all(p.kind in PROBLEM_KINDS for p in loaded.problems)
    for problem in loaded.problems:  # every problem can be printed and written into a UTF-8 report
        f"{problem.path}:{problem.line}: {problem.message}".encode("utf-8")
    return loaded


def expected_exit(loaded, strict: bool, failures: int = 0) -> int:
    kinds = {p.kind for p in loaded.problems}
    if "invalid" in kinds or (strict and "unreadable" in kinds):
        return report_command.EXIT_INPUT
    return report_command.EXIT_NEW_FAILURES if failures else report_command.EXIT_OK


@contextlib.contextmanager
def folder_with_good_run():
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "results"
        folder.mkdir()
        write_good(folder)
        yield folder


# ---------------------------------------------------------------------------- harness JSON Lines
@FAST
@given(field=st.sampled_from(sorted(RECORD_FIELDS)), value=json_values)
def test_jsonl_record_field_of_a_wrong_type(field, value):
    wrong = not RECORD_FIELDS[field](value) and value is not None
    with folder_with_good_run() as folder:
        records = [record("fz", "test_before"), record("fz", "test_fuzzed", changes={field: value}), record("fz", "test_after")]
        (folder / "fz.jsonl").write_text("\n".join(jsonl_lines("fz", records)) + "\n", encoding="utf-8")
        loaded = loads_the_good_run(folder)
        fuzzed = loaded.tests[loaded.tests["run_id"] == "fz"]
        assert sorted(fuzzed["nodeid"].str.extract(r"::(\w+)\[")[0]) == ["test_after", "test_before", "test_fuzzed"]
        mine = [p for p in loaded.problems if p.path == str(folder / "fz.jsonl") and p.kind == "invalid"]
        if wrong:
            assert len(mine) == 1 and mine[0].line == 3 and f"field {field!r}" in mine[0].message
            row = fuzzed[fuzzed["nodeid"].str.contains("test_fuzzed")].iloc[0]
            if field in ("world_size", "known_issue", "message", "signature", "traceback", "reason_code", "when"):
                assert row[field] is None  # emptied, not the wrong value
        else:
            assert mine == []
        assert expected_exit(loaded, strict=False) == (2 if wrong else 0)


@FAST
@given(field=st.sampled_from(["nodeid", "outcome"]), value=json_values)
def test_jsonl_required_field_wrong_or_missing_skips_the_record(field, value):
    valid = (isinstance(value, str) and value != "") if field == "nodeid" else value in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
    with folder_with_good_run() as folder:
        fuzzed = record("fz", "test_fuzzed", changes={field: value})
        if value is None:
            del fuzzed[field]
        (folder / "fz.jsonl").write_text("\n".join(jsonl_lines("fz", [fuzzed, record("fz", "test_after")])) + "\n", encoding="utf-8")
        loaded = loads_the_good_run(folder)
        rows = loaded.tests[loaded.tests["run_id"] == "fz"]
        assert len(rows) == (2 if valid else 1)
        mine = [p for p in loaded.problems if p.kind == "invalid"]
        if not valid:
            assert len(mine) == 1 and mine[0].line == 2 and field in mine[0].message
        failures = int(rows["outcome"].isin(["failed", "error"]).sum())
        assert expected_exit(loaded, strict=False, failures=failures) == (2 if not valid else 1 if failures else 0)


@FAST
@given(field=st.sampled_from(sorted(HEADER_FIELDS)), value=json_values)
def test_jsonl_header_field_of_a_wrong_type(field, value):
    wrong = value is not None and not HEADER_FIELDS[field](value)
    with folder_with_good_run() as folder:
        lines = jsonl_lines("fz", [record("fz", "test_a")], head=header("fz", {field: value}))
        (folder / "fz.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        loaded = loads_the_good_run(folder)
        assert len(loaded.tests[loaded.tests["source"] == str(folder / "fz.jsonl")]) == 1  # the record still loads
        mine = [p for p in loaded.problems if p.kind == "invalid"]
        assert (len(mine) == 1 and mine[0].line == 1 and f"field {field!r}" in mine[0].message) if wrong else mine == []


@FAST
@given(cut=st.integers(min_value=1), data=st.data())
def test_jsonl_cut_at_any_offset(cut, data):
    records = [record("fz", f"test_{i}", outcome="failed" if i == 1 else "passed", message="AssertionError") for i in range(3)]
    text = ("\n".join(jsonl_lines("fz", records)) + "\n").encode("utf-8")
    cut = cut % len(text)
    with folder_with_good_run() as folder:
        (folder / "fz.jsonl").write_bytes(text[:cut])
        loaded = loads_the_good_run(folder)
        last = text[:cut].split(b"\n")[-1]
        mid_line = bool(last.strip())
        if mid_line:
            with contextlib.suppress(ValueError):
                json.loads(last)
                mid_line = False  # cut right after a complete line's closing brace
        mine = [p for p in loaded.problems if p.path == str(folder / "fz.jsonl")]
        kinds = {p.kind for p in mine}
        assert "invalid" not in kinds  # a cut is not garbage: what was written before it is whole
        if mid_line:  # the cut line is named: under --strict, exit 2
            lines = text[:cut].count(b"\n") + 1
            assert any(p.kind == "unreadable" and p.line == lines and "incomplete last line" in p.message for p in mine)
        failing = int((loaded.tests["outcome"] == "failed").sum())
        # a failure survives the cut once its outcome was written (a cut-short last line keeps it)
        assert failing == (1 if cut >= text.index(b'"outcome": "failed"') + len(b'"outcome": "failed"') else 0)
        assert expected_exit(loaded, strict=True, failures=failing) == (
            report_command.EXIT_INPUT if "unreadable" in kinds else report_command.EXIT_NEW_FAILURES if failing else report_command.EXIT_OK)


@FAST
@given(blob=st.binary(min_size=1, max_size=400), suffix=st.sampled_from([".jsonl", ".xml", ".json"]))
def test_random_bytes_never_escape_and_are_never_silent(blob, suffix):
    with folder_with_good_run() as folder:
        (folder / f"garbage{suffix}").write_bytes(blob)
        loaded = loads_the_good_run(folder)
        mine = [p for p in loaded.problems if "garbage" in p.path]
        loaded_from_it = (loaded.tests["source"].str.contains("garbage").sum()
                          + (loaded.benchmarks["source"].str.contains("garbage").sum() if not loaded.benchmarks.empty else 0))
        assert mine or loaded_from_it  # a file neither loaded nor reported would be silent damage


#: attribute text XML can carry (no control characters, no surrogates, no U+FFFE/U+FFFF)
xml_text = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\ufffe\uffff"), max_size=12)
numberish = st.one_of(xml_text, st.floats().map(str), st.integers().map(str), st.just(" 2 "), st.just("1e400"))


@FAST
@given(time=numberish, world=numberish)
def test_junit_attribute_of_a_wrong_type(time, world):
    from xml.sax.saxutils import escape

    def ok_time(t):
        try:
            return not t or math.isfinite(float(t))
        except ValueError:
            return False

    def ok_world(w):
        try:
            int(w)
            return True
        except ValueError:
            return w in ("", "None")

    with folder_with_good_run() as folder:
        body = JUNIT.format(time=escape(time, {'"': "&quot;"}), world=escape(world, {'"': "&quot;"}))
        (folder / "j.xml").write_text(body, encoding="utf-8")
        loaded = loads_the_good_run(folder)
        junit = loaded.tests[loaded.tests["format"] == "junit"]
        mine = [p for p in loaded.problems if p.path.endswith("j.xml")]
        assert len(junit) == 3
        wrong = {"time"} if not ok_time(time) else set()
        wrong |= {"accel_world_size"} if not ok_world(world) else set()
        assert {f for f in ("time", "accel_world_size") if any(f"'{f}'" in p.message for p in mine)} == wrong
        assert all(p.kind == "invalid" and p.line == 3 for p in mine)
        assert expected_exit(loaded, strict=False, failures=1) == (2 if wrong else 1)


@FAST
@given(cut=st.integers(min_value=0))
def test_junit_cut_at_any_offset_never_drops_a_failure_quietly(cut):
    text = JUNIT.format(time="0.1", world="1").encode("utf-8")
    end = text.rindex(b"</testsuites>") + len(b"</testsuites>")
    cut = cut % end
    with folder_with_good_run() as folder:
        (folder / "j.xml").write_bytes(text[:cut])
        loaded = loads_the_good_run(folder)
        failing = int((loaded.tests["outcome"] == "failed").sum())
        kinds = {p.kind for p in loaded.problems}
        assert "unreadable" in kinds  # the file is always listed: under --strict, exit 2
        assert expected_exit(loaded, strict=True, failures=failing) == report_command.EXIT_INPUT
        failure_started = text.index(b"<failure") + len(b"<failure message=\"AssertionError: 3 != 4\">")
        if cut >= failure_started:  # the failure had begun: it is kept even without --strict
            assert failing == 1


@FAST
@given(path=st.sampled_from(sorted(".".join(k) for k in BENCH_FIELDS)), value=json_values)
def test_benchmark_field_of_a_wrong_type(path, value):
    check = BENCH_FIELDS[tuple(path.split("."))]
    wrong = value is not None and not check(value)
    with folder_with_good_run() as folder:
        (folder / "b.json").write_text(json.dumps(bench_doc(**{path: value})), encoding="utf-8")
        loaded = loads_the_good_run(folder)
        mine = [p for p in loaded.problems if p.path.endswith("b.json")]
        named = [p for p in mine if f"field {path!r}" in p.message]
        if wrong:
            assert named and all(p.kind == "invalid" and p.line == 1 for p in named)
            assert expected_exit(loaded, strict=False) == 2
        else:
            assert named == []


@FAST
@given(cut=st.integers(min_value=1))
def test_benchmark_json_cut_is_unreadable(cut):
    text = json.dumps(bench_doc(), indent=1).encode("utf-8")
    cut = cut % len(text.rstrip())
    with folder_with_good_run() as folder:
        (folder / "b.json").write_bytes(text[:cut])
        loaded = loads_the_good_run(folder)
        mine = [p for p in loaded.problems if p.path.endswith("b.json")]
        assert mine and loaded.benchmarks.empty
        assert all(p.kind in ("unreadable", "note") for p in mine)


# ---------------------------------------------------------------------------- file names
odd_names = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1, max_size=40),
    st.binary(min_size=1, max_size=30).filter(lambda b: b"/" not in b and b"\x00" not in b),
    st.just("x" * 200),
    st.just("with spaces and ünïcödé ✓"),
)


@SLOW
@given(name=odd_names)
def test_odd_file_names_load_and_report(name):
    raw = (name if isinstance(name, bytes) else name.encode("utf-8")) + b".jsonl"
    if raw in (b".jsonl",) or raw.startswith(b".."):
        raw = b"n" + raw
    with folder_with_good_run() as folder:
        target = os.path.join(os.fsencode(folder), raw)
        try:
            with open(target, "wb") as fh:
                fh.write(("\n".join(jsonl_lines("odd", [record("odd", "test_odd")])) + "\n").encode("utf-8"))
        except OSError:  # a name too long for the file system
            return
        loaded = loads_the_good_run(folder)
        assert len(loaded.tests[loaded.tests["run_id"] == "odd"]) == 1
        for value in loaded.tests["source"]:
            value.encode("utf-8")
        code, out, err = report(folder)
        assert code == report_command.EXIT_OK, err
        md = (folder / "out" / "report.md").read_bytes()
        assert md and md.decode("utf-8")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            assert "path is not valid UTF-8" in err


# ---------------------------------------------------------------------------- the exit code, end to end
@SLOW
@given(field=st.sampled_from(sorted(RECORD_FIELDS)), value=json_values, strict=st.booleans())
def test_report_exit_code_for_a_wrong_type_is_2_always(field, value, strict):
    with folder_with_good_run() as folder:
        records = [record("fz", "test_fuzzed", "failed", {field: value}, message="AssertionError: x")]
        (folder / "fz.jsonl").write_text("\n".join(jsonl_lines("fz", records)) + "\n", encoding="utf-8")
        code, out, err = report(folder, "--strict" if strict else "--no-strict")
        wrong = value is not None and not RECORD_FIELDS[field](value)
        assert code == (report_command.EXIT_INPUT if wrong else report_command.EXIT_NEW_FAILURES), err
        if wrong:
            assert f"{folder / 'fz.jsonl'}:2: " in err and f"field {field!r}" in err
        assert "Traceback" not in err


@SLOW
@given(cut=st.integers(min_value=0), strict=st.booleans())
def test_report_exit_code_for_a_cut_junit_file(cut, strict):
    text = JUNIT.format(time="0.1", world="1").encode("utf-8")
    cut = cut % (text.rindex(b"</testsuites>"))
    with folder_with_good_run() as folder:
        (folder / "j.xml").write_bytes(text[:cut])
        code, out, err = report(folder, "--strict" if strict else "--no-strict")
        loaded = load_results([folder])
        failing = int((loaded.tests["outcome"] == "failed").sum())
        if strict:
            assert code == report_command.EXIT_INPUT, err
        else:
            assert code == (report_command.EXIT_NEW_FAILURES if failing else report_command.EXIT_OK), err
            assert "unreadable input" in err and "j.xml" in err
