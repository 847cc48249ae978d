"""accel.test_utils: the regression toys match Accelerate's; the decorators skip with reasons and codes."""

from __future__ import annotations

import io
import textwrap
import unittest

import numpy as np
import pytest
import torch

import accel.test_utils as tu
from accel.backends import get_backend, get_registry, torch_version

from accel.test_utils import REQUIREMENTS, RegressionDataset, RegressionModel
from accel.test_utils.testing import REASON_CODES, Requirement, evaluate_requirement, skip_unless
from dist_utils import run_distributed

pytest_plugins = ["pytester"]


def _reference_training():
    return pytest.importorskip("accelerate.test_utils.training", reason="the reference `accelerate` is not installed")


def _skipif_mark(obj):
    (mark,) = [m for m in getattr(obj, "pytestmark", []) if m.name == "skipif"]
    return mark


def _decorated(decorator):
    def test_something():
        pass

    return decorator(test_something)


# ---------------------------------------------------------------------- regression toys
@pytest.mark.parametrize("kwargs", [dict(seed=42), dict(a=-1, b=0.5, length=17, seed=7)])
def test_regression_dataset_equals_the_reference(kwargs):
    reference = _reference_training()
    ours, theirs = RegressionDataset(**kwargs), reference.RegressionDataset(**kwargs)
    assert len(ours) == len(theirs) == kwargs.get("length", 64)
    assert ours.x.dtype == theirs.x.dtype == np.float32 and ours.y.dtype == theirs.y.dtype
    np.testing.assert_array_equal(ours.x, theirs.x)
    np.testing.assert_array_equal(ours.y, theirs.y)
    item = ours[3]
    assert set(item) == {"x", "y"} and item["x"] == theirs[3]["x"] and item["y"] == theirs[3]["y"]


def test_regression_dataset_without_seed_differs_between_instances():
    assert not np.array_equal(RegressionDataset().x, RegressionDataset().x)
    assert not np.array_equal(RegressionDataset(seed=1).x, RegressionDataset(seed=2).x)


def test_regression_model_matches_the_reference(capsys):
    reference = _reference_training()
    ours, theirs = RegressionModel(a=1.5, b=-2), reference.RegressionModel(a=1.5, b=-2)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["a", "b"]
    assert all(p.dtype == torch.float32 and p.shape == () for p in ours.parameters())
    x = torch.linspace(-1, 1, 7)
    ours_out, theirs_out = ours(x), theirs(x)
    torch.testing.assert_close(ours_out, theirs_out, rtol=0, atol=0)
    ours_out.sum().backward()
    theirs_out.sum().backward()
    assert ours.a.grad == theirs.a.grad and ours.b.grad == theirs.b.grad
    # state dicts load across implementations
    ours.load_state_dict(RegressionModel(a=3, b=4).state_dict())
    theirs.load_state_dict(ours.state_dict())
    assert (theirs.a.item(), theirs.b.item()) == (3.0, 4.0)
    assert not ours.first_batch
    assert "Model dtype" in capsys.readouterr().out  # the reference prints; ours stays quiet
    ours2 = RegressionModel()
    ours2(x)
    assert capsys.readouterr().out == ""


# ---------------------------------------------------------------------- the decorators as marks
def _backend_available(name):
    return get_registry().get(name).is_available()


@pytest.mark.parametrize("name", ["cuda", "xpu", "mps", "hpu"])
def test_backend_decorators_follow_the_registry(name):
    """"Requires cuda" means the test runs on cuda: the active backend is it (the harness's require_backend)."""
    mark = _skipif_mark(_decorated(getattr(tu, f"require_{name}")))
    backend = get_registry().get(name)
    assert mark.args == (get_backend().name != name,)
    assert mark.kwargs["reason_code"] == "not-on-backend"
    assert mark.kwargs["requirement"] == f"require_{name}"
    assert mark.kwargs["reason"].startswith(f"[not-on-backend] test requires a {name} device (the active backend is ")
    if get_backend().name != name:
        assert backend.availability.reason in mark.kwargs["reason"]
    if not backend.is_available():
        assert f"backend {name} unavailable:" in mark.kwargs["reason"]


