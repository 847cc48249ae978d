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


# ---------------------------------------------------------------- freezing again after a test's imports
NEW_MODULES = 30  # more than REFREEZE_AFTER_MODULES

REFREEZE_TEST = textwrap.dedent(
    """
    import gc
    import importlib

    import pytest

    {marks}
    def test_a_imports_modules(device):
        for i in range({count}):
            importlib.import_module(f"fresh_pkg.mod{{i}}")

    {marks}
    def test_b_finds_them_frozen(device):
        import fresh_pkg.mod0

        tracked = {{id(o) for o in gc.get_objects()}}  # a frozen object is in no generation
        assert id(fresh_pkg.mod0.helper) not in tracked, "the first test's imports were not frozen"
    """
)


def _fresh_package(pytester, count):
    pkg = pytester.mkpydir("fresh_pkg")
    for i in range(count):
        (pkg / f"mod{i}.py").write_text("def helper():\n    return 1\n")


def test_a_session_freezes_what_a_test_imported_before_the_next_test(pytester):
    _fresh_package(pytester, NEW_MODULES)
    pytester.makepyfile(test_refreeze=REFREEZE_TEST.format(marks="", count=NEW_MODULES))
    _run(pytester, "-m", "cpu", "-p", "no:randomly").assert_outcomes(passed=2)


def test_a_rank_freezes_what_a_test_imported_before_the_next_test(pytester):
    _fresh_package(pytester, NEW_MODULES)
    pytester.makepyfile(test_refreeze=REFREEZE_TEST.format(marks="@pytest.mark.world_size(2)", count=NEW_MODULES))
    _run(pytester, "-m", "cpu", "-p", "no:randomly").assert_outcomes(passed=2)


def test_a_few_imports_or_a_process_that_never_froze_are_left_alone():
    code = textwrap.dedent(
        """
        import gc, importlib, sys
        from accel_harness import session_freeze as sf
        assert not sf.freeze_new_imports(min_new_modules=1) and gc.get_freeze_count() == 0, "never froze: left alone"
        frozen = sf.freeze_collected_session()
        import csv, json  # a few modules only
        assert not sf.freeze_new_imports(min_new_modules=100) and gc.get_freeze_count() == frozen
        importlib.import_module("email.message")  # email brings more than a few
        assert sf.freeze_new_imports(min_new_modules=5) and gc.get_freeze_count() > frozen
        print("ok")
        """
    )
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr
