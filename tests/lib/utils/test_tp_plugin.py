"""The deprecated ``torch_tp_plugin``, as Accelerate 1.15 handles it: a FutureWarning in Accelerate's words, the plugin
kept on the state, and ``ParallelismConfig(tp_size=plugin.tp_size)`` used when no ``parallelism_config`` is given."""

from __future__ import annotations

import warnings

import pytest
import torch

from accel import Accelerator
from accel.parallelism_config import ParallelismConfig
from accel.state import AcceleratorState
from accel.utils import TorchTensorParallelPlugin

from dist_utils import run_distributed

DEPRECATION = ("`TorchTensorParallelPlugin` is deprecated and will be removed in a future version of Accelerate. "
               "Please use the `ParallelismConfig` with `tp_size` instead.")


def _build(**kwargs) -> tuple[Accelerator, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = Accelerator(**kwargs)
    return accelerator, [w for w in caught if issubclass(w.category, FutureWarning)]


def test_tp_size_one_on_one_process_maps_to_a_parallelism_config_and_trains():
    plugin = TorchTensorParallelPlugin(tp_size=1)
    accelerator, future = _build(cpu=True, torch_tp_plugin=plugin)
    assert [str(w.message) for w in future] == [DEPRECATION]
    assert future[0].filename == __file__  # pointed at the caller that passed the plugin
    assert AcceleratorState().torch_tp_plugin is plugin
    config = accelerator.parallelism_config
    assert isinstance(config, ParallelismConfig) and config.tp_size == 1 and not config.tp_enabled
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    before = model.weight.detach().clone()
    accelerator.backward(model(torch.ones(2, 4)).sum())
    optimizer.step()
    assert not torch.equal(before, model.weight.detach())


def test_a_given_parallelism_config_wins_over_the_plugin():
    config = ParallelismConfig(tp_size=1)
    accelerator, future = _build(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=1), parallelism_config=config)
    assert len(future) == 1
    assert accelerator.parallelism_config is config


def test_without_the_plugin_nothing_is_warned_and_the_state_holds_none():
    accelerator, future = _build(cpu=True)
    assert not [w for w in future if "TorchTensorParallelPlugin" in str(w.message)]
    assert accelerator.state.torch_tp_plugin is None and accelerator.parallelism_config is None


@pytest.mark.parametrize("tp_size", [0, -1, "2", None, True])
def test_a_bad_tp_size_is_named(tp_size):
    with pytest.raises(ValueError, match=f"tp_size must be a positive integer, got {tp_size!r}"):
        Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=tp_size))


def test_tp_size_larger_than_the_world_is_refused():
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match=r"total_size \(2\) does not match num_processes \(1\)"):
        Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=2))


def test_accelerate_maps_the_plugin_the_same_way():
    reference = pytest.importorskip("accelerate", reason="the installed Accelerate is the reference")
    from accelerate.state import AcceleratorState as TheirState
    from accelerate.utils import TorchTensorParallelPlugin as TheirPlugin

    TheirState._reset_state(reset_partial_state=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            theirs = reference.Accelerator(cpu=True, torch_tp_plugin=TheirPlugin(tp_size=1))
        assert DEPRECATION in [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
        assert theirs.parallelism_config.tp_size == 1
    finally:
        TheirState._reset_state(reset_partial_state=True)


def _two_ranks() -> tuple[int, list[str], tuple[int, ...], bool]:
    accelerator, future = _build(torch_tp_plugin=TorchTensorParallelPlugin(tp_size=2))
    mesh = accelerator.torch_device_mesh
    return (accelerator.parallelism_config.tp_size, list(mesh.mesh_dim_names), tuple(mesh.shape),
            [str(w.message) for w in future] == [DEPRECATION])


def test_tp_size_two_on_two_ranks_builds_the_tp_mesh():
    for tp_size, names, shape, warned in run_distributed(_two_ranks, 2):
        assert tp_size == 2 and names == ["tp"] and shape == (2,) and warned
