"""Memory utilities on the backend under test: release_memory, clear_device_cache, memory statistics,
and find_executable_batch_size with injected and with real out-of-memory errors.

The real out-of-memory test (device backends only) asks for more than the device has
(``mem_get_info`` total), so it fails at once instead of filling the device slowly; it is bounded to
a handful of allocations. It needs the device to itself: do not run it beside other jobs on the
same device.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from _training_utils import on_backend  # noqa: F401 - fixture
from accel.backends import UnsupportedFeatureError
from accel.utils import memory as memory_utils
from accel.utils.memory import clear_device_cache, find_executable_batch_size, release_memory, should_reduce_batch_size

MIB = 2**20
BLOCK = 64 * MIB  # big enough to stand out of allocator noise; host RSS: above glibc's mmap threshold


@pytest.fixture
def counted_gc(monkeypatch):
    """find_executable_batch_size collects garbage before every attempt: count the calls instead of
    paying for full collections of the pytest process (the device cache is still really emptied)."""
    calls: list[int] = []
    monkeypatch.setattr(memory_utils.gc, "collect", lambda *a: calls.append(1) or 0)
    return calls


def _require_memory_stats(backend) -> None:
    cap = backend.memory_stats_capability
    if not cap:
        pytest.skip(f"[not-on-backend] {backend.name} has no memory statistics: {cap.reason}")


def _allocated(backend, device) -> int:
    backend.synchronize(device.index)
    return backend.memory_allocated(device.index)


def test_release_memory_drops_the_references(on_backend, device):
    tensor = torch.ones(1024, device=device)
    module = torch.nn.Linear(4, 4).to(device)
    refs = [weakref.ref(tensor), weakref.ref(module)]
    released = release_memory(tensor, module)
    assert released == [None, None]
    tensor, module = released
    assert [r() for r in refs] == [None, None], "release_memory kept a reference"


def test_clear_device_cache_empties_the_active_backends_cache(on_backend, monkeypatch):
    emptied, collected = [], []
    real_empty = type(on_backend).empty_cache

    def spy_empty(self):
        emptied.append(self.name)
        return real_empty(self)

    monkeypatch.setattr(type(on_backend), "empty_cache", spy_empty)
    monkeypatch.setattr(memory_utils.gc, "collect", lambda *a: collected.append(1) or 0)
    clear_device_cache()
    assert emptied == [on_backend.name] and collected == []
    clear_device_cache(garbage_collection=True)
    assert emptied == [on_backend.name] * 2 and collected == [1]


def test_memory_statistics_follow_an_allocation(on_backend, device):
    _require_memory_stats(on_backend)
    gc.collect()
    before = _allocated(on_backend, device)
    block = torch.ones(BLOCK // 4, dtype=torch.float32, device=device)  # written, so host pages are resident too
    during = _allocated(on_backend, device)
    assert during - before >= 0.9 * BLOCK, f"allocated went from {before} to {during} after a {BLOCK}-byte allocation"
    try:
        assert on_backend.max_memory_allocated(device.index) >= during
    except UnsupportedFeatureError:
        pass  # no peak tracking on this backend (its capability reason says so)
    free, total = on_backend.mem_get_info(device.index)
    assert 0 <= free <= total and total >= BLOCK

    ref = weakref.ref(block)
    (block,) = release_memory(block)
    assert ref() is None
    after = _allocated(on_backend, device)
    assert during - after >= 0.9 * BLOCK, f"allocated went from {during} to {after} after the block was released"


def test_find_executable_batch_size_shrinks_on_the_backends_out_of_memory_error(on_backend, counted_gc):
    if not on_backend.oom_messages:
        pytest.skip(f"[not-on-backend] {on_backend.name} declares no out-of-memory messages to inject")
    message = on_backend.oom_messages[0]
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size, tag):
        tried.append(batch_size)
        if batch_size > 50:  # an allocation failure, as this backend reports it
            raise RuntimeError(f"{message}. Tried to allocate {batch_size * 2} GiB")
        return batch_size, tag

    assert train("run") == (46, "run")
    assert tried == [128, 115, 103, 92, 82, 73, 65, 58, 52, 46]  # int(size * 0.9) after each failure
    assert len(counted_gc) >= len(tried), "memory was not released between attempts"
    assert on_backend.is_oom_error(RuntimeError(f"{message}. Tried to allocate 2 GiB"))
    assert train("again") == (46, "again") and tried[-1] == 46  # the size that worked is kept

    others: list[int] = []

    @find_executable_batch_size(starting_batch_size=32)
    def broken(batch_size):
        others.append(batch_size)
        raise RuntimeError("shape mismatch")  # not a memory error: no retry

    with pytest.raises(RuntimeError, match="shape mismatch"):
        broken()
    assert others == [32]


def test_a_real_host_allocation_failure_is_recognised(on_backend, counted_gc):
    """Host allocations can fail under any backend; their error counts as out-of-memory everywhere."""
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=40)
    def train(batch_size):
        tried.append(batch_size)
        if batch_size > 30:
            torch.empty(2**50, dtype=torch.uint8)  # a petabyte: the host allocator refuses
        return batch_size

    assert train() == 28 and tried == [40, 36, 32, 28]


@pytest.mark.require_non_cpu
def test_a_real_device_out_of_memory_is_recognised_and_recovered_from(on_backend, device):
    if on_backend.memory_is_host:  # a backend (a device profile, say) whose memory is the host's RAM
        pytest.skip(f"[not-on-backend] {on_backend.name}'s memory is the host's RAM: filling it would take the machine down")
    _require_memory_stats(on_backend)
    _, total = on_backend.mem_get_info(device.index)
    assert total > 0

    # allocate increasingly (one block at a time) until the device refuses
    size, error = max(total // 4, 1), None
    while size <= 4 * total:
        try:
            block = torch.empty(size, dtype=torch.uint8, device=device)
            block[:1].fill_(1)
            on_backend.synchronize(device.index)
        except Exception as exc:  # the backend's own error type, whatever it is
            error = exc
            break
        del block
        size *= 2
    on_backend.empty_cache()
    assert error is not None, f"allocating up to {size} bytes (device total {total}) never failed"
    assert on_backend.is_oom_error(error), f"{on_backend.name} does not recognise its own out-of-memory error: " \
                                           f"{type(error).__name__}: {error}"
    assert should_reduce_batch_size(error)
    del error

    unit = max(total // 8, 1)  # 16 units: twice the device's memory
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=16)
    def fill(batch_size):
        tried.append(batch_size)
        chunk = torch.empty(batch_size * unit, dtype=torch.uint8, device=device)
        chunk[:1].fill_(1)
        on_backend.synchronize(device.index)
        return chunk.numel()

    got = fill()
    on_backend.empty_cache()
    assert tried[:2] == [16, 14] and all(int(a * 0.9) == b for a, b in zip(tried, tried[1:]))
    assert got == tried[-1] * unit <= total
