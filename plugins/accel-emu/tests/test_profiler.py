"""torch's profiler times operators on emu through the plug-in's PrivateUse1 profiler stubs."""

from __future__ import annotations

import torch


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
