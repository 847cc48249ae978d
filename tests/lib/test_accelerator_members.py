"""Accelerator members Accelerate has that scripts read: fp8 recipe attributes, the DeepSpeed plugin,
the device-map check of ``prepare`` and LOMO's fused backward."""

from __future__ import annotations


import pytest
import torch

from accel import Accelerator
from accel.state import AcceleratorState
from accel.utils import AORecipeKwargs, DistributedType, FP8BackendType


@pytest.fixture(autouse=True)
def _fresh_state():
    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


def test_every_public_member_of_accelerates_accelerator_exists_on_accel():
    accelerate = pytest.importorskip("accelerate")
    theirs = {n for n in dir(accelerate.Accelerator(cpu=True)) if not n.startswith("_")}
    accelerate.state.AcceleratorState._reset_state(True)
    ours = {n for n in dir(Accelerator(cpu=True)) if not n.startswith("_")}
    assert sorted(theirs - ours) == []


def test_without_fp8_the_recipe_attributes_are_empty_and_the_backend_follows_the_variable(monkeypatch):
    monkeypatch.delenv("ACCEL_FP8_BACKEND", raising=False)
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "te")
    accelerator = Accelerator(cpu=True)
    assert (accelerator.fp8_recipe_handler, accelerator.ao_recipe_handler, accelerator.te_recipe_handler,
            accelerator.msamp_recipe_handler) == (None, None, None, None)
    assert accelerator.has_fp8_handler is False and accelerator.fp8_enabled is False
    assert accelerator.fp8_backend == FP8BackendType.TE  # Accelerate reads the variable here too
    assert accelerator.delayed_fp8_autocast is False and accelerator.deepspeed_plugin is None
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "fp9")
    with pytest.raises(ValueError, match="ACCELERATE_FP8_BACKEND must be one of"):
        accelerator.fp8_backend


def test_fp8_without_a_recipe_builds_the_backends_default_one(monkeypatch):
    pytest.importorskip("torchao")
    monkeypatch.delenv("ACCEL_FP8_BACKEND", raising=False)
    monkeypatch.delenv("ACCELERATE_FP8_BACKEND", raising=False)
    accelerator = Accelerator(mixed_precision="fp8")
    assert isinstance(accelerator.ao_recipe_handler, AORecipeKwargs) and accelerator.fp8_recipe_handler is None
    assert accelerator.has_fp8_handler and accelerator.fp8_enabled
    assert accelerator.fp8_backend == FP8BackendType.AO


def test_a_passed_recipe_lands_in_its_own_attribute():
    pytest.importorskip("torchao")
    recipe = AORecipeKwargs()
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[recipe])
    assert accelerator.ao_recipe_handler is recipe and accelerator.te_recipe_handler is None
    assert accelerator.fp8_backend == "AO"


class _Split(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)


def test_a_model_spread_by_a_device_map_is_refused_in_a_distributed_run(monkeypatch):
    accelerator = Accelerator(cpu=True)
    model = _Split()
    assert accelerator.verify_device_map(model) is False
    model.b.hf_device_map = {"": "cpu"}  # one entry: not spread
    assert accelerator.verify_device_map(model) is False
    model.hf_device_map = {"a": "cpu", "b": "disk"}
    assert accelerator.verify_device_map(model) is True
    assert accelerator.prepare(model) is not None  # one process (distributed type NO): allowed, as in Accelerate
    monkeypatch.setattr(Accelerator, "distributed_type", property(lambda self: DistributedType.MULTI_CPU))
    fresh = _Split()
    fresh.hf_device_map = {"a": "cpu", "b": "disk"}
    for prepare in (accelerator.prepare, accelerator.prepare_model):
        with pytest.raises(ValueError, match="loaded with `device_map='auto'` in any distributed mode"):
            prepare(fresh)
    monkeypatch.setenv("ACCELERATE_BYPASS_DEVICE_MAP", "true")
    accelerator.verify_device_map(fresh)
    from accel.facade.model_wrappers import refuse_device_mapped_model

    refuse_device_mapped_model(fresh, DistributedType.MULTI_CPU)  # bypassed: no error



def test_backward_with_a_learning_rate_runs_lomos_fused_backward(fake_lomo):
    module, calls = fake_lomo
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    model, optimizer = accelerator.prepare(model, module.Lomo(model.parameters(), lr=0.1))
    assert accelerator.has_lomo_optimizer
    loss = model(torch.ones(3, 2)).sum()
    accelerator.backward(loss, learning_rate=0.05)
    assert calls == [0.05] and model.weight.grad is not None
    with pytest.raises(ValueError, match="A learning rate must be passed"):
        accelerator.lomo_backward(loss, None)


def test_lomo_backward_without_a_lomo_optimizer_names_the_problem(fake_lomo):
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert not accelerator.has_lomo_optimizer
    with pytest.raises(ValueError, match="Are you sure you passed a LOMO optimizer"):
        accelerator.lomo_backward(model(torch.ones(1, 2)).sum(), 0.1)
