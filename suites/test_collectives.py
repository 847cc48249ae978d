"""accel.utils.operations on the backend's device, at world sizes 1, 2 and 4.

Every rank builds its input from its rank index, runs the collective, and compares the result with
the value it computes locally for all ranks. On one process the operations are identities (or a
copy, for ``reduce`` and ``copy_tensor_to_devices``), as in Accelerate.
"""

from __future__ import annotations

import os
from collections import namedtuple

import pytest
import torch

from _suite_utils import to_host_list
from accel.state import AcceleratorState, PartialState
from accel.utils.operations import (
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    concatenate,
    copy_tensor_to_devices,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
    send_to_device,
)

WORLD_SIZES = (1, 2, 4)
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16", marks=pytest.mark.require_fp16),
    pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.require_bf16),
    pytest.param(torch.int64, id="int64"),
]
Pair = namedtuple("Pair", ["left", "right"])


def _values(tensor: torch.Tensor) -> list:
    return to_host_list(tensor)


@pytest.mark.world_size(*WORLD_SIZES)
def test_gather_and_gather_object(device, rank, world_size):
    local = torch.tensor([10 * rank, 10 * rank + 1, 10 * rank + 2], device=device)
    gathered = gather(local)
    assert gathered.device == device and gathered.dtype == local.dtype
    assert _values(gathered) == [10 * r + i for r in range(world_size) for i in range(3)]

    matrix = torch.arange(6, device=device, dtype=torch.float32).reshape(2, 3) + 100 * rank
    gathered = gather(matrix)
    assert gathered.shape == (2 * world_size, 3)
    for r in range(world_size):
        assert _values(gathered[2 * r:2 * r + 2]) == _values(torch.arange(6.0).reshape(2, 3) + 100 * r)

    transposed = matrix.t()  # not contiguous
    gathered = gather(transposed)
    assert gathered.shape == (3 * world_size, 2)
    assert _values(gathered[3 * rank:3 * rank + 3]) == _values(transposed)

    scalar = torch.tensor(float(rank), device=device)
    gathered = gather(scalar)
    if world_size == 1:
        assert gathered is scalar  # one process: the input as it is
    else:
        assert gathered.shape == (world_size,) and _values(gathered) == [float(r) for r in range(world_size)]

    nested = {"a": torch.full((1,), rank, device=device), "b": [torch.full((2,), 2 * rank, device=device)]}
    gathered = gather(nested)
    assert set(gathered) == {"a", "b"} and isinstance(gathered["b"], list)
    assert _values(gathered["a"]) == list(range(world_size))
    assert _values(gathered["b"][0]) == [2 * r for r in range(world_size) for _ in range(2)]

    objects = gather_object([rank, f"r{rank}"])
    assert objects == [x for r in range(world_size) for x in (r, f"r{r}")]
    single = gather_object({"rank": rank})
    if world_size == 1:
        assert single == {"rank": 0}
    else:
        assert single == [{"rank": r} for r in range(world_size)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_broadcast_and_broadcast_object_list(device, rank, world_size):
    for source in sorted({0, world_size - 1}):
        tensor = torch.full((2, 2), float(rank), device=device)
        result = broadcast(tensor, from_process=source)
        assert result is tensor  # in place
        assert _values(tensor) == [[float(source)] * 2] * 2

        nested = {"x": torch.full((3,), rank, device=device), "y": (torch.full((1,), -rank, device=device),)}
        result = broadcast(nested, from_process=source)
        assert _values(result["x"]) == [source] * 3 and isinstance(result["y"], tuple)
        assert _values(result["y"][0]) == [-source]

        base = torch.arange(6, device=device, dtype=torch.float32).reshape(2, 3) * (rank + 1)
        broadcast(base.t(), from_process=source)  # a non-contiguous view is still written in place
        assert _values(base) == _values(torch.arange(6.0).reshape(2, 3) * (source + 1))

        objects = [rank, {"from": rank}, "x" * (rank + 1)]
        result = broadcast_object_list(objects, from_process=source)
        assert result is objects
        assert objects == [source, {"from": source}, "x" * (source + 1)]

    with pytest.raises(ValueError):
        broadcast(torch.zeros(1, device=device), from_process=world_size)


@pytest.mark.world_size(*WORLD_SIZES)
def test_reduce(device, rank, world_size):
    local = torch.tensor([rank + 1.0, 2.0 * (rank + 1)], device=device)
    before = _values(local)
    total = world_size * (world_size + 1) / 2
    cases = {
        ("sum", 1.0): [total, 2 * total],
        ("mean", 1.0): [total / world_size, 2 * total / world_size],
        ("sum", 0.5): [total / 2, total],
        ("mean", 2.0): [2 * total / world_size, 4 * total / world_size],
        ("none", 1.0): [total, 2 * total],
        ("max", 1.0): [float(world_size), 2.0 * world_size],
        ("min", 1.0): [1.0, 2.0],
    }
    for (reduction, scale), expected in cases.items():
        result = reduce(local, reduction=reduction, scale=scale)
        assert result is not local and result.device == device
        assert _values(result) == pytest.approx(expected), (reduction, scale)
        assert _values(local) == before, f"reduce({reduction!r}) changed its input"

    integers = torch.tensor([rank, 1], device=device, dtype=torch.int64)
    summed = reduce(integers, reduction="sum")
    assert summed.dtype == torch.int64 and _values(summed) == [sum(range(world_size)), world_size]
    mean = reduce(integers, reduction="mean")
    if world_size > 1:  # an integer mean is not truncated (one process returns an integer copy)
        assert mean.is_floating_point()
    assert _values(mean) == pytest.approx([sum(range(world_size)) / world_size, 1.0])

    nested = reduce({"a": local, "b": [local * 2]}, reduction="sum")
    assert _values(nested["a"]) == pytest.approx([total, 2 * total])
    assert _values(nested["b"][0]) == pytest.approx([2 * total, 4 * total])
    with pytest.raises(ValueError):
        reduce(local, reduction="median")


@pytest.mark.world_size(*WORLD_SIZES)
def test_pad_across_processes(device, rank, world_size):
    rows = torch.full((rank + 1, 2), rank + 1, device=device)
    padded = pad_across_processes(rows, dim=0, pad_index=-1)
    assert padded.shape == (world_size, 2) and padded.device == device
    assert _values(padded) == [[rank + 1] * 2] * (rank + 1) + [[-1] * 2] * (world_size - rank - 1)
    padded_first = pad_across_processes(rows, dim=0, pad_index=-1, pad_first=True)
    assert _values(padded_first) == [[-1] * 2] * (world_size - rank - 1) + [[rank + 1] * 2] * (rank + 1)
    everyone = gather(padded)  # what padding is for
    assert everyone.shape == (world_size * world_size, 2)
    for r in range(world_size):
        block = _values(everyone[r * world_size:(r + 1) * world_size, 0])
        assert block == [r + 1] * (r + 1) + [-1] * (world_size - r - 1)

    columns = torch.full((2, rank + 1), float(rank), device=device)
    padded = pad_across_processes(columns, dim=1, pad_index=9)
    assert padded.shape == (2, world_size)
    assert _values(padded) == [[float(rank)] * (rank + 1) + [9.0] * (world_size - rank - 1)] * 2
    padded = pad_across_processes(columns, dim=1, pad_index=9, pad_first=True)
    assert _values(padded) == [[9.0] * (world_size - rank - 1) + [float(rank)] * (rank + 1)] * 2

    nested = pad_across_processes({"ids": torch.arange(rank + 2, device=device), "n": [torch.ones(1, device=device)]})
    assert nested["ids"].shape == (world_size + 1,)
    assert _values(nested["ids"]) == list(range(rank + 2)) + [0] * (world_size - rank - 1)
    assert nested["n"][0].shape == (1,)

    scalar = torch.tensor(5, device=device)  # fewer dimensions than dim: left as it is
    assert _values(pad_across_processes(scalar, dim=0)) == 5


@pytest.mark.world_size(*WORLD_SIZES)
def test_concatenate_and_send_to_device(device, rank, world_size):
    batches = [
        {"x": torch.arange(2, device=device), "y": [torch.zeros(2, 1, device=device)]},
        {"x": torch.arange(2, 5, device=device), "y": [torch.ones(3, 1, device=device)]},
    ]
    joined = concatenate(batches)
    assert _values(joined["x"]) == [0, 1, 2, 3, 4] and isinstance(joined["y"], list)
    assert joined["y"][0].shape == (5, 1)
    wide = concatenate([torch.zeros(2, 1, device=device), torch.ones(2, 2, device=device)], dim=1)
    assert _values(wide) == [[0.0, 1.0, 1.0]] * 2
    pairs = concatenate([Pair(torch.zeros(1), torch.ones(1)), Pair(torch.ones(1), torch.zeros(1))])
    assert isinstance(pairs, Pair) and _values(pairs.left) == [0.0, 1.0]

    host = {
        "a": torch.full((2,), rank),
        "b": [torch.zeros(1), (torch.ones(1), "text")],
        "pair": Pair(torch.zeros(1), 7),
        "n": 3,
        "keep": torch.ones(1),
    }
    moved = send_to_device(host, device, skip_keys="keep")
    assert moved["a"].device == device and _values(moved["a"]) == [rank, rank]
    assert isinstance(moved["b"], list) and isinstance(moved["b"][1], tuple)
    assert moved["b"][0].device == device and moved["b"][1][0].device == device and moved["b"][1][1] == "text"
    assert isinstance(moved["pair"], Pair) and moved["pair"].left.device == device and moved["pair"].right == 7
    assert moved["n"] == 3
    assert moved["keep"].device.type == "cpu"  # skip_keys stay where they are
    back = send_to_device(moved, "cpu")
    assert back["a"].device.type == "cpu" and back["b"][0].device.type == "cpu"


@pytest.mark.world_size(*WORLD_SIZES)
def test_copy_tensor_to_devices(device, rank, world_size):
    value = torch.arange(6, device=device, dtype=torch.float32).reshape(2, 3) * 1.5
    mine = value if rank == 0 else None
    copied = copy_tensor_to_devices(mine)
    assert copied is not mine and copied.device == device
    assert copied.shape == (2, 3) and copied.dtype == torch.float32
    assert _values(copied) == _values(value)

    last = world_size - 1
    ints = torch.tensor([[7, 8]], device=device)
    copied = copy_tensor_to_devices(ints if rank == last else None)
    assert copied.dtype == torch.int64 and _values(copied) == [[7, 8]]

    # Accelerate's idiom: the main process has the values, the others pass zeros
    zeros_elsewhere = value if rank == 0 else torch.zeros_like(value)
    assert _values(copy_tensor_to_devices(zeros_elsewhere)) == _values(value)


@pytest.mark.world_size(*WORLD_SIZES)
def test_debug_mode_names_mismatched_shapes(device, rank, world_size):
    saved = {name: os.environ.get(name) for name in ("ACCEL_DEBUG_MODE", "ACCELERATE_DEBUG_MODE")}
    try:
        # read when PartialState is created: create it anew; Accelerate's variable name works too
        os.environ.pop("ACCEL_DEBUG_MODE", None)
        os.environ["ACCELERATE_DEBUG_MODE"] = "1"
        AcceleratorState._reset_state(reset_partial_state=True)
        assert PartialState().debug
        os.environ.pop("ACCELERATE_DEBUG_MODE")
        os.environ["ACCEL_DEBUG_MODE"] = "1"
        AcceleratorState._reset_state(reset_partial_state=True)
        state = PartialState()
        assert state.debug
        same = torch.ones(2, 3, device=device)
        assert gather(same).shape == (2 * world_size, 3)  # what is legal still works
        assert _values(reduce(same, reduction="sum")) == [[float(world_size)] * 3] * 2
        odd = torch.ones(2 + rank % 2, 3, device=device)  # ranks 1 and 3 differ from rank 0
        if world_size == 1:
            assert gather(odd) is odd
            return
        for name, operation in (
            ("gather", gather),
            ("broadcast", lambda t: broadcast(t, from_process=0)),
            ("reduce", lambda t: reduce(t, reduction="sum")),
        ):
            with pytest.raises(DistributedOperationException) as info:
                operation(odd)
            text = str(info.value)
            assert name in text and "Process 1" in text, text
        other_dtype = same if rank == 0 else same.to(torch.int64)
        with pytest.raises(DistributedOperationException):
            gather(other_dtype)
        # padding only needs the same number of dimensions, then the shapes match
        padded = pad_across_processes(odd)
        assert padded.shape == (3, 3) and gather(padded).shape == (3 * world_size, 3)
        flat_or_not = same if rank == 0 else same.reshape(-1)
        with pytest.raises(DistributedOperationException):
            pad_across_processes(flat_or_not)
    finally:
        for name, value in saved.items():  # the ranks are reused by later tests
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.world_size(*WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_collectives_in_dtype(device, rank, world_size, dtype):
    local = (torch.arange(4, device=device) + 4 * rank).to(dtype)
    gathered = gather(local)
    assert gathered.dtype == dtype and gathered.device == device
    assert _values(gathered) == pytest.approx(list(range(4 * world_size)))

    source = world_size - 1
    tensor = torch.full((3,), rank, device=device).to(dtype)
    assert _values(broadcast(tensor, from_process=source)) == pytest.approx([source] * 3)
    assert tensor.dtype == dtype

    summed = reduce(local, reduction="sum")
    expected = [world_size * i + 4 * sum(range(world_size)) for i in range(4)]
    assert summed.dtype == dtype and _values(summed) == pytest.approx(expected)
    mean = reduce(local, reduction="mean")
    assert _values(mean) == pytest.approx([e / world_size for e in expected])
    if dtype.is_floating_point:
        assert mean.dtype == dtype

    short = local[: rank + 1]
    padded = pad_across_processes(short, pad_index=0)
    assert padded.dtype == dtype and padded.shape == (world_size,)
    assert _values(padded) == pytest.approx([4 * rank + i for i in range(rank + 1)] + [0] * (world_size - rank - 1))

    copied = copy_tensor_to_devices(local if rank == 0 else None)
    assert copied.dtype == dtype and _values(copied) == pytest.approx([0, 1, 2, 3])
