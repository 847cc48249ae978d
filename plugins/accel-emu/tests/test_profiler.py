"""torch's profilers on emu: the PrivateUse1 profiler stubs (marker-only mode) and emu's Kineto activity
profiler (torch.profiler with ProfilerActivity.PrivateUse1)."""

from __future__ import annotations

import json

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def _work(x: torch.Tensor) -> None:
    for _ in range(2):
        (x @ x).relu().sum()
    torch.emu.synchronize()


def test_the_profiler_records_device_time_per_operator():
    x = torch.randn(64, 64, device="emu")
    with torch.autograd.profiler.profile(use_device="emu", use_kineto=False) as prof:
        _work(x)
    rows = {row.key: row for row in prof.key_averages()}
    assert rows["aten::mm"].count >= 2  # the host kernel the fallback calls is an aten::mm too
    assert rows["aten::mm"].device_time_total > 0  # no stubs: every device time is 0
    assert rows["aten::mm"].self_device_time_total <= rows["aten::mm"].device_time_total
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)
    assert "Self EMU" in table and "EMU total" in table


def test_an_event_on_an_idle_stream_is_complete_at_once_and_ordered_after_queued_work():
    stream = torch.emu.Stream()
    start = torch.emu.Event(enable_timing=True)
    end = torch.emu.Event(enable_timing=True)
    with torch.emu.stream(stream):
        start.record()
        assert start.query()  # nothing queued before it
        x = torch.ones(512, 512, device="emu")
        y = x.to("cpu", non_blocking=True)  # queued on the stream
        end.record()
    end.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0.0
    assert float(y.sum()) == 512 * 512


def test_torch_profiler_records_emu_kernels_and_copies_linked_to_their_operators(tmp_path):
    x = torch.randn(64, 64, device="emu:1")
    host = torch.ones(256).pin_memory()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        with torch.emu.device(1):
            (x @ x).relu()
            on_device = host.to("emu:1", non_blocking=True)  # queued on the stream: recorded when it runs
            back = x.cpu()
        torch.emu.synchronize(1)
    assert float(on_device.sum()) == 256.0 and back.shape == (64, 64)
    device_events = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    names = {e.name for e in device_events}
    assert {"emu::aten::mm", "emu::aten::relu", "Memcpy HtoD", "Memcpy DtoH"} <= names, names
    assert {e.device_index for e in device_events} == {1}
    rows = {row.key: row for row in prof.key_averages()}
    assert rows["aten::mm"].device_time_total > 0  # the kernel is linked to the operator that launched it
    assert rows["aten::copy_"].device_time_total > 0
    by_name = {e.name: e for e in prof.events() if e.device_type == DeviceType.CPU and e.kernels}
    assert "emu::aten::mm" in {k.name for k in by_name["aten::mm"].kernels}
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    kernels = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    assert any(e["name"] == "emu::aten::mm" for e in kernels)


def test_torch_profiler_records_emu_allocations_with_profile_memory():
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True) as prof:
        t = torch.empty(1000, device="emu:0")
        del t
    records = [e for e in prof.profiler.kineto_results.events()
               if e.name() == "[memory]" and e.device_type() == DeviceType.PrivateUse1]
    assert [e.nbytes() for e in records] == [4000, -4000]
    assert {e.device_index() for e in records} == {0}


def test_without_the_device_activity_no_emu_event_is_recorded():
    x = torch.randn(16, 16, device="emu")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x @ x
    assert not [e for e in prof.events() if e.device_type != DeviceType.CPU]