def test_cpu_decorators_on_this_machine():
    on_cpu = get_backend().name == "cpu"
    cpu = _skipif_mark(_decorated(tu.require_cpu))
    non_cpu = _skipif_mark(_decorated(tu.require_non_cpu))
    assert cpu.args == (not on_cpu,) and non_cpu.args == (on_cpu,)
    assert cpu.kwargs["reason_code"] == non_cpu.kwargs["reason_code"] == "not-on-backend"
    assert f"the active backend is {get_backend().name}" in non_cpu.kwargs["reason"]


def test_device_count_decorators():
    active = get_backend()
    count = active.device_count()
    multi = _skipif_mark(_decorated(tu.require_multi_device))
    assert multi.args == (not count > 1,) and multi.kwargs["reason_code"] == "needs-devices"
    assert f"{active.name} has {count} device(s)" in multi.kwargs["reason"]
    single = _skipif_mark(_decorated(tu.require_single_device))
    assert single.args == (not (active.name != "cpu" and count == 1),)
    multi_gpu = _skipif_mark(_decorated(tu.require_multi_gpu))
    cuda = get_registry().get("cuda")
    assert multi_gpu.args == (not (cuda.is_available() and cuda.device_count() > 1),)


def test_unregistered_backend_names_the_known_ones():
    mark = _skipif_mark(_decorated(tu.require_npu))
    if "npu" not in get_registry().names():
        assert mark.args == (True,)
        assert "no backend named 'npu' is registered (known: " in mark.kwargs["reason"]


def test_dtype_decorators_ask_the_active_backend():
    from accel.precision.fp8 import fp8_refusal

    active = get_backend()
    for decorator, cap in ((tu.require_fp16, active.supports_fp16), (tu.require_bf16, active.supports_bf16),
                           (tu.require_fp8, active.supports_fp8)):
        mark = _skipif_mark(_decorated(decorator))
        refusal = fp8_refusal() if decorator is tu.require_fp8 else None  # fp8 also needs torchao, as in Accelerate
        assert mark.args == (refusal is not None or not cap.supported,) and mark.kwargs["reason_code"] == "unsupported-dtype"
        assert (refusal or cap.reason) in mark.kwargs["reason"]


def test_package_decorators_name_the_package():
    from accel.utils.imports import is_tensorboard_available

    mark = _skipif_mark(_decorated(tu.require_tensorboard))
    assert mark.args == (not is_tensorboard_available(),) and mark.kwargs["reason_code"] == "needs-package"
    fake = Requirement(lambda: (False, "surely_not_installed_pkg not installed"), "needs-package", "test requires x")
    assert fake.evaluate() == (False, "test requires x (surely_not_installed_pkg not installed)")
    suite = _skipif_mark(_decorated(tu.require_huggingface_suite))
    try:
        import datasets  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        assert suite.args == (True,) and "not installed" in suite.kwargs["reason"]


def test_torch_min_version():
    old = _skipif_mark(tu.require_torch_min_version(version="1.0")(_decorated(lambda f: f)))
    new = _skipif_mark(tu.require_torch_min_version(_decorated(lambda f: f), version="99.0"))
    assert old.args == (False,) and new.args == (True,)
    assert new.kwargs["reason"] == f"[torch-version] test requires torch >= 99.0 (installed torch is {torch_version()})"
    assert new.kwargs["reason_code"] == "torch-version"
    with pytest.raises(ValueError, match="version="):
        tu.require_torch_min_version(_decorated(lambda f: f))


