"""set_seed, RNG synchronisation across real ranks, and the is_*_available helpers."""

import random

import numpy as np
import pytest
import torch

from accel import utils
from accel.state import PartialState
from dist_utils import run_distributed


def _draw():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_set_seed_reproduces_python_numpy_torch():
    utils.set_seed(1234)
    first = _draw()
    utils.set_seed(1234)
    assert _draw() == first
    utils.set_seed(1235)
    assert _draw() != first


def test_set_seed_rejects_non_int():
    with pytest.raises(TypeError, match="int seed"):
        utils.set_seed("42")


def test_deterministic_flag(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda flag: calls.append(flag))
    utils.set_seed(0, deterministic=True)
    assert calls == [True]


def test_generator_rng_type_needs_generator():
    PartialState()
    with pytest.raises(ValueError, match="needs the generator"):
        utils.synchronize_rng_state("generator")


def test_foreign_device_rng_type_warns():
    PartialState()
    with pytest.warns(UserWarning, match="does not belong to the active backend"):
        utils.synchronize_rng_states(["xpu"])


def _seed_and_sync():
    state = PartialState()
    utils.set_seed(100, device_specific=True)
    before = float(torch.rand(1))
    gen = torch.Generator().manual_seed(state.process_index)
    utils.set_seed(100 + state.process_index)
    utils.synchronize_rng_states(["torch", "generator"], generator=gen)
    return before, float(torch.rand(1)), float(torch.rand(1, generator=gen))


@pytest.mark.parametrize("world_size", [2, 4])
def test_rng_sync_across_ranks(world_size):
    results = run_distributed(_seed_and_sync, world_size)
    device_specific = [r[0] for r in results]
    assert len(set(device_specific)) == world_size  # each rank seeded differently
    assert len({r[1] for r in results}) == 1  # torch RNG copied from rank 0
    assert len({r[2] for r in results}) == 1  # generator copied from rank 0
    utils.set_seed(100)
    assert float(torch.rand(1)) == device_specific[0]


def test_device_availability_helpers_follow_the_registry():
    from accel.backends import get_registry

    reg = get_registry()
    assert utils.is_cuda_available() == reg.get("cuda").is_available()
    assert utils.is_xpu_available() == reg.get("xpu").is_available()
    assert utils.is_npu_available() is False  # no such backend registered here
    assert utils.is_bf16_available() == bool(reg.select().supports_bf16)


def test_version_helpers():
    assert utils.is_torch_version(">=", "2.4")
    assert not utils.is_torch_version("<", "2.0")
    assert utils.compare_versions("numpy", ">=", "1.0")
    with pytest.raises(ValueError, match="operation must be one of"):
        utils.compare_versions("2.1", "=>", "2.0")


def test_package_probes():
    assert utils.is_numpy_available() and utils.is_pytest_available()
    assert utils.is_deepspeed_available() == (__import__("importlib").util.find_spec("deepspeed") is not None)


def test_plugin_rng_type_names_are_accepted():
    """A plug-in backend's device RNG is named by its device type, which RNGType does not list."""
    PartialState()
    with pytest.warns(UserWarning, match="'privateuseone' does not belong"):
        utils.synchronize_rng_state("privateuseone")
