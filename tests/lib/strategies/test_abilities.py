"""Abilities the Accelerator asks of its strategy instead of branching on the distributed type: whether LOMO's
fused backward may replace the strategy's backward, and whether the run shards with FSDP2 (one rule, which the
strategy, the resolved plan, the state, the Accelerator and the ParallelismConfig check all give alike)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from accel import Accelerator
from accel.resolve import strategy_class
from accel.state import AcceleratorState, GradientState
from accel.utils import DistributedType, FullyShardedDataParallelPlugin, ParallelismConfig


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    for name in ("ACCELERATE_USE_FSDP", "ACCEL_USE_FSDP", "ACCELERATE_USE_DEEPSPEED", "ACCEL_USE_DEEPSPEED"):
        monkeypatch.delenv(name, raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    import torch.distributed as dist

    if dist.is_initialized():  # the one-process group FSDP needed; later tests must not inherit it
        dist.destroy_process_group()


def test_only_deepspeed_refuses_lomos_fused_backward():
    answers = {name: strategy_class(name).supports_lomo for name in ("single", "ddp", "fsdp", "deepspeed")}
    assert answers == {"single": True, "ddp": True, "fsdp": True, "deepspeed": False}



def test_backward_asks_the_strategy_before_running_lomo(fake_lomo, monkeypatch):
    module, calls = fake_lomo
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    model, _ = accelerator.prepare(model, module.Lomo(model.parameters(), lr=0.1))
    accelerator.backward(model(torch.ones(3, 2)).sum(), learning_rate=0.05)
    assert calls == [0.05]
    # a strategy that owns backward (as DeepSpeed's engine does) gets the loss and the learning rate itself
    seen = []
    monkeypatch.setattr(accelerator.strategy, "supports_lomo", False)
    monkeypatch.setattr(accelerator.strategy, "backward", lambda loss, **kwargs: seen.append(kwargs))
    accelerator.backward(model(torch.ones(3, 2)).sum(), learning_rate=0.01)
    assert calls == [0.05] and seen == [{"learning_rate": 0.01}]


def test_the_fsdp2_rule_belongs_to_the_fsdp_strategy():
    v1, v2 = FullyShardedDataParallelPlugin(fsdp_version=1), FullyShardedDataParallelPlugin(fsdp_version=2)
    fsdp = strategy_class("fsdp")
    assert (fsdp.shards_with_fsdp2(v2), fsdp.shards_with_fsdp2(v1), fsdp.shards_with_fsdp2(None)) == (True, False, False)
    # a plugin lying around does not make another strategy shard with FSDP2
    assert not any(strategy_class(name).shards_with_fsdp2(v2) for name in ("single", "ddp", "deepspeed"))


@pytest.mark.parametrize("version", [None, 1, 2])
def test_every_is_fsdp2_gives_the_strategys_answer(version):
    plugin = None if version is None else FullyShardedDataParallelPlugin(fsdp_version=version)
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    state = accelerator.state
    answers = {accelerator.strategy.is_fsdp2, state.run_plan.is_fsdp2, state.is_fsdp2, accelerator.is_fsdp2,
               accelerator.is_composable_parallelism_enabled}
    assert answers == {version == 2}
    assert accelerator.distributed_type == (DistributedType.NO if version is None else DistributedType.FSDP)


@pytest.mark.parametrize("is_fsdp2", [True, False])
def test_the_parallelism_check_takes_the_given_fsdp2_answer(is_fsdp2):
    # two ranks replicated, no dimension to shard: refused only when the strategy says it shards with FSDP2
    config = ParallelismConfig(dp_replicate_size=2)
    run = SimpleNamespace(state=SimpleNamespace(distributed_type=DistributedType.MULTI_CPU), num_processes=2,
                          is_main_process=True, is_fsdp2=is_fsdp2)
    if is_fsdp2:
        with pytest.raises(ValueError, match="no dimension for FSDP to shard"):
            config._validate_accelerator(run)
    else:
        config._validate_accelerator(run)
