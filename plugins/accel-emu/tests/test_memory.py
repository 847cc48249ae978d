"""Device memory: allocator statistics, capacity, out-of-memory errors, configuration errors."""

from __future__ import annotations

import torch

from conftest import run_python

MiB = 1024 * 1024

# The keys of torch.cuda.memory_stats, from its docstring (torch/cuda/memory.py, torch 2.13): the core
# statistics for every pool and metric, the over-size counters and the event counters. The docstring's
# "allocated.{pool}.{metric}" is spelled "allocation.{pool}.{metric}" in the dictionary torch returns
# (torch/csrc/cuda/Module.cpp, and torch.accelerator.memory_stats), so the table uses that spelling.
# Left out, as torch.accelerator.memory_stats leaves them out for every device: "num_oom_rejections"
# and "reserved_bytes_by_private_pools" (CUDA's per-process memory fraction policy and private pools).
CORE_STATS = ("allocation", "allocated_bytes", "segment", "reserved_bytes", "active", "active_bytes",
              "inactive_split", "inactive_split_bytes", "requested_bytes")
POOLS = ("all", "large_pool", "small_pool")
METRICS = ("current", "peak", "allocated", "freed")
CUDA_MEMORY_STATS_KEYS = frozenset(
    [f"{stat}.{pool}.{metric}" for stat in CORE_STATS for pool in POOLS for metric in METRICS]
    + [f"{stat}.{metric}" for stat in ("oversize_allocations", "oversize_segments") for metric in METRICS]
    + ["num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free", "max_split_size"]
)

# The keys of torch.cuda.host_memory_stats, from its docstring (torch/cuda/memory.py, torch 2.13).
CUDA_HOST_MEMORY_STATS_KEYS = frozenset(
    [f"{stat}.{metric}" for stat in ("allocations", "allocated_bytes", "active_requests", "active_bytes")
     for metric in METRICS]
    + [f"{timer}.{field}" for timer in ("host_alloc_time", "host_free_time")
       for field in ("total", "max", "min", "count", "avg")]
    + ["num_host_alloc", "num_host_free"]
)


def test_allocation_statistics_follow_tensors(emu):
    base = emu.memory_allocated(0)
    t = torch.empty(MiB, dtype=torch.uint8, device="emu:0")
    assert emu.memory_allocated(0) == base + MiB
    assert emu.max_memory_allocated(0) >= base + MiB
    assert emu.memory_reserved(0) >= emu.memory_allocated(0)
    assert torch.accelerator.memory_allocated(0) == emu.memory_allocated(0)
    del t
    assert emu.memory_allocated(0) == base
    assert emu.max_memory_allocated(0) >= base + MiB
    emu.reset_peak_memory_stats(0)
    assert emu.max_memory_allocated(0) == base


def test_cache_is_reused_and_emptied(emu):
    t = torch.empty(4 * MiB, dtype=torch.uint8, device="emu:0")
    reserved = emu.memory_reserved(0)
    del t
    assert emu.memory_reserved(0) == reserved  # kept in the cache
    again = torch.empty(4 * MiB, dtype=torch.uint8, device="emu:0")
    assert emu.memory_reserved(0) == reserved  # served from the cache
    del again
    emu.empty_cache()
    assert emu.memory_reserved(0) == reserved - 4 * MiB
    assert emu.max_memory_reserved(0) >= reserved


def test_statistics_are_per_device(emu):
    before0, before1 = emu.memory_allocated(0), emu.memory_allocated(1)
    t = torch.empty(MiB, dtype=torch.uint8, device="emu:1")
    assert emu.memory_allocated(1) == before1 + MiB
    assert emu.memory_allocated(0) == before0
    stats = emu.memory_stats(1)
    assert stats["allocated_bytes.all.current"] == before1 + MiB
    assert stats["allocation.all.current"] >= 1
    del t


def test_memory_stats_have_the_keys_of_cudas_allocator(emu):
    torch.empty(16, device="emu:0")  # the allocator has been used
    assert set(emu.memory_stats(0)) == CUDA_MEMORY_STATS_KEYS
    assert set(torch.accelerator.memory_stats(0)) == CUDA_MEMORY_STATS_KEYS
    assert list(emu.memory_stats(0)) == sorted(CUDA_MEMORY_STATS_KEYS)  # sorted, as torch.cuda's


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before[key] for key in after if after[key] != before[key]}


def test_every_pool_statistic_follows_an_allocation_and_a_free(emu):
    """A block of up to 1 MiB is the small pool's, a larger one the large pool's; "all" is their sum;
    freeing leaves the block reserved (cached) until empty_cache returns it."""
    for nbytes, pool in ((4096, "small_pool"), (4 * MiB, "large_pool")):
        other = "large_pool" if pool == "small_pool" else "small_pool"
        before = emu.memory_stats(0)
        t = torch.empty(nbytes, dtype=torch.uint8, device="emu:0")
        allocated = _delta(before, emu.memory_stats(0))
        for stat, amount in (("allocation", 1), ("active", 1), ("segment", 1), ("allocated_bytes", nbytes),
                             ("active_bytes", nbytes), ("requested_bytes", nbytes), ("reserved_bytes", nbytes)):
            for where in (pool, "all"):
                assert allocated[f"{stat}.{where}.current"] == amount, (stat, where, allocated)
                assert allocated[f"{stat}.{where}.allocated"] == amount, (stat, where, allocated)
                assert allocated[f"{stat}.{where}.peak"] == amount, (stat, where, allocated)  # peaks were reset
            assert f"{stat}.{other}.current" not in allocated
        assert allocated["num_device_alloc"] == 1
        del t
        freed = _delta(before, emu.memory_stats(0))
        for stat, amount in (("allocation", 1), ("active", 1), ("allocated_bytes", nbytes), ("active_bytes", nbytes)):
            assert freed[f"{stat}.{pool}.freed"] == freed[f"{stat}.all.freed"] == amount, (stat, freed)
            assert f"{stat}.{pool}.current" not in freed  # back where it was
        assert freed[f"reserved_bytes.{pool}.current"] == nbytes  # cached, still reserved
        emu.empty_cache()
        emptied = _delta(before, emu.memory_stats(0))
        assert emptied[f"reserved_bytes.{pool}.freed"] == nbytes
        assert emptied[f"segment.{pool}.freed"] == 1 and emptied["num_device_free"] == 1
        assert f"reserved_bytes.{pool}.current" not in emptied
        emu.reset_peak_memory_stats(0)
    # emu maps one block per request and never splits one: nothing is ever an inactive split or over-size
    stats = emu.memory_stats(0)
    assert all(value == 0 for key, value in stats.items() if key.startswith(("inactive_split", "oversize")))
    emu.reset_accumulated_memory_stats(0)
    assert all(value == 0 for key, value in emu.memory_stats(0).items() if key.endswith((".allocated", ".freed")))


