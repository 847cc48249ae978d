"""Device memory: allocator statistics, capacity, out-of-memory errors, configuration errors."""

from __future__ import annotations

import torch

from conftest import run_python

MiB = 1024 * 1024


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
    sums, labels = [], []
    for x, y in loader:
        assert x.is_pinned() and y.is_pinned()
        on_device = x.to("emu", non_blocking=True)
        sums.append(on_device.sum())
        labels.append(y.to("emu", non_blocking=True))
    torch.emu.synchronize()
    assert [float(s) for s in sums] == [120.0, 376.0, 632.0, 888.0]
    assert torch.cat([label.cpu() for label in labels]).tolist() == list(range(32))
