"""accel_harness.progress: reading a child pytest's output into tests done / total / failures."""

import sys

from accel_harness.progress import ProgressDisplay, PytestProgress, run_streamed


def _fed(*lines):
    progress = PytestProgress("suites")
    for line in lines:
        progress.feed(line)
    return progress


def test_verbose_lines_count_tests_failures_and_the_current_test():
    p = _fed("collected 4 items", "suites/a.py::t1[cpu] PASSED      [ 25%]", "suites/a.py::t2[cpu] FAILED   [ 50%]",
             "suites/a.py::t3[cpu] SKIPPED (needs two devices) [ 75%]")
    assert (p.total, p.done, p.failed) == (4, 3, 1)
    assert p.failures == ["suites/a.py::t2[cpu]"] and p.current == "suites/a.py::t3[cpu]"
    assert "3 of 4 tests done, 1 failed/errors" in p.line()


def test_xdist_lines_and_the_summary_name_each_failure_once():
    p = _fed("2 workers [3 items]", "[gw0] [ 33%] PASSED suites/a.py::t1", "[gw1] [ 66%] ERROR suites/a.py::t2",
             "[gw0] [100%] FAILED suites/a.py::t3", "FAILED suites/a.py::t3 - AssertionError: no",
             "ERROR suites/a.py::t2 - RuntimeError: setup")
    assert (p.total, p.done, p.failed) == (3, 3, 2)
    assert p.failures == ["suites/a.py::t2", "suites/a.py::t3"]


def test_teardown_error_after_a_pass_counts_the_test_once():
    p = _fed("collected 1 item", "a.py::t PASSED [100%]", "a.py::t ERROR [100%]")
    assert (p.done, p.failed, p.failures) == (1, 1, ["a.py::t"])


def test_deselected_tests_are_not_in_the_total():
    assert _fed("collecting ... collected 10 items / 8 deselected / 2 selected").total == 2


def test_quiet_dot_lines_still_count():
    p = _fed("..F.s [ 50%]", "suites/x.py ..E [100%]", "E         ", "E   assert 1 == 2", "=== 2 failed, 6 passed in 1.2s ===")
    assert (p.done, p.failed) == (8, 2)


def test_plain_display_prints_periodic_lines(capsys):
    import io

    stream = io.StringIO()
    with ProgressDisplay(PytestProgress("suites"), live=False, every=0.0, stream=stream) as display:
        display.feed("collected 2 items")
        display.feed("a.py::t PASSED [ 50%]")
    text = stream.getvalue()
    assert "accel qualify: suites: 1 of 2 tests done, 0 failed/errors" in text and "\x1b[" not in text


def test_run_streamed_keeps_the_output_and_ends_a_child_past_its_time(tmp_path):
    seen = []
    code = run_streamed([sys.executable, "-c", "print('one'); print('two')"], tmp_path / "log", on_line=seen.append)
    assert code == 0 and seen == ["one", "two"] and (tmp_path / "log").read_text() == "one\ntwo\n"
    code = run_streamed([sys.executable, "-c", "import time; print('start', flush=True); time.sleep(60)"],
                        tmp_path / "log2", timeout=2)
    assert code is None  # ended by the limit: the child would have exited 0 after its sleep
    assert "# stopped: time limit" in (tmp_path / "log2").read_text()