def test_slow_runs_only_when_asked(monkeypatch):
    monkeypatch.delenv("RUN_SLOW", raising=False)
    skipped = _skipif_mark(_decorated(tu.slow))
    assert skipped.args == (True,) and skipped.kwargs["reason_code"] == "opt-in"
    assert "RUN_SLOW" in skipped.kwargs["reason"]
    monkeypatch.setenv("RUN_SLOW", "yes")
    assert _skipif_mark(_decorated(tu.slow)).args == (False,)
    monkeypatch.setenv("RUN_SLOW", "maybe")
    assert _skipif_mark(_decorated(tu.slow)).args == (True,)  # a bad value skips, with the error
    assert "RUN_SLOW must be yes or no" in _skipif_mark(_decorated(tu.slow)).kwargs["reason"]


def test_a_failing_check_skips_with_its_error():
    def broken():
        raise RuntimeError("driver exploded")

    assert Requirement(broken, "backend-unavailable", "test requires z").evaluate() == (
        False, "test requires z (check failed: RuntimeError: driver exploded)")


def test_the_table_is_consistent():
    for name, row in REQUIREMENTS.items():
        assert row.reason_code in REASON_CODES, name
        assert callable(getattr(tu, name)), name
    assert evaluate_requirement("require_cuda")[2] == "not-on-backend"
    assert evaluate_requirement("require_torch_min_version", version="1.0")[:2] == (
        True, f"test requires torch >= 1.0 (installed torch is {torch_version()})")
    with pytest.raises(KeyError, match="require_nothing"):
        evaluate_requirement("require_nothing")
    with pytest.raises(ValueError, match="unknown reason code"):
        skip_unless(False, "x", "because")


def test_reference_decorators_exist_here():
    reference = pytest.importorskip("accelerate.test_utils", reason="the reference `accelerate` is not installed")
    wanted = {n for n in dir(reference) if n.startswith("require_")}
    assert wanted <= set(dir(tu)), sorted(wanted - set(dir(tu)))
    # the decorators Accelerate's own tests import from the testing module, and its helper names there
    testing_reference = pytest.importorskip("accelerate.test_utils.testing")
    from accel.test_utils import testing as ours

    wanted = {n for n in dir(testing_reference) if n.startswith("require_")}
    assert wanted <= set(dir(ours)), sorted(wanted - set(dir(ours)))
    for name in ("AccelerateTestCase", "TempDirTestCase", "MockingTestCase", "run_command", "get_launch_command",
                 "path_in_accelerate_package", "is_hpu_available", "is_xpu_available", "capture_call_output"):
        assert hasattr(ours, name), name
    for name in ("test_script", "test_sync", "test_ops"):
        assert callable(getattr(tu, name).main), name
    for name in ("slow", "skip", "run_first", "are_the_same_tensors", "get_launch_command", "execute_subprocess_async",
                 "torch_device", "device_count", "memory_allocated_func", "DEFAULT_LAUNCH_COMMAND"):
        assert hasattr(tu, name), name


def test_device_facts_come_from_the_active_backend():
    active = get_backend()
    assert tu.torch_device == active.device_type
    assert tu.device_count == active.device_count()
    assert isinstance(tu.memory_allocated_func(), int)
    assert tu.get_launch_command(num_processes=2, cpu=True, debug=False, config_file=None) == [
        "accel", "launch", "--num_processes=2", "--cpu"]
    assert tu.DEFAULT_LAUNCH_COMMAND[:3] == ["accel", "launch", f"--num_processes={active.device_count()}"]


# ---------------------------------------------------------------------- under real runners
_SKIPPED_CASES = textwrap.dedent(
    """
    import unittest
    from accel.test_utils import require_cpu, require_non_cpu, require_torch_min_version

    @require_non_cpu
    def test_function_needing_an_accelerator():
        raise AssertionError("should have been skipped")

    @require_cpu
    def test_function_for_cpu():
        pass

    class Cases(unittest.TestCase):
        @require_non_cpu
        def test_method_needing_an_accelerator(self):
            raise AssertionError("should have been skipped")

        @require_torch_min_version(version="99")
        def test_method_needing_future_torch(self):
            raise AssertionError("should have been skipped")

        @require_cpu
        def test_method_for_cpu(self):
            pass
    """
)


