"""accel.hooks: adding and removing hooks leaves a model unchanged; offload hooks on the CPU."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
import torch.nn as nn

from accel.big_modeling import attach_layerwise_casting_hooks
from accel.hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)

    def forward(self, x, scale: float = 1.0):
        return self.linear2(self.batchnorm(self.linear1(x))) * scale


class Recorder(ModelHook):
    def __init__(self, log, tag):
        self.log, self.tag = log, tag

    def init_hook(self, module):
        self.log.append(("init", self.tag))
        return module

    def pre_forward(self, module, *args, **kwargs):
        self.log.append(("pre", self.tag))
        return (args[0] + 1,) + args[1:], kwargs

    def post_forward(self, module, output):
        self.log.append(("post", self.tag))
        return output * 2

    def detach_hook(self, module):
        self.log.append(("detach", self.tag))
        return module


def _snapshot(model: nn.Module) -> dict:
    return {k: (v.device, v.dtype, v.clone()) for k, v in model.state_dict().items()}


def _same(model: nn.Module, snapshot: dict) -> bool:
    now = model.state_dict()
    return now.keys() == snapshot.keys() and all(
        now[k].device == d and now[k].dtype == t and torch.equal(now[k], v) for k, (d, t, v) in snapshot.items()
    )


def test_hooks_run_in_order_and_removal_restores_the_model():
    model = Net().eval()
    x = torch.randn(2, 3)
    expected = model(x)
    before = _snapshot(model)
    log: list = []
    add_hook_to_module(model, Recorder(log, "a"))
    add_hook_to_module(model, Recorder(log, "b"), append=True)
    assert isinstance(model._hf_hook, SequentialHook) and len(model._hf_hook.hooks) == 2
    assert model.forward.__name__ == "forward"
    assert list(inspect.signature(model.forward).parameters) == ["x", "scale"]
    out = model(x, scale=1.0)
    assert torch.allclose(out, model._old_forward(x + 2) * 4)
    assert [e for e in log if e[0] in ("pre", "post")] == [("pre", "a"), ("pre", "b"), ("post", "a"), ("post", "b")]
    remove_hook_from_module(model)
    assert ("detach", "a") in log and ("detach", "b") in log
    assert not hasattr(model, "_hf_hook") and not hasattr(model, "_old_forward") and "forward" not in model.__dict__
    assert _same(model, before) and torch.equal(model(x), expected)


def test_replacing_a_hook_does_not_chain_it():
    model = Net().eval()
    x = torch.randn(2, 3)
    add_hook_to_module(model, Recorder([], "a"))
    add_hook_to_module(model, Recorder([], "b"))
    assert torch.allclose(model(x), model._old_forward(x + 1) * 2)


def test_no_grad_hook():
    model = Net()
    hook = ModelHook()
    add_hook_to_module(model, hook)
    assert model(torch.randn(2, 3)).requires_grad
    hook.no_grad = True
    assert not model(torch.randn(2, 3)).requires_grad


@pytest.mark.parametrize("offload_buffers", [False, True])
def test_offload_hooks_keep_weights_off_the_module_and_give_them_back(offload_buffers):
    model = Net().eval()
    x = torch.randn(2, 3)
    expected = model(x)
    before = _snapshot(model)
    attach_align_device_hook(model, execution_device="cpu", offload=True, offload_buffers=offload_buffers)
    assert model.linear1.weight.device.type == "meta"
    assert (model.batchnorm.running_mean.device.type == "meta") is offload_buffers
    assert torch.equal(model(x), expected)
    assert model.linear2.weight.device.type == "meta", "weights stayed onloaded after the forward"
    remove_hook_from_submodules(model)
    assert _same(model, before)
    assert all(not hasattr(m, "_hf_hook") for m in model.modules())


def test_io_same_device_sends_outputs_back_to_the_input_device():
    model = Net().eval()
    add_hook_to_module(model, AlignDevicesHook(execution_device="meta", io_same_device=True, place_submodules=True))
    assert model.linear1.weight.device.type == "meta"  # not offloading: weights live on the execution device
    hook = model._hf_hook
    args, kwargs = hook.pre_forward(model, torch.randn(2, 3), scale=torch.ones(1))
    assert args[0].device.type == "meta" and kwargs["scale"].device.type == "meta"
    assert hook.input_device == torch.device("cpu")
    args, _ = hook.pre_forward(model, torch.randn(2, 3, device="meta"))
    assert hook.post_forward(model, torch.ones(2)).device.type == "meta"


def test_cpu_offload_hook_on_the_host_and_user_hook():
    model = Net().eval()
    x = torch.randn(2, 3)
    expected = model(x)
    hook = CpuOffload(execution_device="cpu")
    add_hook_to_module(model, hook)
    user = UserCpuOffloadHook(model, hook)
    assert torch.equal(model(x), expected)
    user.offload()
    assert model.linear1.weight.device.type == "cpu"
    user.remove()
    assert not hasattr(model, "_hf_hook")


def test_layerwise_casting_stores_low_precision_and_computes_high():
    model = Net().eval()
    x = torch.randn(2, 3)
    expected = model(x)
    attach_layerwise_casting_hooks(model, storage_dtype=torch.bfloat16, compute_dtype=torch.float32, skip_modules_pattern=["linear2"])
    assert model.linear1.weight.dtype == torch.bfloat16 and model.linear2.weight.dtype == torch.float32
    assert model.batchnorm.weight.dtype == torch.float32  # not a supported layer
    with torch.no_grad():
        out = model(x)
    assert out.dtype == torch.float32 and torch.allclose(out, expected, atol=0.1)
    assert model.linear1.weight.dtype == torch.bfloat16


def test_hooked_models_deep_copy_independently():
    model = Net().eval()
    add_hook_to_module(model, Recorder([], "a"))
    clone = copy.deepcopy(model)
    assert clone.forward is not model.forward
    x = torch.randn(2, 3)
    assert torch.equal(clone(x), model(x))
