"""Resolution happens once: ``accel.resolve`` decides backend, strategy and precision with a reason each;
the state stores the result and builds no plugin itself; ``accel env`` and the state give the same reasons."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import accel.state as state_module
from accel import Accelerator
from accel.backends import Capability, get_backend
from accel.resolve import RunPlan, resolve, resolve_backend, resolve_run
from accel.state import AcceleratorState, GradientState, PartialState
from accel.utils.dataclasses import DistributedType

_LAUNCHER = ("ACCELERATE_USE_DEEPSPEED", "ACCEL_USE_DEEPSPEED", "ACCELERATE_USE_FSDP", "ACCEL_USE_FSDP",
             "ACCELERATE_MIXED_PRECISION", "ACCEL_MIXED_PRECISION", "ACCELERATE_USE_CPU", "ACCEL_USE_CPU",
             "ACCEL_DEVICE", "FSDP_VERSION", "ACCELERATE_USE_PARALLELISM_CONFIG")


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    for name in _LAUNCHER:
        monkeypatch.delenv(name, raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


class _NoHalfCPU:
    """The CPU backend, except that it claims fp16 autocast cannot run (to see a fallback and its reason)."""

    def __init__(self):
        self._cpu = get_backend("cpu")

    def __getattr__(self, name):
        return getattr(self._cpu, name)

    def amp_capability(self, dtype):
        if dtype == torch.float16:
            return Capability(False, "this test's backend has no fp16")
        return self._cpu.amp_capability(dtype)


def test_one_call_gives_backend_strategy_and_precision_each_with_its_reason():
    plan = resolve(1, get_backend("cpu"), backend_reason="cpu=True was passed", mixed_precision="bf16")
    assert isinstance(plan, RunPlan)
    assert (plan.backend, plan.strategy, plan.distributed_type, plan.mixed_precision) == ("cpu", "single", DistributedType.NO, "bf16")
    assert set(plan.reasons) == {"backend", "strategy", "precision"}
    assert "cpu=True was passed" in plan.reasons["backend"]
    assert plan.reasons["strategy"] == "one process"
    assert "mixed_precision='bf16' was passed" in plan.reasons["precision"]


def test_a_precision_fallback_is_decided_and_explained_in_the_resolution():
    with pytest.warns(UserWarning, match="this test's backend has no fp16"):
        plan = resolve(1, _NoHalfCPU(), mixed_precision="fp16")
    assert plan.requested_precision == "fp16" and plan.mixed_precision == "no" and plan.precision.scaler is None
    assert "no runs instead" in plan.reasons["precision"] and "this test's backend has no fp16" in plan.reasons["precision"]


def test_the_launchers_precision_variable_is_read_with_its_name(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    plan = resolve(1, get_backend("cpu"))
    assert plan.mixed_precision == "bf16" and "ACCELERATE_MIXED_PRECISION=bf16" in plan.reasons["precision"]
    monkeypatch.setenv("ACCEL_MIXED_PRECISION", "half")
    with pytest.raises(ValueError, match="ACCEL_MIXED_PRECISION=half"):
        resolve(1, get_backend("cpu"))


def test_a_flag_variable_that_is_neither_yes_nor_no_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "perhaps")
    with pytest.raises(ValueError, match="ACCELERATE_USE_FSDP"):
        resolve_run(2, "MULTI_CPU")


def test_the_backend_reason_names_what_chose_it(monkeypatch):
    assert resolve_backend(cpu=True)[1] == "cpu=True was passed"
    monkeypatch.setenv("ACCELERATE_USE_CPU", "yes")
    backend, why = resolve_backend()
    assert backend.name == "cpu" and why.startswith("ACCELERATE_USE_CPU=true")
    monkeypatch.delenv("ACCELERATE_USE_CPU")
    monkeypatch.setenv("ACCEL_DEVICE", "cpu")
    assert resolve_backend()[1] == "ACCEL_DEVICE=cpu"


def test_fsdp_from_the_environment_gives_accel_env_and_the_state_the_same_reason(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    what_env_says = resolve_run(1, "MULTI_CPU")  # accel env's call: no Accelerator arguments
    state = AcceleratorState(cpu=True)
    assert state.run_plan.reasons["strategy"] == what_env_says.reasons["strategy"] == "ACCELERATE_USE_FSDP=true (accel launch --use_fsdp)"
    assert "ACCELERATE_USE_FSDP=true" in repr(state)
    # the plugin the launcher asked for was built by the resolution, and the state keeps that one
    assert state.fsdp_plugin is state.run_plan.fsdp_plugin is not None
    assert state.distributed_type == DistributedType.FSDP


def test_deepspeed_from_the_environment_gives_accel_env_and_the_state_the_same_reason(monkeypatch):
    pytest.importorskip("deepspeed")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    what_env_says = resolve_run(1, "MULTI_CPU")
    state = AcceleratorState(cpu=True)
    expected = "ACCELERATE_USE_DEEPSPEED=true (accel launch --use_deepspeed)"
    assert state.run_plan.reasons["strategy"] == what_env_says.reasons["strategy"] == expected
    assert state.deepspeed_plugin is next(iter(state.run_plan.deepspeed_plugins.values()))


def test_the_state_builds_no_plugin_from_the_environment_itself():
    assert not hasattr(state_module, "_plugins_from_environment")
    source = open(state_module.__file__, encoding="utf-8").read()
    assert "USE_DEEPSPEED" not in source and "USE_FSDP" not in source and "MIXED_PRECISION\"" not in source


def test_an_accelerator_resolves_once_and_never_writes_the_states_precision(monkeypatch):
    calls = []
    real = state_module.resolve

    def counting(*args, **kwargs):
        calls.append(kwargs.get("mixed_precision"))
        return real(*args, **kwargs)

    monkeypatch.setattr(state_module, "resolve", counting)
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    assert calls == ["bf16"]
    assert "_mixed_precision" not in AcceleratorState._shared_state
    assert accelerator.state.run_plan.precision is accelerator.precision
    assert accelerator.state.mixed_precision == accelerator.mixed_precision == "bf16"
    second = Accelerator(cpu=True)  # the state exists: the new Accelerator resolves once more, on its choices
    assert calls == ["bf16", "bf16"] and second.mixed_precision == "bf16"
    assert second.precision is not accelerator.precision  # its own plan (and grad scaler, under fp16)


def test_an_accelerator_without_mixed_precision_keeps_the_states_and_only_an_explicit_change_raises():
    AcceleratorState(cpu=True, mixed_precision="fp16")
    accelerator = Accelerator(cpu=True)  # as in Accelerate: leaving it out is no change
    assert accelerator.mixed_precision == "fp16" and accelerator.scaler is not None
    assert Accelerator(cpu=True, mixed_precision="fp16").mixed_precision == "fp16"
    with pytest.raises(ValueError, match="cannot change to 'bf16'"):
        Accelerator(cpu=True, mixed_precision="bf16")


def test_an_fp8_recipe_without_fp8_is_refused_by_the_resolution():
    from accel.utils.dataclasses import AORecipeKwargs

    with pytest.raises(ValueError, match="AORecipeKwargs was passed, but mixed_precision is 'no'"):
        resolve(1, get_backend("cpu"), fp8_handler=AORecipeKwargs())


def test_partial_state_records_why_it_chose_its_backend():
    assert PartialState(cpu=True).backend_reason == "cpu=True was passed"


def test_the_launchers_parallelism_config_variable_is_read_by_the_resolution(monkeypatch):
    from accel.parallelism_config import ParallelismConfig

    assert resolve(1, get_backend("cpu")).parallelism_config is None
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    plan = resolve(1, get_backend("cpu"))
    assert isinstance(plan.parallelism_config, ParallelismConfig)
    assert plan.reasons["parallelism"] == "ACCELERATE_USE_PARALLELISM_CONFIG=true (accel launch --use_parallelism_config)"
    given = ParallelismConfig()
    assert resolve(1, get_backend("cpu"), parallelism_config=given).parallelism_config is given
    state = AcceleratorState(cpu=True)
    assert state.parallelism_config is state.run_plan.parallelism_config is not None
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "maybe")
    with pytest.raises(ValueError, match="ACCELERATE_USE_PARALLELISM_CONFIG"):
        resolve(1, get_backend("cpu"))


def test_the_fsdp_strategy_reads_no_launcher_variable_itself():
    import accel.strategies.fsdp as fsdp_package

    for path in Path(fsdp_package.__file__).parent.glob("*.py"):  # every module of the package
        assert "ACCELERATE_USE_PARALLELISM_CONFIG" not in path.read_text(encoding="utf-8"), path.name
