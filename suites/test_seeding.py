"""Seeding on the backend: set_seed reproduces python, numpy, torch and device draws; device-specific
seeds differ across ranks; synchronize_rng_states makes every rank draw what the main process draws.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from _suite_utils import per_rank
from accel.utils.random import set_seed, synchronize_rng_state, synchronize_rng_states


def _draws(device: torch.device) -> tuple:
    """One draw from each generator set_seed is responsible for (device draws as host numbers)."""
    return (
        random.random(),
        np.random.rand(3).tolist(),
        torch.rand(3).tolist(),
        torch.rand(3, device=device).cpu().tolist(),
        torch.randint(0, 1000, (4,), device=device).cpu().tolist(),
    )


@pytest.mark.world_size(1, 2, 4)
def test_set_seed_reproduces_draws_on_device(backend, device, rank, world_size):
    set_seed(2024)
    first = _draws(device)
    set_seed(2024)
    assert _draws(device) == first, "set_seed did not reproduce the draws"
    set_seed(2025)
    other = _draws(device)
    for name, a, b in zip(("python", "numpy", "torch", "device", "device randint"), first, other):
        assert a != b, f"{name} draws did not change with the seed"
    # the same seed on every rank: the same numbers everywhere
    set_seed(2024)
    assert per_rank(_draws(device)) == [first] * world_size

    # the device generator itself follows the seed (not only the host one)
    set_seed(11)
    device_state = backend.get_rng_state()
    drawn = torch.rand(5, device=device)
    backend.set_rng_state(device_state)
    assert torch.equal(drawn, torch.rand(5, device=device))
    set_seed(11)
    assert torch.equal(drawn, torch.rand(5, device=device))

    with pytest.raises(TypeError):
        set_seed(1.5)


@pytest.mark.world_size(1, 2, 4)
def test_device_specific_seeds_differ_across_ranks(device, rank, world_size):
    set_seed(500, device_specific=True)
    mine = _draws(device)
    set_seed(500 + rank)  # device_specific adds the process index
    assert _draws(device) == mine
    everyone = per_rank(mine)
    for r in range(world_size):
        for other in range(r + 1, world_size):
            for name, a, b in zip(("python", "numpy", "torch", "device", "device randint"), everyone[r], everyone[other]):
                assert a != b, f"ranks {r} and {other} drew the same {name} numbers with device_specific=True"


@pytest.mark.world_size(2, 4)
def test_synchronize_rng_states_makes_ranks_agree(backend, device, rank, world_size):
    set_seed(900, device_specific=True)  # every rank starts from a different state
    generator = torch.Generator(device="cpu")
    generator.manual_seed(77 + rank)
    before = (torch.rand(3).tolist(), torch.rand(3, device=device).cpu().tolist(), torch.rand(3, generator=generator).tolist())
    assert len({repr(b) for b in per_rank(before)}) == world_size, "the ranks did not start from different states"

    rng_types = ["torch", "generator"]
    if backend.device_type != "cpu":
        rng_types.insert(1, backend.device_type)
    synchronize_rng_states(rng_types, generator=generator)
    after = (torch.rand(3).tolist(), torch.rand(3, device=device).cpu().tolist(), torch.rand(3, generator=generator).tolist())
    everyone = per_rank(after)
    assert everyone == [everyone[0]] * world_size, f"draws still differ after synchronize_rng_states({rng_types})"

    # synchronising copies the main process's state: rank 0's draws are what it would have drawn anyway
    set_seed(31, device_specific=True)
    expected_main = torch.rand(2).tolist() if rank == 0 else None
    set_seed(31, device_specific=True)
    synchronize_rng_state("torch")
    drawn = torch.rand(2).tolist()
    assert per_rank(drawn) == [per_rank(expected_main)[0]] * world_size

    with pytest.raises(ValueError):
        synchronize_rng_state("generator")  # a generator must be given
