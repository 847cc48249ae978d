"""The harness plugin as a good citizen: requirement marks on plain tests, and an unrelated project
in the same environment sees no option clash, keeps its own markers and does not pay for torch."""

import os
import sys
import textwrap

import pytest

import _inner_session as inner
from _harness_counts import other_backends

pytest_plugins = ["pytester"]


def _run(pytester, *args, timeout=600):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", *args, timeout=timeout)


PLAIN_MARKED = textwrap.dedent(
    """
    import pytest
    from accel_harness.markers import require_cuda, require_multi_gpu

    @pytest.mark.require_non_cpu
    def test_not_on_cpu():
        pass

    @pytest.mark.require_backend("cuda")
    def test_cuda_only():
        pass

    @pytest.mark.require_devices(2)
    def test_two_devices():
        pass

    @pytest.mark.require_package("no_such_package_xyz")
    def test_missing_package():
        pass

    @require_cuda
    def test_accelerate_alias():
        pass

    @require_multi_gpu
    class TestOnTwoGpus:
        def test_inside_class(self):
            pass

    @pytest.mark.require_backend("cpu")
    @pytest.mark.require_package("packaging>=20")
    def test_met_requirements_run():
        pass

    def test_unmarked():
        pass
    """
)


def _skip_lines(result, file: str = "") -> list[str]:
    """The ``SKIPPED [n] FILE:LINE: reason`` lines (of one file's tests, when given)."""
    return [line for line in result.stdout.lines if line.startswith("SKIPPED") and f" {file}" in line]


BAD_MARK = "import pytest\n\n@pytest.mark.require_devices('two')\ndef test_x():\n    pass\n"

DECORATED = textwrap.dedent(
    """
    import unittest
    from accel.test_utils import require_cuda, require_multi_device, require_non_cpu

    @require_non_cpu
    def test_accelerator_only():
        pass

    @require_cuda
    def test_cuda():
        pass

    class TestCase(unittest.TestCase):
        @require_multi_device
        def test_two_devices(self):
            pass
    """
)


def test_requirement_marks_and_accel_decorators_skip_plain_tests_with_codes_and_a_bad_mark_is_an_error(tmp_path):
    """Three files in one session (one check each): the harness's marks, accel.test_utils' decorators
    and a mark with a bad argument, all on plain tests."""
    inner.write(tmp_path, test_plain=PLAIN_MARKED, test_decorated=DECORATED, test_bad=BAD_MARK)
    result = inner.run(tmp_path)
    inner.check_all({
        "requirement marks skip a plain test with reason codes": lambda: _requirement_marks(result),
        "a bad requirement mark on a plain test is an error naming it": lambda: _bad_mark(result),
        "accel.test_utils decorators skip plain tests with codes": lambda: _decorators(result),
    }, result)


def _requirement_marks(result) -> None:
    assert inner.outcomes(result, "test_plain.py") == {"passed": 2, "skipped": 6}
    text = "\n".join(_skip_lines(result, "test_plain.py"))
    assert text.count("[not-on-backend]") == 3, text  # require_non_cpu, require_backend('cuda'), require_cuda
    assert text.count("[needs-devices]") == 2, text  # require_devices(2), require_multi_gpu
    assert text.count("[needs-package]") == 1 and "no_such_package_xyz" in text
    # every skip points at its test file, as pytest's own skipif does, not into the plugin
    assert all(line.split()[2].startswith(("test_plain.py:", "test_decorated.py:")) for line in _skip_lines(result))


def _bad_mark(result) -> None:
    assert inner.outcomes(result, "test_bad.py") == {"error": 1}
    result.stdout.fnmatch_lines(["*test_bad.py::test_x*require_devices('two')*"])


def _decorators(result) -> None:
    assert inner.outcomes(result, "test_decorated.py") == {"skipped": 3}
    text = "\n".join(_skip_lines(result, "test_decorated.py"))
    assert text.count("[not-on-backend]") == 2 and "[needs-devices]" in text, text


def test_plain_marks_are_judged_against_every_selected_backend(pytester):
    """With two backends selected, a plain test runs when one of them meets its requirements."""
    pytester.makeconftest(textwrap.dedent(
        """
        from accel.backends import register_backend
        from accel.backends.cpu import CPUBackend

        class SimBackend(CPUBackend):
            name = "sim"
            priority = 900

        register_backend(SimBackend)
        """))
    pytester.makepyfile(test_plain=textwrap.dedent(
        """
        import pytest

        @pytest.mark.require_non_cpu
        def test_not_on_cpu():
            pass

        @pytest.mark.require_backend("xpu")
        def test_xpu_only():
            pass
        """))
    both = _run(pytester, "--backend", "cpu,sim")
    both.assert_outcomes(passed=1, skipped=1)
    skip = "\n".join(_skip_lines(both))
    assert "[not-on-backend]" in skip and "cpu:" in skip and "sim:" in skip, skip
    only_cpu = _run(pytester, "--accel-backend", "cpu")
    only_cpu.assert_outcomes(skipped=2)


