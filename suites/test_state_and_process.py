"""PartialState / AcceleratorState inside real ranks: layout, device, synchronisation, work splitting.

Each test body runs in every rank of a pooled process group of the backend's collective backend;
expected values are computed locally from the rank index and the world size.
"""

from __future__ import annotations

import contextlib
import io
import os
import time

import pytest
import torch
import torch.distributed as dist

from _suite_utils import expected_device, per_rank, to_host_list
from accel.state import AcceleratorState, GradientState, PartialState
from accel.utils.dataclasses import DistributedType

WORLD_SIZES = (1, 2, 4)


def _share_bounds(length: int, world_size: int, rank: int) -> tuple[int, int]:
    """Contiguous share of ``length`` items; the first ``length % world_size`` ranks get one more."""
    counts = [length // world_size + (1 if r < length % world_size else 0) for r in range(world_size)]
    start = sum(counts[:rank])
    return start, start + counts[rank]


@pytest.mark.world_size(*WORLD_SIZES)
def test_process_layout_and_device(backend, device, rank, world_size):
    state = PartialState()
    assert state.num_processes == world_size == dist.get_world_size()
    assert state.process_index == rank == dist.get_rank()
    assert state.local_process_index == rank == int(os.environ["LOCAL_RANK"])  # one node
    assert state.device == expected_device(backend, rank) == device
    assert state.hardware_backend.name == backend.name
    assert torch.ones(2, device=state.device).device.type == backend.device_type
    if world_size == 1:
        assert state.distributed_type == DistributedType.NO and not state.use_distributed
    else:
        assert state.distributed_type == DistributedType(backend.distributed_type)
        assert state.use_distributed
        assert state.backend == backend.comm_backend
    assert state.is_main_process == (rank == 0)
    assert state.is_local_main_process == (rank == 0)
    assert state.is_last_process == (rank == world_size - 1)
    assert f"Num processes: {world_size}" in repr(state) and f"Process index: {rank}" in repr(state)

    # AcceleratorState shares PartialState's ranks and device, and adds precision
    accel_state = AcceleratorState()
    assert accel_state.mixed_precision == "no"
    assert accel_state.num_processes == world_size and accel_state.process_index == rank
    assert accel_state.local_process_index == rank
    assert accel_state.device == state.device
    assert accel_state.distributed_type == state.distributed_type
    assert accel_state.is_main_process == state.is_main_process
    assert accel_state.is_last_process == state.is_last_process
    assert accel_state.use_distributed == state.use_distributed
    assert PartialState().device == state.device  # one shared state
    assert GradientState().sync_gradients is True

    # every rank agrees on the layout
    layouts = per_rank((state.process_index, state.num_processes, str(state.distributed_type)))
    assert layouts == [(r, world_size, str(state.distributed_type)) for r in range(world_size)]


@pytest.mark.world_size(2)
def test_a_deepspeed_launch_makes_a_deepspeed_process_state(backend, rank, world_size, monkeypatch):
    """As Accelerate's PartialState: ranks launched with --use_deepspeed report DistributedType.DEEPSPEED
    (cpu=True keeps the backend's type), so prepare_data_loader applies DeepSpeed's mesh rule."""
    PartialState._reset_state()
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    try:
        state = PartialState()
        assert state.distributed_type == DistributedType.DEEPSPEED and state.use_distributed
        assert state.num_processes == world_size and state.process_index == rank
        PartialState._reset_state()
        assert PartialState(cpu=True).distributed_type != DistributedType.DEEPSPEED
    finally:
        PartialState._reset_state()


@pytest.mark.world_size(*WORLD_SIZES)
def test_wait_for_everyone_and_main_process_first(backend, rank, world_size, tmp_path):
    state = PartialState()
    # wait_for_everyone: after it, every rank's mark is there
    (tmp_path / f"arrived-{rank}").write_text(str(rank))
    state.wait_for_everyone()
    assert sorted(p.name for p in tmp_path.glob("arrived-*")) == sorted(f"arrived-{r}" for r in range(world_size))
    state.wait_for_everyone()  # nobody looks at the folder any more when the next block starts

    order_file = tmp_path / "order.txt"
    with state.main_process_first():
        if rank == 0:
            time.sleep(0.05)  # the others, were they not held back, would overtake the main process
        with open(order_file, "a") as fh:
            fh.write(f"{rank}\n")
    state.wait_for_everyone()
    order = [int(line) for line in order_file.read_text().split()]
    assert order[0] == 0, f"main_process_first let rank {order[0]} in first: {order}"
    assert sorted(order) == list(range(world_size))

    local_file = tmp_path / "local-order.txt"
    with AcceleratorState().local_main_process_first():
        if rank == 0:
            time.sleep(0.05)
        with open(local_file, "a") as fh:
            fh.write(f"{rank}\n")
    state.wait_for_everyone()
    local_order = [int(line) for line in local_file.read_text().split()]
    assert local_order[0] == 0 and sorted(local_order) == list(range(world_size))


@pytest.mark.world_size(*WORLD_SIZES)
def test_split_between_processes(backend, device, rank, world_size):
    state = PartialState()

    # a literal table for 7 items, so the rule itself is checked and not only re-derived
    table = {1: [[0, 1, 2, 3, 4, 5, 6]], 2: [[0, 1, 2, 3], [4, 5, 6]], 4: [[0, 1], [2, 3], [4, 5], [6]]}
    with state.split_between_processes(list(range(7))) as share:
        assert share == table[world_size][rank]
    padded_table = {1: [[0, 1, 2, 3, 4, 5, 6]], 2: [[0, 1, 2, 3], [4, 5, 6, 6]], 4: [[0, 1], [2, 3], [4, 5], [6, 6]]}
    with state.split_between_processes(list(range(7)), apply_padding=True) as share:
        assert share == padded_table[world_size][rank]

    for length in (8, 5, 3, 1):  # even and uneven, fewer items than processes
        items = [f"item{i}" for i in range(length)]
        start, end = _share_bounds(length, world_size, rank)
        with state.split_between_processes(items) as share:
            assert share == items[start:end]
        everyone = per_rank(share)
        assert [x for part in everyone for x in part] == items, "the shares do not add up to the input"
        with state.split_between_processes(tuple(items)) as share:
            assert share == tuple(items[start:end])

    # tensors on the device, split along dim 0
    data = torch.arange(20, device=device).reshape(10, 2)
    start, end = _share_bounds(10, world_size, rank)
    with state.split_between_processes(data) as share:
        assert isinstance(share, torch.Tensor) and share.device == data.device
        assert torch.equal(share, data[start:end])
    with state.split_between_processes(data[:7], apply_padding=True) as share:
        start, end = _share_bounds(7, world_size, rank)
        longest = -(-7 // world_size)
        expected = data[start:end]
        if expected.shape[0] < longest:
            expected = torch.cat([expected, expected[-1:].expand(longest - expected.shape[0], 2)])
        assert share.device == data.device and torch.equal(share, expected)
        assert share.shape[0] == longest  # equal shapes: gatherable

    # dicts of lists and tensors: every value split alike
    batch = {"ids": list(range(6)), "x": torch.arange(6, device=device, dtype=torch.float32)}
    start, end = _share_bounds(6, world_size, rank)
    with state.split_between_processes(batch) as share:
        assert set(share) == {"ids", "x"}
        assert share["ids"] == list(range(start, end))
        assert to_host_list(share["x"]) == [float(i) for i in range(start, end)]
        assert share["x"].device == batch["x"].device
    if world_size > 1:  # as in Accelerate, one process gets its input back unchecked
        with pytest.raises(ValueError):
            with state.split_between_processes({"a": [1, 2], "b": [1, 2, 3]}):
                pass

    # the same through AcceleratorState
    with AcceleratorState().split_between_processes(list(range(7))) as share:
        assert share == table[world_size][rank]


@pytest.mark.world_size(*WORLD_SIZES)
def test_process_decorators_and_print(backend, rank, world_size):
    state = PartialState()
    last = world_size - 1

    @state.on_main_process
    def main_only(x):
        return ("main", x)

    @state.on_last_process
    def last_only():
        return "last"

    @state.on_local_main_process
    def local_main_only():
        return "local main"

    @state.on_process(process_index=last)
    def on_last_index():
        return "by index"

    def plain(x):
        return x * 2

    assert main_only(3) == (("main", 3) if rank == 0 else None)
    assert main_only.__name__ == "main_only"
    assert last_only() == ("last" if rank == last else None)
    assert local_main_only() == ("local main" if rank == 0 else None)
    assert on_last_index() == ("by index" if rank == last else None)
    assert state.on_process(plain, process_index=0)(5) == (10 if rank == 0 else None)
    assert state.on_local_process(plain, local_process_index=last)(5) == (10 if rank == last else None)
    assert state.on_main_process()(plain)(4) == (8 if rank == 0 else None)  # decorator factory form
    with pytest.raises(ValueError):
        state.on_process(plain)  # no process index

    # how many ranks ran each: exactly one (every rank on one process)
    ran = per_rank([main_only(1) is not None, last_only() is not None, on_last_index() is not None])
    assert [sum(col) for col in zip(*ran)] == [1, 1, 1]

    # print: on the local main process only
    for printer in (state, AcceleratorState()):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            printer.print("hello from", rank, sep=" ")
        assert out.getvalue() == ("hello from 0\n" if rank == 0 else "")
