"""The harness plugin end to end, on small generated suites run by pytest's own pytester."""

import os
import textwrap
import time

import psutil
import pytest

import _inner_session as inner
from _harness_counts import other_backends
from _waits import SAFETY_NET_S

pytest_plugins = ["pytester"]

SUITE = textwrap.dedent(
    """
    import os, time
    import pytest
    import torch
    import torch.distributed as dist

    def test_on_backend(backend, device):
        assert torch.ones(2, device=device).sum().item() == 2
        assert backend.name == device.type

    @pytest.mark.require_devices(2)
    def test_needs_two_devices(backend):
        pass

    @pytest.mark.require_non_cpu
    def test_not_on_cpu(backend):
        pass

    @pytest.mark.require_package("surely_not_installed_pkg")
    def test_needs_package(backend):
        pass

    @pytest.mark.world_size(2, 4)
    def test_all_reduce(backend, world_size, rank):
        t = torch.ones(1, device=backend.device())
        dist.all_reduce(t)
        assert t.item() == world_size == dist.get_world_size()
        assert rank == dist.get_rank()
    """
)


def _run(pytester, *args, timeout=600):
    env_threads = {"OMP_NUM_THREADS": "1"}
    for key, value in env_threads.items():
        os.environ.setdefault(key, value)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", *args, timeout=timeout)


def test_backend_parametrization_markers_and_skip_reasons_with_a_rendezvous_per_xdist_worker(tmp_path):
    """Every backend's instances (unavailable ones skipped with their reason) under two xdist workers,
    each with its own rendezvous for the multi-rank instances."""
    inner.write(tmp_path, test_suite=SUITE)
    result = inner.run(tmp_path, "-n", "2")
    out = result.stdout.str()
    result.assert_outcomes(passed=3, skipped=other_backends() * 6 + 3)  # unavailable backends x 6 instances + 3 cpu skips
    for test_id in ("test_on_backend[cpu-ws1]", "test_all_reduce[cpu-ws2]", "test_all_reduce[cpu-ws4]"):
        assert inner.outcome_of(result, f"test_suite.py::{test_id}") == "passed", out[-4000:]
    assert "[backend-unavailable] xpu:" in out and "built without XPU" in out
    assert "[needs-devices]" in out and "[not-on-backend]" in out and "[needs-package]" in out


