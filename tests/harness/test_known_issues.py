"""accel_harness.known_issues: loading the YAML file with clear errors, and matching failures and passes."""

from __future__ import annotations

import textwrap

import pytest

from accel_harness.known_issues import KnownIssues, KnownIssuesError, load_known_issues
from accel_harness.records import device_neutral_id

EXAMPLE = """\
issues:
  - id: pytorch-135550
    url: https://github.com/pytorch/pytorch/issues/135550
    title: all_gather hangs with xccl
    backends: [xpu]
    torch: ">=2.5,<2.8"
    tests: ["suites/test_collectives.py::test_all_gather*"]
    xfail: true
  - id: oom-any
    title: large allocation fails
    error: "(CUDA|XPU) out of memory"
  - id: mps-fp16
    backends: mps
    tests:
      - "*::test_fp16_*"
    error: "autocast"
  - id: literal-brackets
    tests: ["suites/test_a.py::test_x[ws2]"]
"""


def write(tmp_path, text, name="known_issues.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture
def issues(tmp_path):
    return load_known_issues(write(tmp_path, EXAMPLE))


# ---------------------------------------------------------------------------- loading
def test_loads_every_field(issues):
    assert issues.ids == ["pytorch-135550", "oom-any", "mps-fp16", "literal-brackets"]
    first = issues.get("pytorch-135550")
    assert first.url == "https://github.com/pytorch/pytorch/issues/135550"
    assert first.title == "all_gather hangs with xccl"
    assert first.backends == ("xpu",)
    assert first.torch == ">=2.5,<2.8"
    assert first.tests == ("suites/test_collectives.py::test_all_gather*",)
    assert first.xfail is True and first.error is None
    assert first.source.endswith("known_issues.yaml, entry #1")
    oom = issues.get("oom-any")
    assert oom.backends is None and oom.torch is None and oom.tests == () and oom.xfail is False
    assert issues.get("mps-fp16").backends == ("mps",)  # a single string is one backend
    assert len(issues) == 4 and "oom-any" in issues and issues.get("nope") is None


def test_a_plain_list_and_an_empty_file(tmp_path):
    listed = load_known_issues(write(tmp_path, "- id: a\n  error: boom\n- id: 17\n  tests: ['t.py::x']\n"))
    assert listed.ids == ["a", "17"]
    assert len(load_known_issues(write(tmp_path, "", "empty.yaml"))) == 0
    assert len(load_known_issues(write(tmp_path, "issues:\n", "none.yaml"))) == 0


def test_several_files_merge_and_ids_stay_unique(tmp_path):
    one = write(tmp_path, "- id: a\n  error: x\n", "one.yaml")
    two = write(tmp_path, "- id: b\n  error: y\n", "two.yaml")
    assert load_known_issues(one, two).ids == ["a", "b"]
    with pytest.raises(KnownIssuesError) as info:
        load_known_issues(one, one)
    assert "duplicate known issue id 'a'" in str(info.value)
    assert "one.yaml, entry #1" in str(info.value)


@pytest.mark.parametrize("text, fragments", [
    ("- id: a\n  backend: [xpu]\n  error: x\n", ["entry #1", "(id 'a')", "field 'backend'", "did you mean 'backends'?"]),
    ("- id: a\n  test: ['t.py::x']\n", ["field 'test'", "did you mean 'tests'?"]),
    ("- id: a\n  colour: red\n  error: x\n", ["field 'colour'", "known fields: id, url"]),
    ("- id: a\n  error: '(unclosed'\n", ["field 'error'", "bad regular expression '(unclosed'", "missing ), unterminated subpattern"]),
    ("- id: a\n  torch: '>=banana'\n  error: x\n", ["field 'torch'", "not a version specifier: '>=banana'"]),
    ("- id: a\n  torch: 2.5\n  error: x\n", ["field 'torch'", "quoted in YAML", "2.5"]),
    ("- title: no id\n  error: x\n", ["entry #1", "field 'id'", "needs an id"]),
    ("- id: a\n  title: only a title\n", ["(id 'a')", "needs tests (patterns), ops (operator patterns), error (a regex)"]),
    ("- id: a\n  error: x\n  xfail: sometimes\n", ["field 'xfail'", "true or false", "'sometimes'"]),
    ("- id: a\n  error: x\n  backends: []\n", ["field 'backends'", "non-empty list"]),
    ("- id: a\n  tests: [3]\n", ["field 'tests'", "non-empty strings, got 3"]),
    ("- id: a\n  error: x\n  url: [1]\n", ["field 'url'", "expected a string"]),
    ("- id: ok\n  error: x\n- just a string\n", ["entry #2", "expected a mapping"]),
    ("isues:\n  - id: a\n    error: x\n", ["unknown top-level key 'isues'", "did you mean 'issues'?"]),
    ("issues: 3\n", ["expected a list of known-issue entries"]),
    ("- id: a\n  error: x\n  - broken\n", ["not valid YAML", "line 3"]),
])
def test_loading_errors_name_file_entry_and_field(tmp_path, text, fragments):
    path = write(tmp_path, text)
    with pytest.raises(KnownIssuesError) as info:
        load_known_issues(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert isinstance(info.value, ValueError)


def test_missing_file(tmp_path):
    with pytest.raises(KnownIssuesError, match="not found"):
        load_known_issues(tmp_path / "absent.yaml")


def test_from_data_without_a_file():
    issues = KnownIssues.from_data([{"id": "x", "error": "boom"}], source="inline")
    assert issues.get("x").source == "inline, entry #1"
    with pytest.raises(KnownIssuesError, match="inline, entry #1"):
        KnownIssues.from_data([{"id": "x"}], source="inline")


# ---------------------------------------------------------------------------- matching failures
GATHER = "suites/test_collectives.py::test_all_gather[xpu-ws2]"


def test_backend_filter(issues):
    test_id = device_neutral_id(GATHER, "xpu")
    assert issues.match_failure(test_id, GATHER, "xpu", "2.6.0", "RuntimeError: hang").id == "pytorch-135550"
    cuda_node = GATHER.replace("xpu", "cuda")
    assert issues.match_failure(test_id, cuda_node, "cuda", "2.6.0", "RuntimeError: hang") is None
    assert issues.match_failure(test_id, GATHER, None, "2.6.0", "RuntimeError: hang") is None


def test_torch_range(issues):
    test_id = device_neutral_id(GATHER, "xpu")
    assert issues.match_failure(test_id, GATHER, "xpu", "2.5.0", "x") is not None
    assert issues.match_failure(test_id, GATHER, "xpu", "2.7.1+xpu", "x") is not None
    assert issues.match_failure(test_id, GATHER, "xpu", "2.8.0", "x") is None
    assert issues.match_failure(test_id, GATHER, "xpu", "2.4.1", "x") is None
    assert issues.match_failure(test_id, GATHER, "xpu", None, "x") is not None  # unknown version: no filter


def test_error_regex_is_searched_in_the_text(issues):
    text = "E   torch.OutOfMemoryError: XPU out of memory. Tried to allocate 2.00 GiB"
    assert issues.match_failure("t.py::test_big", "t.py::test_big[xpu]", "xpu", "2.6.0", text).id == "oom-any"
    assert issues.match_failure("t.py::test_big", "t.py::test_big[cpu]", "cpu", "2.6.0", "MemoryError") is None
    assert issues.match_failure("t.py::test_big", "t.py::test_big[cpu]", "cpu", "2.6.0", None) is None


def test_tests_and_error_must_both_match(issues):
    node = "suites/test_amp.py::test_fp16_linear[mps-ws1]"
    test_id = device_neutral_id(node, "mps")
    assert issues.match_failure(test_id, node, "mps", "2.7.0", "RuntimeError: autocast dtype mismatch").id == "mps-fp16"
    assert issues.match_failure(test_id, node, "mps", "2.7.0", "RuntimeError: something else") is None
    other = "suites/test_amp.py::test_bf16_linear[mps-ws1]"
    assert issues.match_failure(device_neutral_id(other, "mps"), other, "mps", "2.7.0", "autocast") is None


def test_brackets_in_patterns_are_literal(issues):
    assert issues.match_failure("suites/test_a.py::test_x[ws2]", "suites/test_a.py::test_x[cpu-ws2]", "cpu", "2.6", "e").id \
        == "literal-brackets"
    # as a character class, [ws2] would have matched test_xw; literally it does not
    assert issues.match_failure("suites/test_a.py::test_xw", "suites/test_a.py::test_xw", "cpu", "2.6", "e") is None
    assert issues.match_failure("suites/test_a.py::test_x[ws4]", "suites/test_a.py::test_x[cpu-ws4]", "cpu", "2.6", "e") is None


def test_pattern_without_brackets_matches_every_parametrization():
    issues = KnownIssues.from_data([{"id": "p", "tests": ["suites/test_a.py::test_x"]}])
    assert issues.match_failure("suites/test_a.py::test_x[ws2]", "suites/test_a.py::test_x[cuda-ws2]", "cuda", "2.6", "e").id == "p"
    assert issues.match_failure("suites/test_a.py::test_x2[ws2]", "suites/test_a.py::test_x2[cuda-ws2]", "cuda", "2.6", "e") is None


def test_pattern_can_name_the_backend_through_the_nodeid():
    issues = KnownIssues.from_data([{"id": "n", "tests": ["*test_x[cuda-*"]}])
    assert issues.match_failure("t.py::test_x[ws1]", "t.py::test_x[cuda-ws1]", "cuda", "2.6", "e").id == "n"
    assert issues.match_failure("t.py::test_x[ws1]", "t.py::test_x[xpu-ws1]", "xpu", "2.6", "e") is None


def test_question_mark_is_one_character():
    issues = KnownIssues.from_data([{"id": "q", "tests": ["t.py::test_?"]}])
    assert issues.match_failure("t.py::test_a", "t.py::test_a", "cpu", None, "") is not None
    assert issues.match_failure("t.py::test_ab", "t.py::test_ab", "cpu", None, "") is None


def test_first_matching_issue_wins():
    issues = KnownIssues.from_data([
        {"id": "specific", "backends": ["cuda"], "error": "out of memory"},
        {"id": "general", "error": "memory"},
    ])
    assert issues.match_failure("t", "t", "cuda", None, "CUDA out of memory").id == "specific"
    assert issues.match_failure("t", "t", "xpu", None, "XPU out of memory").id == "general"


# ---------------------------------------------------------------------------- tracked passes
def test_match_test_reports_tracked_passes(issues):
    test_id = device_neutral_id(GATHER, "xpu")
    tracked = issues.match_test(test_id, GATHER, "xpu", "2.6.0")
    assert [i.id for i in tracked] == ["pytorch-135550"]
    assert issues.match_test(test_id, GATHER, "xpu", "2.9.0") == []  # outside the torch range
    assert issues.match_test(test_id, GATHER.replace("xpu", "cuda"), "cuda", "2.6.0") == []
    # an issue matched by error text alone cannot name a passing test
    assert all(i.id != "oom-any" for i in issues.match_test("t.py::test_big", "t.py::test_big[xpu]", "xpu", "2.6.0"))
    node = "suites/test_amp.py::test_fp16_linear[mps-ws1]"
    assert [i.id for i in issues.match_test(device_neutral_id(node, "mps"), node, "mps", "2.7.0")] == ["mps-fp16"]


def test_as_dict_round_trips_through_from_data(issues):
    again = KnownIssues.from_data([i.as_dict() for i in issues])
    assert [i.as_dict() for i in again] == [i.as_dict() for i in issues]


def test_an_operator_entry_covers_sweep_rows_by_op_and_dtype_and_never_a_test():
    known = KnownIssues.from_data([{"id": "emu-fft", "ops": ["fft.*"], "dtypes": ["float32"], "backends": ["emu"],
                                    "reason": "known-limitation"}])
    assert known.match_op("fft.ifft", "float32", "emu", "2.13.0", "boom").id == "emu-fft"
    assert known.match_op("fft.ifft", "bfloat16", "emu", "2.13.0", "boom") is None
    assert known.match_op("fft.ifft", "float32", "cpu", "2.13.0", "boom") is None
    assert known.match_op("linalg.svd", "float32", "emu", "2.13.0", "boom") is None
    assert known.match_failure("suites/test_x.py::test_y", None, "emu", "2.13.0", "boom") is None


def test_dtypes_without_ops_is_refused():
    with pytest.raises(KnownIssuesError, match="dtypes narrows ops"):
        KnownIssues.from_data([{"id": "a", "error": "x", "dtypes": ["float32"]}])
