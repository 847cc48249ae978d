"""Data loaders prepared for N ranks: every sample reaches exactly one rank (plus the documented
repeats that even out the last step), on the rank's device, with correct end-of-loader flags.

The reference is the single-process data: samples are numbered, so the rank-order concatenation
of every step's batches, cut to the dataset length, must be the dataset itself (sequential
sampler) or a permutation of it (shuffled).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from _suite_utils import per_rank
from accel import Accelerator
from accel.data_loader import SeedableRandomSampler, prepare_data_loader, skip_first_batches
from accel.state import GradientState, PartialState
from accel.utils.dataclasses import DataLoaderConfiguration
from accel.utils.random import set_seed

WORLD_SIZES = (1, 2, 4)
WHOLE_BATCH = 3  # per process, without split_batches
SPLIT_BATCH = 4  # the global batch with split_batches: divisible by every world size above
SIZES = (24, 10, 2)  # even for every world size, uneven, smaller than one global step


def _item(i: int) -> dict:
    return {"idx": i, "x": torch.tensor([float(i), -float(i)])}


class Numbered(Dataset):
    """Map-style: sample i is {"idx": i, "x": [i, -i]}."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return _item(i)


class NumberedStream(IterableDataset):
    """Iterable: yields samples 0..n-1 in order (sized, so the repeats at the end can be counted)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return (_item(i) for i in range(self.n))


def _loader(n: int, iterable: bool, split: bool, shuffle: bool = False) -> DataLoader:
    dataset = NumberedStream(n) if iterable else Numbered(n)
    return DataLoader(dataset, batch_size=SPLIT_BATCH if split else WHOLE_BATCH, shuffle=shuffle)


def _epoch(loader, device: torch.device) -> list[list[int]]:
    """This rank's batches as lists of sample numbers; checks placement and end-of-loader flags."""
    batches, ends = [], []
    for batch in loader:
        assert batch["idx"].device == device and batch["x"].device == device, (batch["idx"].device, device)
        assert torch.equal(batch["x"][:, 0], batch["idx"].to(batch["x"].dtype)), "columns of one sample got separated"
        ends.append((GradientState().end_of_dataloader, loader.end_of_dataloader))
        batches.append(batch["idx"].tolist())
    if ends:
        assert ends[-1] == (True, True), "end_of_dataloader is not set on the last batch"
        assert all(e == (False, False) for e in ends[:-1]), f"end_of_dataloader set before the last batch: {ends}"
    assert not GradientState().in_dataloader, "the loader is still registered after its iteration"
    return batches


def _rank_order(everyone: list[list[list[int]]]) -> list[int]:
    """Step by step, the ranks' batches in rank order (what ``gather`` returns per step)."""
    steps = {len(b) for b in everyone}
    assert len(steps) == 1, f"ranks got different numbers of batches: {[len(b) for b in everyone]}"
    return [i for s in range(steps.pop()) for batches in everyone for i in batches[s]]


def _check_even(everyone: list[list[list[int]]], n: int, global_batch: int, expected_order: list[int] | None = None) -> None:
    order = _rank_order(everyone)
    expected = list(range(n)) if expected_order is None else expected_order
    assert order[:n] == expected, f"data seen by the ranks, in rank order: {order}; expected {expected} first"
    repeats = order[n:]
    assert len(repeats) < max(global_batch, 1) or n == 0, f"too many repeated samples: {repeats}"
    assert set(repeats) <= set(range(n)), f"repeats that are not samples: {repeats}"
    if n % global_batch == 0 and n >= global_batch:
        assert not repeats, f"samples repeated although the data divides evenly: {repeats}"


def _check_uneven(everyone: list[list[list[int]]], n: int) -> None:
    seen = Counter(i for batches in everyone for batch in batches for i in batch)
    assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}, f"even_batches=False must not repeat: {seen}"


MAP_CASES = [
    pytest.param("shard", False, True, id="shard"),
    pytest.param("shard", False, False, id="shard-uneven"),
    pytest.param("shard", True, True, id="shard-split"),
    pytest.param("shard", True, False, id="shard-split-uneven"),
    pytest.param("dispatch", False, True, id="dispatch"),
    pytest.param("dispatch", True, True, id="dispatch-split"),
]


@pytest.mark.world_size(*WORLD_SIZES)
@pytest.mark.parametrize("mode, split, even", MAP_CASES)
def test_map_style_prepare_data_loader(device, rank, world_size, mode, split, even):
    for n in SIZES:
        prepared = prepare_data_loader(
            _loader(n, iterable=False, split=split), device=device, put_on_device=True,
            split_batches=split, even_batches=even, dispatch_batches=(mode == "dispatch"),
        )
        global_batch = SPLIT_BATCH if split else WHOLE_BATCH * world_size
        mine = _epoch(prepared, device)
        everyone = per_rank(mine)
        if even:
            _check_even(everyone, n, global_batch)
            assert len(prepared) == len(mine), f"len(loader) = {len(prepared)} but it yielded {len(mine)} batches"
        else:
            _check_uneven(everyone, n)
        # a second epoch yields the same (sequential sampler)
        assert _epoch(prepared, device) == mine


ITERABLE_CASES = [
    pytest.param("shard", False, id="shard"),
    pytest.param("shard", True, id="shard-split"),
    pytest.param("dispatch", False, id="dispatch"),
    pytest.param("dispatch", True, id="dispatch-split"),
]