def test_dash_m_on_a_missing_backend_stops_with_the_reason(pytester):
    pytester.makepyfile(test_suite=SUITE)
    result = _run(pytester, "-m", "xpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    # checked once collection shows harness tests (before that, -m xpu could be the project's own marker)
    output = result.stdout.lines + result.stderr.lines
    pytest.LineMatcher(output).fnmatch_lines(["ERROR: requested backend(s) not available*", "*xpu: *built without XPU*"])
    assert not any("_pytest.outcomes.Exit" in line for line in output)  # pytest's own line, not an exception's
    # with --allow-missing-backends the run goes on: test_dash_m_cpu_session_with_records_known_issues_and_multi_process_faults


def test_unknown_backend_is_a_usage_error(pytester):
    pytester.makepyfile(test_suite=SUITE)
    result = _run(pytester, "--backend", "bogus")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown backend 'bogus'*known backends*cpu*"])


def test_an_xdist_controller_stops_the_session_on_a_bad_backend_once_its_workers_start(pytester):
    """xdist's controller checks the requested backend on a thread while its workers start: the verdict is
    still the one usage error that names the problem, with no internal error from the started workers."""
    pytester.makepyfile(test_suite=SUITE)
    # an unavailable backend (probed on the thread); an unknown name fails the same resolution, in-process below
    result = _run(pytester, "-n", "1", "-m", "xpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    pytest.LineMatcher(result.stdout.lines + result.stderr.lines).fnmatch_lines(["*requested backend(s) not available*"])
    assert not any("Traceback" in line or "INTERNALERROR" in line for line in result.stderr.lines)


def test_an_xdist_controller_freezes_what_its_backend_check_imported(pytester):
    """The controller imports torch for its check and keeps it until it exits: frozen out of its garbage
    collections, the interpreter's last ones at exit included, which otherwise traverse all of torch."""
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeconftest(textwrap.dedent("""
        import gc, os

        def pytest_unconfigure(config):
            if not hasattr(config, "workerinput"):  # xdist's controller
                with open(os.path.join(str(config.rootpath), "controller.txt"), "w") as fh:
                    fh.write(f"{gc.get_freeze_count()} {'torch' in __import__('sys').modules}")
    """))
    result = _run(pytester, "-n", "1", "--backend", "cpu", "-k", "test_on_backend")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    frozen, torch_imported = (pytester.path / "controller.txt").read_text().split()
    assert torch_imported == "True" and int(frozen) > 100_000, (frozen, torch_imported)


def test_a_selection_resolved_in_the_background_is_the_one_resolved_at_once(pytester):
    """``select_in_background`` then ``selected`` gives what ``selected`` alone gives, and a failed
    resolution raises its usage error at every use, as a direct one does."""
    from accel_harness.harness_context import HarnessContext

    config = pytester.parseconfig("--backend", "cpu")
    direct = HarnessContext(config).selected
    ctx = HarnessContext(config)
    ctx.select_in_background()
    assert ctx.selection_pending()
    assert ctx.selected == direct == ["cpu"]
    assert not ctx.selection_pending()
    ctx.select_in_background()
    assert not ctx.selection_pending(), "a resolved selection is not resolved again"
    bad = HarnessContext(pytester.parseconfig("--backend", "bogus"))
    bad.select_in_background()
    for _ in range(2):
        with pytest.raises(pytest.UsageError, match="unknown backend 'bogus'"):
            _ = bad.selected


MULTI = textwrap.dedent(
    """
    import os, time
    import pytest
    import torch
    import torch.distributed as dist

    PIDS = os.environ["PID_FILE"]

    def _note():
        with open(PIDS, "a") as fh:
            fh.write(f"{os.getpid()}\\n")

    @pytest.mark.world_size(2)
    def test_a_fail_on_rank_1(backend):
        _note()
        if dist.get_rank() == 1:
            raise ValueError("boom from rank one")
        dist.barrier()

    @pytest.mark.world_size(2)
    def test_b_recovers_after_failure(backend):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2

    @pytest.mark.world_size(2)
    def test_c_skip_inside_rank(backend):
        pytest.skip("[needs-package] skipped inside the rank")

    @pytest.mark.world_size(2)
    def test_d_crash(backend):
        _note()
        if dist.get_rank() == 1:
            os._exit(7)
        dist.barrier()

    @pytest.mark.world_size(2)
    def test_e_hang(backend):
        _note()
        if dist.get_rank() == 0:
            time.sleep(60)
        dist.barrier()

    @pytest.mark.world_size(2)
    def test_f_after_hang(backend, tmp_path):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2 and tmp_path.exists()
    """
)


def test_world_size_marker_misuse_is_reported(pytester):
    pytester.makepyfile(test_bad="""
        import pytest
        @pytest.mark.world_size("two")
        def test_x(backend):
            pass
    """)
    result = _run(pytester)
    assert result.ret != 0
    assert "world_size takes positive integers" in result.stdout.str() + result.stderr.str()


KNOWN = textwrap.dedent(
    """
    - id: upstream-123
      url: https://github.com/pytorch/pytorch/issues/123
      title: all_reduce of zeros is broken
      tests: ["test_known.py::test_known_failure"]
      error: "zeros are broken"
      xfail: true
    - id: fixed-upstream-7
      title: used to fail
      tests: ["test_known.py::test_now_passing"]
    """
)

KNOWN_SUITE = textwrap.dedent(
    """
    import pytest

    def test_known_failure(backend):
        raise RuntimeError("zeros are broken on " + backend.name)

    def test_untracked_failure(backend):
        assert 1 == 2, "a new regression"

    def test_now_passing(backend):
        pass

    @pytest.mark.require_package("surely_not_installed_pkg")
    def test_skipped(backend):
        pass
    """
)


#: the multi-process suite's per-test limit: its hanging test costs all of it; every other test of that suite runs on
#: ranks that have already formed their process group (their start has a limit of its own) and ends far below it
HANG_TIMEOUT_S = 4


def test_dash_m_cpu_session_with_records_known_issues_and_multi_process_faults(tmp_path):
    """Three suites in one ``-m cpu`` session (one check each): -m selects exactly one backend; the
    session's records and known issues; a multi-process suite's failure, skip, crash and hang, and the
    tests after them. Then the known issues again, as expected failures, with a missing backend allowed."""
    inner.write(tmp_path, test_suite=SUITE, test_multi=MULTI, test_known=KNOWN_SUITE)
    (tmp_path / "known.yaml").write_text(KNOWN)
    pid_file = tmp_path / "pids.txt"
    result = inner.run(tmp_path, "-m", "cpu", "--strict-markers", "--dist-timeout", str(HANG_TIMEOUT_S), "--results-dir", "results",
                       "--known-issues", "known.yaml", env={"PID_FILE": str(pid_file)})
    inner.check_all({
        "-m selects exactly one backend": lambda: _one_backend(result),
        "records and known issues": lambda: _records_and_known_issues(result, tmp_path),
        "multi-process fail, skip, crash, hang and recovery": lambda: _multi_process(result, pid_file),
    }, result)
    # with --known-issues-xfail the tracked failure becomes an xfail; the untracked one still fails; and with
    # --allow-missing-backends, -m naming a backend this machine lacks runs and skips that backend's instances
    again = inner.run(tmp_path, "-m", "cpu or xpu", "--allow-missing-backends", "--known-issues", "known.yaml",
                      "--known-issues-xfail", "test_known.py")
    again.assert_outcomes(passed=1, failed=1, skipped=1 + 4, xfailed=1, deselected=4 * (other_backends() - 1))
    assert len([line for line in again.outlines if line.startswith("SKIPPED") and "[backend-unavailable] xpu:" in line]) == 4


def _one_backend(result: pytest.RunResult) -> None:
    assert inner.outcomes(result, "test_suite.py") == {"passed": 3, "skipped": 3}
    # every other backend's instances of the three suites were deselected (6 + 4 + 6 tests each)
    assert result.parseoutcomes()["deselected"] == 16 * other_backends()


def _records_and_known_issues(result: pytest.RunResult, folder) -> None:
    from accel_harness.records import read_records

    assert inner.outcomes(result, "test_known.py") == {"passed": 1, "failed": 2, "skipped": 1}
    files = list((folder / "results").glob("*.jsonl"))
    assert len(files) == 1
    header, records, problems = read_records(files[0])
    assert not problems and not header["interrupted"] and header["schema"] == "accel.results"
    records = [r for r in records if r["test_id"].startswith("test_known.py::")]
    by_test = {r["test_id"]: r for r in records}
    # device-neutral ids: the backend's part of the id is gone, the world size stays
    assert set(by_test) == {f"test_known.py::{n}[ws1]" for n in
                            ("test_known_failure", "test_untracked_failure", "test_now_passing", "test_skipped")}
    assert all(r["backend"] == "cpu" and r["world_size"] == 1 for r in records)
    known = by_test["test_known.py::test_known_failure[ws1]"]
    assert known["outcome"] == "failed" and known["known_issue"] == "upstream-123"
    assert "zeros are broken on <" not in (known["signature"] or "")  # the signature is normalised text
    untracked = by_test["test_known.py::test_untracked_failure[ws1]"]
    assert untracked["outcome"] == "failed" and untracked["known_issue"] is None
    assert by_test["test_known.py::test_skipped[ws1]"]["reason_code"] == "needs-package"
    assert by_test["test_known.py::test_now_passing[ws1]"]["extra"]["tracked_pass"] == ["fixed-upstream-7"]


def _multi_process(result: pytest.RunResult, pid_file) -> None:
    assert inner.outcomes(result, "test_multi.py") == {"passed": 2, "failed": 3}  # and the skip (located in the rank):
    assert [line for line in result.outlines if line.startswith("SKIPPED") and "skipped inside the rank" in line]
    assert result.parseoutcomes()["skipped"] == 5  # 3 of test_suite.py, 1 of test_known.py, that one
    assert "rank 1 of 2 failed: ValueError: boom from rank one" in inner.section(result, "test_a_fail_on_rank_1")
    assert "rank 1 died with exit code" in inner.section(result, "test_d_crash")
    hang = inner.section(result, "test_e_hang")
    assert f"timeout: ranks [0, 1] did not finish within {HANG_TIMEOUT_S}s" in hang  # the hang cost its timeout, not a watchdog's 30 min
    assert "--- rank 0 ---" in hang and "in test_e_hang" in hang  # every rank's stack
    assert inner.outcome_of(result, "test_multi.py::test_b_recovers_after_failure[cpu-ws2]") == "passed"
    assert inner.outcome_of(result, "test_multi.py::test_f_after_hang[cpu-ws2]") == "passed"
    pids = {int(p) for p in pid_file.read_text().split()}
    assert pids

    def alive() -> list[int]:
        return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

    deadline = time.monotonic() + SAFETY_NET_S  # the ranks are being reaped as the session ends: wait for it, bounded
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive() == []  # no rank outlives the session


def test_plain_tests_and_a_suites_own_device_fixture_are_left_alone(pytester):
    """The plugin is installed for every pytest run: a plain test runs as it is, and a project with its
    own `device` fixture must not find its tests multiplied over backends."""
    pytester.makeconftest("""
        import pytest

        @pytest.fixture
        def device():
            return "my-device"
    """)
    pytester.makepyfile(test_mine="""
        def test_uses_own_device(device):
            assert device == "my-device"
    """, test_plain="""
        def test_plain():
            assert True
    """)
    result = _run(pytester, "-v")
    result.assert_outcomes(passed=2)
    assert "test_uses_own_device PASSED" in result.stdout.str() and "test_plain PASSED" in result.stdout.str()


TORCH_PROBE = textwrap.dedent(
    """
    import sys

    def pytest_unconfigure(config):
        with open("torch_loaded.txt", "w") as fh:
            fh.write(str("torch" in sys.modules))
    """
)


def test_a_session_that_uses_no_backend_does_not_import_torch(pytester):
    pytester.makeconftest(TORCH_PROBE)
    pytester.makepyfile(test_plain="def test_arithmetic():\n    assert 1 + 1 == 2\n")
    result = _run(pytester, "-m", "not slow")
    result.assert_outcomes(passed=1)
    assert (pytester.path / "torch_loaded.txt").read_text() == "False"
    # a test that asks for a backend builds the registry on demand (nothing requested a backend at start-up)
    pytester.makepyfile(test_on_backend="def test_it(backend):\n    assert backend.name == 'cpu'\n")
    result = _run(pytester, "-m", "not slow")
    result.assert_outcomes(passed=2, skipped=other_backends())  # the other backends' instances: unavailable here
    assert (pytester.path / "torch_loaded.txt").read_text() == "True"


def test_a_backend_registered_in_a_conftest_gets_its_marker(pytester):
    pytester.makeconftest(textwrap.dedent(
        """
        from accel.backends import register_backend
        from accel.backends.cpu import CPUBackend

        class SimBackend(CPUBackend):
            name = "sim"
            priority = 900

        register_backend(SimBackend)
        """))
    pytester.makepyfile(test_sim="def test_it(backend):\n    assert backend.name == 'sim'\n")
    result = _run(pytester, "--strict-markers", "-m", "sim")
    result.assert_outcomes(passed=1)


def test_an_unknown_accel_device_stops_the_session_once(pytester, monkeypatch):
    pytester.makepyfile(test_plain="def test_arithmetic():\n    assert True\n",
                        test_on_backend="def test_it(backend):\n    pass\n")
    monkeypatch.setenv("ACCEL_DEVICE", "bogus")
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "ACCEL_DEVICE" in result.stderr.str() and "bogus" in result.stderr.str()


def test_builtin_names_for_markers_match_the_registry():
    from accel.backends.registry import _builtin_factories
    from accel_harness.plugin import BUILTIN_BACKEND_NAMES, marker_backend_names

    assert list(BUILTIN_BACKEND_NAMES) == [factory.name for factory in _builtin_factories()]  # same order too
    assert set(BUILTIN_BACKEND_NAMES) <= set(marker_backend_names())


def test_skip_verdicts_are_worked_out_once_per_mark_set_and_usage_errors_every_time(pytester):
    pytester.makeconftest(textwrap.dedent(
        """
        from accel_harness import markers

        calls = []
        _evaluate = markers.evaluate

        def counting(*args, **kwargs):
            calls.append(kwargs.get("where"))
            return _evaluate(*args, **kwargs)

        markers.evaluate = counting

        def pytest_sessionfinish(session):
            print(f"\\nevaluate calls: {len(calls)}")
        """))
    pytester.makepyfile(test_same=textwrap.dedent(
        """
        import pytest

        @pytest.mark.require_package("surely_not_installed_pkg")
        def test_one(backend):
            pass

        @pytest.mark.require_package("surely_not_installed_pkg")
        def test_two(backend):
            pass

        @pytest.mark.require_package("surely_not_installed_pkg", "another_missing_pkg")
        def test_three(backend):
            pass

        @pytest.mark.world_size(2)
        def test_four(backend):
            pass

        @pytest.mark.world_size(2)
        def test_five(backend):
            pass
        """))
    result = _run(pytester, "--backend", "cpu", "-m", "cpu", "-s")
    result.assert_outcomes(passed=2, skipped=3)
    out = result.stdout.str()
    # one verdict per distinct (marks, backend, world size): require_package x2 kinds + world_size(2)
    assert "evaluate calls: 3" in out, out[-2000:]


def test_marks_key_tells_apart_what_evaluate_tells_apart():
    from accel_harness.plugin import _marks_key

    def key(*marks, world=2):
        return _marks_key([m.mark for m in marks], "cpu", world)

    assert key(pytest.mark.world_size(2)) == key(pytest.mark.world_size(2))
    assert key(pytest.mark.world_size(2)) != key(pytest.mark.world_size(2), world=4)
    assert key(pytest.mark.world_size(True)) != key(pytest.mark.world_size(1))  # a usage error is not a cache hit
    assert key(pytest.mark.world_size([2, 4])) != key(pytest.mark.world_size((2, 4)))
    assert key(pytest.mark.require_package("a", any_of=True)) != key(pytest.mark.require_package("a"))
    assert key(pytest.mark.usefixtures("x"), pytest.mark.parametrize("x", [object()])) == key()  # only harness marks count
    assert key(pytest.mark.require_backend(object())) is None  # an argument it cannot compare: not remembered
