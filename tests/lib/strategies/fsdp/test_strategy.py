"""The FSDP strategy on real gloo ranks: optimizer switched to the shards, clipping over shards, accumulation,
precision, rank-0 loading, ignored modules, activation checkpointing, tensor parallelism, and clear errors."""

from __future__ import annotations

import copy
import pytest
import torch
import torch.nn.functional as F

from dist_utils import run_distributed


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith(("PARALLELISM_CONFIG_", "FSDP_")) or name in ("ACCELERATE_USE_FSDP", "ACCEL_USE_FSDP"):
            monkeypatch.delenv(name)


class Block(torch.nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class Net(torch.nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.out = torch.nn.Linear(8, 1)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.empty_like(p).uniform_(-0.5, 0.5, generator=g))

    def forward(self, x):
        return self.out(self.blocks(self.inp(x)))


def _data(rank: int, step: int, per_rank: int = 4):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(per_rank, 4, generator=g), torch.randn(per_rank, 1, generator=g)


def _global_batch(world: int, step: int):
    xs, ys = zip(*(_data(r, step) for r in range(world)))
    return torch.cat(xs), torch.cat(ys)


def _reference(world: int, steps: int, max_norm=None, lr=0.1):
    """One process, the concatenated batch of all ranks per step (what sharded data parallelism must equal)."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    norms = []
    for step in range(steps):
        x, y = _global_batch(world, step)
        F.mse_loss(model(x), y).backward()
        if max_norm is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, norms


def _plugin(version=2, **kwargs):
    from accel.utils import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(fsdp_version=version, **kwargs)


def _train_on_ranks(version, plugin_kwargs, steps=3, max_norm=None, separate_prepare=False):
    from torch.distributed.tensor import DTensor

    from accel import Accelerator

    accelerator = Accelerator(fsdp_plugin=_plugin(version, **plugin_kwargs))
    rank = accelerator.process_index
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if separate_prepare:
        model = accelerator.prepare(model)
        optimizer = accelerator.prepare(optimizer)
    else:
        model, optimizer = accelerator.prepare(model, optimizer)
    in_optimizer = [p for g in optimizer.optimizer.param_groups for p in g["params"]]
    same_objects = {id(p) for p in in_optimizer} == {id(p) for p in model.parameters()}
    dtensors = all(isinstance(p, DTensor) for p in in_optimizer)
    norms = []
    for step in range(steps):
        x, y = _data(rank, step)
        accelerator.backward(F.mse_loss(model(x), y))
        if max_norm is not None:
            norms.append(float(accelerator.clip_grad_norm_(model.parameters(), max_norm)))
        optimizer.step()
        optimizer.zero_grad()
    state = accelerator.get_state_dict(model)
    return {"same_objects": same_objects, "dtensors": dtensors, "norms": norms, "state": state,
            "describe": accelerator.strategy.describe(), "unwrapped": type(accelerator.strategy.unwrap_model(model)).__name__}


def _close(actual, expected, what):
    assert actual.keys() == expected.keys(), what
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-4, atol=1e-5, msg=lambda m, k=key: f"{what} {k}: {m}")


def test_fsdp2_optimizer_steps_the_sharded_parameters_and_clips_over_shards():
    expected, norms = _reference(2, 3, max_norm=0.05)
    results = run_distributed(_train_on_ranks, 2, 2, {"auto_wrap_policy": "transformer_based_wrap",
                                                      "transformer_cls_names_to_wrap": ["Block"]}, 3, 0.05)
    for r in results:
        assert r["same_objects"] and r["dtensors"], "the optimizer must hold the model's DTensor parameters"
        # the clipping really applied (the reference norm is above 0.05) and used the norm of the full gradient
        assert min(norms) > 0.05
        torch.testing.assert_close(torch.tensor(r["norms"]), torch.tensor(norms), rtol=1e-4, atol=1e-6)
    assert "fsdp2" in results[0]["describe"] and results[0]["unwrapped"] == "FSDPNet"
    _close(results[0]["state"], expected, "fsdp2 clipped")
    assert results[1]["state"] == {}


def test_optimizer_prepared_after_its_model_is_switched_too():
    expected, _ = _reference(2, 2)
    results = run_distributed(_train_on_ranks, 2, 2, {}, 2, None, True)
    assert all(r["same_objects"] and r["dtensors"] for r in results)
    _close(results[0]["state"], expected, "separate prepare")


def test_fsdp1_flat_parameters_and_clipping():
    expected, norms = _reference(2, 3, max_norm=0.05)
    results = run_distributed(_train_on_ranks, 2, 1, {"auto_wrap_policy": "size_based_wrap", "min_num_params": 50}, 3, 0.05)
    assert results[0]["same_objects"] and "fsdp1" in results[0]["describe"] and results[0]["unwrapped"] == "Net"
    torch.testing.assert_close(torch.tensor(results[0]["norms"]), torch.tensor(norms), rtol=1e-4, atol=1e-6)
    _close(results[0]["state"], expected, "fsdp1")


def _features_on_ranks():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from accel import Accelerator
    from accel.state import AcceleratorState, GradientState

    out = {}
    # activation checkpointing + ignored modules (regex) + accumulation over 2 micro-batches
    accelerator = Accelerator(gradient_accumulation_steps=2, fsdp_plugin=_plugin(
        2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"],
        activation_checkpointing=True, activation_checkpointing_offload=True, ignored_modules="out"))
    rank = accelerator.process_index
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    out["checkpointed"] = sum(isinstance(m, CheckpointWrapper) for m in model.modules())
    out["offloaded"] = sum(type(m).__name__ == "OffloadWrapper" for m in model.modules())
    out["units"] = sum(isinstance(m, FSDPModule) for m in model.modules())
    out["ignored_plain"] = not isinstance(model.out.weight, DTensor) and isinstance(model.inp.weight, DTensor)
    for step in range(2):  # one optimizer step: the ignored module's rank-local update cannot feed back
        x, y = _data(rank, step, per_rank=2)
        with accelerator.accumulate(model):
            accelerator.backward(F.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    full = accelerator.get_state_dict(model)
    out["accumulated"] = {k: v for k, v in full.items() if not k.startswith("out.")}

    # cpu_ram_efficient_loading: only rank 0's weights count
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(fsdp_plugin=_plugin(2, cpu_ram_efficient_loading=True))
    model = accelerator.prepare(Net(seed=0 if rank == 0 else 5))
    out["loaded"] = accelerator.get_state_dict(model)

    # bf16: FSDP's policy computes in bf16, the sharded master weights stay fp32
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(mixed_precision="bf16", fsdp_plugin=_plugin(2))
    model = accelerator.prepare(Net())
    out["bf16_policy"] = accelerator.state.fsdp_plugin.mixed_precision_policy.param_dtype
    out["master_dtype"] = model.inp.weight.dtype
    out["bf16_out"] = model(torch.randn(2, 4)).dtype

    # fp16: a ShardedGradScaler, so every rank agrees on skipping a step
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(mixed_precision="fp16", fsdp_plugin=_plugin(2))
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    before = accelerator.get_state_dict(model)
    skipped = []
    for step in range(4):  # the first steps may overflow at the initial scale of 2**16 and are skipped
        x, y = _data(rank, step)
        accelerator.backward(F.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        skipped.append(optimizer.step_was_skipped)
    out["fp16_skipped"] = skipped
    out["fp16_scaler"] = type(accelerator.scaler).__name__
    after = accelerator.get_state_dict(model)  # a collective: every rank calls it
    out["fp16_moved"] = before != {} and any(not torch.equal(before[k], v) for k, v in after.items())
    return out


def test_checkpointing_ignored_modules_accumulation_rank0_loading_and_bf16():
    results = run_distributed(_features_on_ranks, 2)
    r0 = results[0]
    assert r0["checkpointed"] == 2 and r0["offloaded"] == 2 and r0["units"] == 3  # two Blocks wrapped in checkpointing and sharded, plus the root
    assert all(r["ignored_plain"] for r in results)
    # accumulation of 2 micro-batches of 2 samples per rank = one step on the 8 samples of both ranks' micro-batches
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in (0,):
        xs, ys = zip(*(_data(r, s, per_rank=2) for s in (step, step + 1) for r in range(2)))
        F.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        for p in model.out.parameters():  # the ignored module is not reduced across ranks: leave it out
            p.grad = None
        opt.step()
        opt.zero_grad()
    expected = {k: v for k, v in model.state_dict().items() if not k.startswith("out.")}
    _close(r0["accumulated"], expected, "accumulated")
    _close(r0["loaded"], Net(seed=0).state_dict(), "cpu_ram_efficient_loading")
    assert r0["bf16_policy"] == torch.bfloat16 and r0["master_dtype"] == torch.float32
    assert r0["bf16_out"] == torch.float32  # accel's forward hands back fp32 outputs, as for DDP
    assert r0["fp16_scaler"] == "ShardedGradScaler" and r0["fp16_moved"]
    assert results[0]["fp16_skipped"] == results[1]["fp16_skipped"]  # the ranks agree on every skip


class TPNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(4, 8)
        self.down = torch.nn.Linear(8, 1)
        self.tp_plan = {"up": "colwise", "down": "rowwise"}
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.empty_like(p).uniform_(-0.5, 0.5, generator=g))

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _tensor_parallel_on_ranks():
    from accel import Accelerator, ParallelismConfig

    accelerator = Accelerator(fsdp_plugin=_plugin(2), parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))
    model = TPNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    from torch.distributed.tensor import Shard

    placements = model.up.weight.placements[-1] == Shard(0)  # the tp dimension shards the column-parallel weight
    x, y = _data(0, 0)  # every rank the same batch: equal to one process on it
    accelerator.backward(F.mse_loss(model(x), y))
    optimizer.step()
    return accelerator.tensor_parallel_rank, placements, accelerator.get_state_dict(model)


def test_tensor_parallelism_with_the_models_plan_on_gloo():
    results = run_distributed(_tensor_parallel_on_ranks, 4)
    assert [r[0] for r in results] == [0, 1, 0, 1]
    assert all(r[1] for r in results)
    model = TPNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data(0, 0)
    F.mse_loss(model(x), y).backward()
    opt.step()
    expected = {k: v for k, v in model.state_dict().items()}
    _close(results[0][2], expected, "tensor parallel")


def _sync_control_and_bad_wrap_class():
    from accel import Accelerator

    accelerator = Accelerator(fsdp_plugin=_plugin(2, auto_wrap_policy="transformer_based_wrap",
                                                  transformer_cls_names_to_wrap=["DecoderLayer"]))
    try:
        accelerator.prepare(Net())
        message = None
    except ValueError as exc:
        message = str(exc)
    accelerator.state.fsdp_plugin.transformer_cls_names_to_wrap = ["Block"]
    model = accelerator.prepare(Net())
    rank = accelerator.process_index
    grads = []
    with accelerator.no_sync(model):
        accelerator.backward(F.mse_loss(model(*_data(rank, 0)[:1]), _data(rank, 0)[1]))
        grads.append(model.inp.weight.grad is None)  # gradients stay unreduced, outside the shards
        with accelerator.trigger_sync_in_backward(model):
            accelerator.backward(F.mse_loss(model(*_data(rank, 1)[:1]), _data(rank, 1)[1]))
        grads.append(model.inp.weight.grad is not None)  # this backward reduced into the shards
    return message, grads


def test_sync_control_and_a_wrap_policy_naming_a_class_not_in_the_model():
    results = run_distributed(_sync_control_and_bad_wrap_class, 2)
    message, grads = results[0]
    assert "Could not find the transformer layer class DecoderLayer in the model" in message and "Block" in message
    assert all(r[1] == [True, True] for r in results)


def test_a_backend_without_collectives_is_refused():
    from types import SimpleNamespace

    from accel.backends import UnsupportedFeatureError
    from accel.backends.mps import MPSBackend
    from accel.strategies import StrategyContext
    from accel.strategies.fsdp import FSDPStrategy

    # the strategy reads the backend from the state it is handed (it keeps no reference to an Accelerator)
    state = SimpleNamespace(hardware_backend=MPSBackend(), device=torch.device("cpu"), fsdp_plugin=None)
    with pytest.raises(UnsupportedFeatureError, match="FSDP.*collective"):
        FSDPStrategy(StrategyContext(state=state, gradient_state=None, precision=None))


def test_switching_an_optimizer_names_a_parameter_without_a_shard():
    from accel.utils import fsdp2_switch_optimizer_parameters

    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    new_a = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([a, b], lr=0.1)
    with pytest.raises(KeyError, match=r"shape \(3,\)"):
        fsdp2_switch_optimizer_parameters(opt, {a: new_a})
    opt = torch.optim.SGD([a], lr=0.1, momentum=0.9)
    a.grad = torch.ones(2)
    opt.step()
    fsdp2_switch_optimizer_parameters(opt, {id(a): new_a})
    assert opt.param_groups[0]["params"] == [new_a] and new_a in opt.state


def test_canonical_names_drop_wrapper_prefixes():
    from accel.utils import fsdp2_canonicalize_names

    names = fsdp2_canonicalize_names({"_orig_mod.a._checkpoint_wrapped_module.w": 1, "b._fsdp_wrapped_module.c": 2})
    assert names == {"a.w": 1, "b.c": 2}
    assert copy.copy(names) == names
