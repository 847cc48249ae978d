"""fp8 (torchao) with FSDP: Accelerate's refusal of rank-0 loading, and the fp8 scale hook on the optimizer.

Training under FSDP2 at 2 ranks (real and emulated fp8, with and without the float8 all-gather) is shown by
``suites/test_fp8_training.py``; these tests check the pieces that need no second rank.
"""

from __future__ import annotations

import pytest
import torch

from accel import Accelerator
from accel.state import AcceleratorState, GradientState

pytest.importorskip("torchao", reason="fp8 training runs through torchao (pip install torchao)")


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    # a plugin records cpu_ram_efficient_loading in the environment (as Accelerate's does); each test starts clean
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    import torch.distributed as dist

    if dist.is_initialized():  # the one-process group FSDP needed; forked ranks of later tests must not inherit it
        dist.destroy_process_group()


def test_cpu_ram_efficient_loading_is_refused_in_accelerates_words():
    from accel.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=True)
    with pytest.raises(ValueError) as caught:
        Accelerator(cpu=True, mixed_precision="fp8", fsdp_plugin=plugin)
    assert str(caught.value) == ("torchao with FSDP2 and cpu_ram_efficient_loading is not supported, setting "
                                 "`cpu_ram_efficient_loading` to False will fix the issue and work as intended.")


def test_cpu_ram_efficient_loading_without_fp8_is_accepted():
    from accel.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=True)
    assert Accelerator(cpu=True, mixed_precision="bf16", fsdp_plugin=plugin).distributed_type == "FSDP"


def test_scale_precompute_hook_runs_after_each_step(monkeypatch):
    import torchao.float8

    from accel.utils.ao import register_fsdp_float8_scale_precompute

    seen = []
    monkeypatch.setattr(torchao.float8, "precompute_float8_dynamic_scale_for_fsdp", seen.append)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = register_fsdp_float8_scale_precompute(optimizer, model)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    optimizer.step()
    assert seen == [model, model]
    handle.remove()
    optimizer.step()
    assert len(seen) == 2


def test_one_process_fsdp2_converts_before_sharding():
    """Float8Linear layers are in the model before fully_shard: their weights are the DTensor shards FSDP2 owns."""
    from torch.distributed.tensor import DTensor
    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    from accel.utils import FullyShardedDataParallelPlugin

    accelerator = Accelerator(cpu=True, mixed_precision="fp8", fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert [type(m) for m in model] == [torch.nn.Linear, Float8Linear, torch.nn.Linear]
    weight = model[1].weight
    assert isinstance(weight, DTensor) and isinstance(weight._local_tensor, WeightWithDynamicFloat8CastTensor)
    assert any(p is weight for g in optimizer.param_groups for p in g["params"])  # the optimizer steps the shard
    assert len(optimizer.optimizer._optimizer_step_post_hooks) == 1
    before = weight.detach().to_local().clone()
    accelerator.backward(model(torch.randn(8, 16)).pow(2).mean())
    optimizer.step()
    assert not torch.equal(before, weight.detach().to_local())
    assert hasattr(weight._local_tensor, "_precomputed_scale")
