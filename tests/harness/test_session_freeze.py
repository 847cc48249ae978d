"""A harness session freezes what it collected out of garbage collection; a session that does not use the
harness is left alone (accel_harness.session_freeze, the plugin's collection hook)."""

import os
import textwrap

pytest_plugins = ["pytester"]

HARNESS_TEST = textwrap.dedent(
    """
    import gc

    def test_collected_objects_are_frozen(device):
        # torch alone makes more than a hundred thousand objects, all imported before the tests ran
        assert gc.get_freeze_count() > 100_000, gc.get_freeze_count()
    """
)

PLAIN_TEST = textwrap.dedent(
    """
    import gc

    def test_nothing_is_frozen():
        assert gc.get_freeze_count() == 0
    """
)


def _run(pytester, *args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=600)


def test_a_harness_session_runs_its_tests_with_the_collected_objects_frozen(pytester):
    pytester.makepyfile(test_frozen=HARNESS_TEST)
    result = _run(pytester, "-m", "cpu")
    result.assert_outcomes(passed=1)


def test_a_session_without_harness_tests_freezes_nothing(pytester):
    pytester.makepyfile(test_plain=PLAIN_TEST)
    result = _run(pytester)
    result.assert_outcomes(passed=1)