def test_decorators_skip_functions_and_testcase_methods_under_pytest(pytester):
    if get_backend().name != "cpu":
        pytest.skip("the sample expects the cpu backend to be active")
    pytester.makepyfile(test_sample=_SKIPPED_CASES)
    result = pytester.runpytest_inprocess("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, skipped=3)
    result.stdout.fnmatch_lines([
        "*[[]not-on-backend[]] test requires a hardware accelerator (the active backend is cpu)*",
        "*[[]torch-version[]] test requires torch >= 99 (installed torch is*",
    ])


def test_decorators_skip_under_plain_unittest():
    if get_backend().name != "cpu":
        pytest.skip("the sample expects the cpu backend to be active")
    namespace: dict = {}
    exec(compile(_SKIPPED_CASES, "<sample>", "exec"), namespace)
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(namespace["Cases"])
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
    assert result.testsRun == 3 and not result.failures and not result.errors
    reasons = sorted(reason for _, reason in result.skipped)
    assert reasons == [
        "[not-on-backend] test requires a hardware accelerator (the active backend is cpu)",
        f"[torch-version] test requires torch >= 99 (installed torch is {torch_version()})",
    ]


# ---------------------------------------------------------------------- helpers
def test_assert_exception_and_capture_call_output():
    with tu.assert_exception(ValueError, "bad"):
        raise ValueError("a bad value")
    with pytest.raises(AssertionError, match="without raising"):
        with tu.assert_exception(ValueError):
            pass
    with pytest.raises(AssertionError, match="expected ValueError, got KeyError"):
        with tu.assert_exception(ValueError):
            raise KeyError("x")
    assert tu.capture_call_output(print, "hello", 3) == "hello 3\n"


def test_run_command_and_execute_subprocess_async():
    import sys

    assert tu.run_command([sys.executable, "-c", "print('hi')"], return_stdout=True) == "hi\n"
    with pytest.raises(tu.SubprocessCallException, match="boom"):
        tu.run_command([sys.executable, "-c", "import sys; sys.exit('boom')"])
    out = tu.execute_subprocess_async([sys.executable, "-c", "print('a'); print('b')"], quiet=True, echo=False)
    assert out.returncode == 0 and out.stdout == ["a", "b"]
    with pytest.raises(RuntimeError, match="returncode 3"):
        tu.execute_subprocess_async([sys.executable, "-c", "import sys; sys.exit(3)"], quiet=True, echo=False)


def test_xdist_worker_port(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    assert tu.pytest_xdist_worker_id() == 3 and tu.get_torch_dist_unique_port() == 29503
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert tu.get_torch_dist_unique_port() == 29500


def _same_tensors_rank():
    import torch as t

    from accel.state import PartialState

    rank = PartialState().process_index
    return tu.are_the_same_tensors(t.arange(4.0)), tu.are_the_same_tensors(t.full((2,), float(rank)))


def test_are_the_same_tensors_across_two_ranks():
    assert run_distributed(_same_tensors_rank, 2) == [(True, False), (True, False)]


def test_new_requirement_rows_follow_their_packages(monkeypatch):
    from accel.test_utils import testing

    def installed(*names):
        return lambda requirement: None if requirement.split(">")[0] in names else f"{requirement} not installed"

    monkeypatch.setattr(testing, "_package_problem", installed("wandb"))
    assert evaluate_requirement("require_trackers")[0] is True
    monkeypatch.setattr(testing, "_package_problem", installed("wandb", "comet_ml"))
    satisfied, reason, code = evaluate_requirement("require_trackers")
    assert (satisfied, code) == (False, "known-limitation") and "comet_ml is installed" in reason
    monkeypatch.setattr(testing, "_package_problem", installed())
    assert evaluate_requirement("require_trackers")[2] == "needs-package"
    assert evaluate_requirement("require_import_timer")[:1] == (False,)
    assert evaluate_requirement("require_tp")[0] is False  # transformers missing