@pytest.mark.world_size(*WORLD_SIZES)
@pytest.mark.parametrize("mode, split", ITERABLE_CASES)
def test_iterable_prepare_data_loader(device, rank, world_size, mode, split):
    for n in SIZES:
        prepared = prepare_data_loader(
            _loader(n, iterable=True, split=split), device=device, put_on_device=True,
            split_batches=split, dispatch_batches=(mode == "dispatch"),
        )
        global_batch = SPLIT_BATCH if split else WHOLE_BATCH * world_size
        mine = _epoch(prepared, device)
        _check_even(per_rank(mine), n, global_batch)
        assert len(prepared) == len(mine), f"len(loader) = {len(prepared)} but it yielded {len(mine)} batches"


ACCELERATOR_CASES = [
    pytest.param(False, False, False, id="shard"),
    pytest.param(False, True, False, id="shard-split"),
    pytest.param(True, False, False, id="dispatch"),
    pytest.param(False, False, True, id="iterable"),
    pytest.param(True, True, True, id="iterable-dispatch-split"),
]


@pytest.mark.world_size(*WORLD_SIZES)
@pytest.mark.parametrize("dispatch, split, iterable", ACCELERATOR_CASES)
def test_accelerator_prepare_and_gather_for_metrics(device, rank, world_size, dispatch, split, iterable):
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=split, dispatch_batches=dispatch))
    assert accelerator.device == device
    shuffles = (False,) if iterable else (False, True)
    for shuffle in shuffles:
        for n in SIZES:
            prepared = accelerator.prepare(_loader(n, iterable=iterable, split=split, shuffle=shuffle))
            collected: list[int] = []
            for batch in prepared:
                assert batch["idx"].device == device
                collected.extend(accelerator.gather_for_metrics(batch["idx"]).tolist())
            # the repeats that evened out the last step are dropped again
            if shuffle:
                assert sorted(collected) == list(range(n)), collected
            else:
                assert collected == list(range(n)), collected
            assert per_rank(collected) == [collected] * world_size, "ranks gathered different data"


SKIP_CASES = [
    pytest.param(False, False, False, id="shard"),
    pytest.param(False, True, False, id="shard-split"),
    pytest.param(True, False, False, id="dispatch"),
    pytest.param(True, True, False, id="dispatch-split"),
    pytest.param(False, False, True, id="iterable"),
    pytest.param(True, False, True, id="iterable-dispatch"),
]


@pytest.mark.world_size(*WORLD_SIZES)
@pytest.mark.parametrize("dispatch, split, iterable", SKIP_CASES)
def test_skip_first_batches_resumes_exactly(device, rank, world_size, dispatch, split, iterable):
    n = 26
    prepared = prepare_data_loader(
        _loader(n, iterable=iterable, split=split), device=device, put_on_device=True,
        split_batches=split, dispatch_batches=dispatch,
    )
    resumed_two = skip_first_batches(prepared, 2)  # made before the epoch runs: same epoch
    resumed_one = Accelerator().skip_first_batches(prepared, num_batches=1)
    full = _epoch(prepared, device)
    assert len(full) >= 3
    assert _epoch(resumed_two, device) == full[2:]
    assert _epoch(resumed_one, device) == full[1:]
    # resuming from a checkpoint taken after the last step: nothing is left of the epoch
    nothing_left = skip_first_batches(prepared, len(full))
    assert list(nothing_left) == []  # a dispatcher's partial last step must not make a length < 0


@pytest.mark.world_size(*WORLD_SIZES)
def test_skip_first_batches_with_shuffling(device, rank, world_size):
    set_seed(7)
    prepared = prepare_data_loader(
        _loader(20, iterable=False, split=False, shuffle=True), device=device, put_on_device=True,
        use_seedable_sampler=True,
    )
    resumed = skip_first_batches(prepared, 1)
    full = _epoch(prepared, device)
    assert _epoch(resumed, device) == full[1:]
    order = _rank_order(per_rank(full))
    assert sorted(order[:20]) == list(range(20)) and order[:20] != list(range(20))


@pytest.mark.world_size(*WORLD_SIZES)
def test_seedable_random_sampler_agrees_across_ranks(device, rank, world_size):
    set_seed(1234)  # every rank: same initial seed, whatever the start method
    sampler = SeedableRandomSampler(data_source=list(range(16)))
    epoch0 = list(sampler)
    epoch1 = list(sampler)  # the epoch advances after a full pass
    assert sorted(epoch0) == sorted(epoch1) == list(range(16))
    assert epoch0 != epoch1, "the order did not change with the epoch"
    assert per_rank(epoch0) == [epoch0] * world_size, "ranks shuffled differently"
    assert per_rank(epoch1) == [epoch1] * world_size
    sampler.set_epoch(0)
    assert list(sampler) == epoch0  # an epoch's order can be rebuilt
    sampler.set_epoch(5)
    epoch5 = list(sampler)
    assert epoch5 != epoch0 and per_rank(epoch5) == [epoch5] * world_size

    # an explicit data_seed wins over the per-rank torch seed
    set_seed(99, device_specific=True)
    seeded = SeedableRandomSampler(data_source=list(range(16)), data_seed=3)
    first = list(seeded)
    assert per_rank(first) == [first] * world_size

    # through prepare_data_loader: the ranks' shards of one permutation cover the data once
    set_seed(1234)
    prepared = prepare_data_loader(
        _loader(12, iterable=False, split=False, shuffle=True), device=device, put_on_device=True,
        use_seedable_sampler=True,
    )
    orders = []
    for epoch in (0, 1):
        prepared.set_epoch(epoch)
        order = _rank_order(per_rank(_epoch(prepared, device)))
        assert sorted(order[:12]) == list(range(12)), order
        orders.append(order)
    assert orders[0] != orders[1], "set_epoch did not give a new order"
    prepared.set_epoch(0)
    assert _rank_order(per_rank(_epoch(prepared, device))) == orders[0]
    assert PartialState().num_processes == world_size