OWN_OPTIONS = textwrap.dedent(
    """
    import sys

    def pytest_addoption(parser):
        parser.addoption("--backend", default="project-default", help="the project's own backend option")
        parser.addoption("--results-dir", default="project-results")

    def pytest_configure(config):
        config.addinivalue_line("markers", "cuda: the project's own cuda tests")

    def pytest_unconfigure(config):
        with open("seen.txt", "w") as fh:
            fh.write(f"{config.getoption('backend')}|{config.getoption('results_dir')}|{'torch' in sys.modules}")
    """
)


OWN_MARKED = textwrap.dedent(
    """
    import pytest

    @pytest.mark.cuda
    def test_mine_on_cuda():
        pass

    def test_other():
        pass
    """
)


def test_a_project_that_defines_backend_results_dir_and_cuda_itself_keeps_them(pytester):
    """A project with its own ``--backend``/``--results-dir`` options and its own ``cuda`` marker."""
    pytester.makeconftest(OWN_OPTIONS)
    pytester.makepyfile(test_mine=OWN_MARKED)
    result = _run(pytester, "--backend", "mine", "--results-dir", "out", "-m", "cuda", "--strict-markers")
    assert result.ret == 0
    result.assert_outcomes(passed=1, deselected=1)  # -m cuda: the project's own marker
    assert (pytester.path / "seen.txt").read_text() == "mine|out|False"  # the project's values, no torch
    assert not (pytester.path / "out").exists()  # the harness did not take --results-dir
    # the harness still answers to its prefixed names
    pytester.makepyfile(test_harness="def test_on(backend):\n    assert backend.name == 'cpu'\n")
    result = _run(pytester, "--backend", "mine", "--accel-backend", "cpu", "--accel-results-dir", "records")
    result.assert_outcomes(passed=3, skipped=other_backends())
    assert list((pytester.path / "records").glob("*.jsonl")), "the harness wrote its records under --accel-results-dir"
    assert (pytester.path / "seen.txt").read_text().startswith("mine|project-results|")
    # also with harness tests collected: -m cuda is the project's marker, not a request for the cuda backend
    result = _run(pytester, "-m", "cuda")
    assert result.ret == 0, result.stdout.str()
    assert "requested backend(s) not available" not in result.stdout.str() + result.stderr.str()


def test_short_forms_work_where_nothing_clashes_and_a_projects_harness_and_reports_stay_its_own(pytester):
    """The plugin's installed packages are accel_harness/accel_reports: a project's ``harness`` and
    ``reports`` stay its own even though the plugin was imported first (and is in use: the short
    option names select this run's backend, world sizes and records folder)."""
    for package in ("harness", "reports"):
        (pytester.path / package).mkdir()
        (pytester.path / package / "__init__.py").write_text(f"OWNER = 'project {package}'\n")
    pytester.makepyfile(test_mine=textwrap.dedent(
        """
        import harness
        import reports

        def test_own_packages(backend):
            assert backend.name == "cpu"
            assert harness.OWNER == "project harness" and reports.OWNER == "project reports"
        """))
    result = _run(pytester, "-m", "cpu", "--backend", "cpu", "--results-dir", "records", "--world-sizes", "1")
    result.assert_outcomes(passed=1, deselected=other_backends())
    assert list((pytester.path / "records").glob("*.jsonl"))
    import importlib.metadata

    top_level = importlib.metadata.distribution("accel").read_text("top_level.txt")
    if top_level is not None:  # an editable install may not record it
        assert set(top_level.split()) == {"accel", "accel_harness", "accel_reports"}


TORCH_PROBE = textwrap.dedent(
    """
    import sys

    def pytest_unconfigure(config):
        with open("torch_loaded.txt", "w") as fh:
            fh.write(str("torch" in sys.modules))
    """
)


@pytest.mark.parametrize("args", [("-m", "cpu"), ("-m", "cuda or xpu"), ()])
def test_an_unrelated_project_does_not_import_torch(pytester, args):
    pytester.makeconftest(TORCH_PROBE)
    pytester.makepyfile(test_plain=textwrap.dedent(
        """
        import pytest

        @pytest.mark.cpu
        def test_fast():
            pass

        @pytest.mark.slow
        def test_slow():
            pass
        """))
    result = _run(pytester, *args)
    assert result.ret in (0, pytest.ExitCode.NO_TESTS_COLLECTED)
    assert (pytester.path / "torch_loaded.txt").read_text() == "False"


def test_the_plugin_can_be_switched_off(pytester):
    pytester.makepyfile(test_plain="import pytest\n\n@pytest.mark.require_non_cpu\ndef test_x():\n    pass\n")
    result = _run(pytester, "-p", "no:accel")
    result.assert_outcomes(passed=1)  # no plugin, no requirement marks: the test simply runs
    assert "--accel-backend" not in _run(pytester, "-p", "no:accel", "--help").stdout.str()


def test_dash_m_on_a_missing_backend_under_xdist_stops_cleanly(pytester):
    pytester.makepyfile(test_harness="def test_on(backend):\n    pass\n")
    result = _run(pytester, "-n", "2", "-m", "xpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = "\n".join(result.stdout.lines + result.stderr.lines)
    assert "requested backend(s) not available" in output and "INTERNALERROR" not in output
