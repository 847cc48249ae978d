"""find_executable_batch_size, release_memory and friends, checked against Accelerate's behaviour."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from accel.backends import get_backend, register_backend, reset_registry
from accel.backends.cpu import CPUBackend

from accel.utils.memory import (
    clear_device_cache,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)

CPU_OOM = "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate {} bytes."


def _failing_above(limit, tried, error=lambda bs: RuntimeError(CPU_OOM.format(bs * 2**30))):
    def train(batch_size, tag, scale=1):
        tried.append(batch_size)
        if batch_size > limit:
            raise error(batch_size)
        return (batch_size, tag, scale)

    return train


def _reference():
    return pytest.importorskip("accelerate.utils.memory", reason="the reference `accelerate` is not installed")


@pytest.fixture
def cheap_gc(monkeypatch):
    """Both implementations collect garbage before every attempt; count instead (keeps the tests fast)."""
    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(1) or 0)
    return calls


def test_tried_sizes_match_the_reference(cheap_gc):
    reference = _reference()
    ours, theirs = [], []
    result = find_executable_batch_size(_failing_above(20, ours), starting_batch_size=128)("t", scale=2)
    expected = reference.find_executable_batch_size(_failing_above(20, theirs), starting_batch_size=128)("t", scale=2)
    assert ours[:4] == [128, 115, 103, 92]
    assert ours == theirs and result == expected == (ours[-1], "t", 2)
    assert len(cheap_gc) >= 2 * len(ours)  # memory is collected before each retry
    assert ours[-1] <= 20 < ours[-2]
    assert all(a > b for a, b in zip(ours, ours[1:]))


def test_reaching_zero_raises_like_the_reference(cheap_gc):
    reference = _reference()
    ours, theirs = [], []
    with pytest.raises(RuntimeError, match="^No executable batch size found, reached zero.$"):
        find_executable_batch_size(_failing_above(0, ours), starting_batch_size=16)("t")
    with pytest.raises(RuntimeError, match="reached zero"):
        reference.find_executable_batch_size(_failing_above(0, theirs), starting_batch_size=16)("t")
    assert ours == theirs and ours[-1] == 1 and ours[:3] == [16, 14, 12]


def test_torch_out_of_memory_error_is_recognised(cheap_gc):
    tried = []
    train = find_executable_batch_size(
        _failing_above(50, tried, error=lambda bs: torch.OutOfMemoryError(f"tried batch {bs}")),
        starting_batch_size=64,
    )
    assert train("t")[0] == 45 and tried == [64, 57, 51, 45]


def test_other_errors_propagate_unchanged_after_one_attempt():
    tried = []
    boom = ValueError("not memory related")

    @find_executable_batch_size(starting_batch_size=32)
    def train(batch_size):
        tried.append(batch_size)
        raise boom

    with pytest.raises(ValueError) as info:
        train()
    assert info.value is boom and tried == [32]


def test_an_other_backends_out_of_memory_message_is_not_a_host_oom():
    # on the cpu backend only host allocation failures (and torch.OutOfMemoryError) count
    assert get_backend().name == "cpu"
    assert not should_reduce_batch_size(RuntimeError("Some device out of memory. Tried to allocate 2 GiB"))
    assert not should_reduce_batch_size(ValueError(CPU_OOM.format(10)))  # right text, wrong type
    assert should_reduce_batch_size(RuntimeError(CPU_OOM.format(10)))


def test_a_real_cpu_allocation_failure_is_recognised():
    tried = []

    @find_executable_batch_size(starting_batch_size=40)
    def train(batch_size):
        tried.append(batch_size)
        if batch_size > 30:
            torch.empty(2**50, dtype=torch.uint8)  # a petabyte: the host allocator refuses
        return batch_size

    assert train() == 28 and tried == [40, 36, 32, 28]

    with pytest.raises(RuntimeError) as info:
        torch.empty(2**50, dtype=torch.uint8)
    assert should_reduce_batch_size(info.value)


class _OOMBackend(CPUBackend):
    """A stand-in accelerator whose out-of-memory message only it knows."""

    name = "oomtest"
    oom_messages = ("OOMTEST device out of memory",)

    def __init__(self):
        super().__init__()
        self.emptied = 0

    def empty_cache(self):
        self.emptied += 1


@pytest.fixture
def oom_backend(monkeypatch):
    reset_registry()
    backend = register_backend(_OOMBackend())
    monkeypatch.setenv("ACCEL_DEVICE", "oomtest")
    yield backend
    reset_registry()


def test_the_active_backend_decides_what_out_of_memory_looks_like(oom_backend):
    assert get_backend() is oom_backend
    error = RuntimeError("OOMTEST device out of memory (tried 3 GiB)")
    assert should_reduce_batch_size(error)
    assert should_reduce_batch_size(RuntimeError(CPU_OOM.format(1)))  # the host can still run out

    tried = []
    train = find_executable_batch_size(_failing_above(8, tried, error=lambda bs: error), starting_batch_size=10)
    before = oom_backend.emptied
    assert train("t")[0] == 8 and tried == [10, 9, 8]
    # one empty_cache on entry, one after each of the two failures
    assert oom_backend.emptied - before == 3


def test_batch_size_passed_by_the_caller_is_a_type_error_like_the_reference(cheap_gc):
    reference = _reference()

    def train(batch_size, model):
        return batch_size

    with pytest.raises(TypeError, match="train"):
        find_executable_batch_size(train, starting_batch_size=8)(16, "model")
    with pytest.raises(TypeError, match="train"):
        reference.find_executable_batch_size(train, starting_batch_size=8)(16, "model")
    assert find_executable_batch_size(train, starting_batch_size=8)("model") == 8


def test_the_working_size_is_kept_for_later_calls_like_the_reference(cheap_gc):
    reference = _reference()
    runs = {}
    for label, decorate in (("ours", find_executable_batch_size), ("theirs", reference.find_executable_batch_size)):
        tried = []
        train = decorate(_failing_above(100, tried), starting_batch_size=128)
        train("a")
        train("b")
        runs[label] = tried
    assert runs["ours"] == runs["theirs"] == [128, 115, 103, 92, 92]


def test_custom_reduction_is_used_and_must_shrink(cheap_gc):
    sizes = iter([50, 10])
    tried = []
    train = find_executable_batch_size(_failing_above(20, tried), starting_batch_size=100,
                                       reduce_batch_size_fn=lambda: next(sizes))
    assert train("t")[0] == 10 and tried == [100, 50, 10]

    stuck = find_executable_batch_size(_failing_above(0, []), starting_batch_size=4, reduce_batch_size_fn=lambda: 4)
    with pytest.raises(ValueError, match="returned 4 after batch size 4"):
        stuck("t")


def test_release_memory_drops_references_and_empties_the_cache(oom_backend):
    big = torch.ones(1000)
    alive = weakref.ref(big)
    other = {"a": 1}
    before = oom_backend.emptied
    big, other = release_memory(big, other)
    assert (big, other) == (None, None)
    assert alive() is None
    assert oom_backend.emptied == before + 1
    assert release_memory() == []


def test_clear_device_cache_collects_garbage_only_when_asked(oom_backend, monkeypatch):
    collected = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or 0)
    clear_device_cache()
    assert collected == [] and oom_backend.emptied == 1
    clear_device_cache(garbage_collection=True)
    assert collected == [1] and oom_backend.emptied == 2


def test_exported_from_accel_utils():
    import accel.utils as utils

    assert utils.find_executable_batch_size is find_executable_batch_size
    assert utils.release_memory is release_memory