def test_host_memory_stats_have_the_keys_of_cudas_and_follow_pinned_tensors(emu):
    assert set(emu.host_memory_stats()) == CUDA_HOST_MEMORY_STATS_KEYS
    before = emu.host_memory_stats()
    pinned = torch.ones(1000).pin_memory()
    assert pinned.is_pinned()
    held = _delta(before, emu.host_memory_stats())
    for stat, amount in (("allocations", 1), ("active_requests", 1), ("allocated_bytes", 4000), ("active_bytes", 4000)):
        assert held[f"{stat}.current"] == held[f"{stat}.allocated"] == amount, (stat, held)
    assert held["num_host_alloc"] == held["host_alloc_time.count"] == 1
    del pinned
    released = _delta(before, emu.host_memory_stats())
    assert released["allocations.freed"] == released["active_requests.freed"] == 1
    assert released["allocated_bytes.freed"] == 4000 and released["num_host_free"] == 1
    assert "allocations.current" not in released and "allocated_bytes.current" not in released
    emu.reset_peak_host_memory_stats()
    assert emu.host_memory_stats()["allocated_bytes.peak"] == emu.host_memory_stats()["allocated_bytes.current"]
    emu.reset_accumulated_host_memory_stats()
    reset = emu.host_memory_stats()
    assert reset["num_host_alloc"] == reset["num_host_free"] == reset["allocations.allocated"] == 0


def test_mem_get_info_reports_capacity(emu):
    free, total = emu.mem_get_info(0)
    assert total == emu.get_device_properties(0).total_memory == 8 * 1024**3
    assert 0 < free <= total
    assert torch.accelerator.get_memory_info(0) == (free, total)


def test_out_of_memory_is_torch_oom_worded_like_a_device():
    result = run_python(
        """
        import torch, accel_emu
        accel_emu.load()
        keep = torch.empty(40 * 2**20, dtype=torch.uint8, device="emu:0")
        try:
            torch.empty(100 * 2**20, dtype=torch.uint8, device="emu:0")
        except torch.OutOfMemoryError as exc:
            print("OOM:", exc)
        other = torch.empty(60 * 2**20, dtype=torch.uint8, device="emu:1")  # the other device has its own memory
        print("stats", torch.emu.memory_stats(0)["num_ooms"])
        """,
        env={"ACCEL_EMU_MEMORY": "128MiB"},
    )
    assert result.returncode == 0, result.stderr
    assert (
        "OOM: emu out of memory. Tried to allocate 100.00 MiB (emu:0; 0.12 GiB total capacity; "
        "40.00 MiB already allocated;" in result.stdout
    ), result.stdout
    assert "stats 1" in result.stdout


def test_invalid_memory_setting_is_a_clear_error():
    result = run_python(
        """
        import torch, accel_emu
        accel_emu.load()
        try:
            torch.empty(1, device="emu")
        except RuntimeError as exc:
            print("ERR:", exc)
        """,
        env={"ACCEL_EMU_MEMORY": "lots"},
    )
    assert "ACCEL_EMU_MEMORY must be a size such as 4GiB or 512MiB, got 'lots'" in result.stdout, (result.stdout, result.stderr)


def test_a_data_loader_with_workers_pins_batches_for_emu():
    """The training input path: worker processes load batches, the loader's pin-memory thread pins them
    for the current accelerator (emu), and non-blocking copies take them to the device in order."""
    from torch.utils.data import DataLoader, TensorDataset

    assert torch.accelerator.current_accelerator().type == "emu"
    data = TensorDataset(torch.arange(64.0).reshape(32, 2), torch.arange(32))
    loader = DataLoader(data, batch_size=8, num_workers=2, pin_memory=True)
    pinned_before = torch.emu.host_memory_stats()["num_host_alloc"]
    sums, labels = [], []
    for x, y in loader:
        assert x.is_pinned() and y.is_pinned()
        on_device = x.to("emu", non_blocking=True)
        assert on_device.device == torch.device("emu", torch.emu.current_device())
        sums.append(on_device.sum())
        labels.append(y.to("emu", non_blocking=True))
    torch.emu.synchronize()
    assert [float(s) for s in sums] == [120.0, 376.0, 632.0, 888.0]
    assert torch.cat([label.cpu() for label in labels]).tolist() == list(range(32))
    # pinned by emu's host allocator (inputs and labels of 4 batches), not by the CPU's
    assert torch.emu.host_memory_stats()["num_host_alloc"] - pinned_before >= 8
