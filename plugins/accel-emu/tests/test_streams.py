"""Streams and events: queued copies run asynchronously, so a missing synchronize shows."""

from __future__ import annotations

import pytest
import torch

from accel_emu._extension import load_extension


def _hold(stream):
    return load_extension().hold_stream(stream.device_index, stream.stream_id)


def test_non_blocking_copy_to_pinned_memory_needs_a_synchronize(emu):
    src = torch.arange(1024.0, device="emu")
    host = torch.zeros(1024).pin_memory()
    assert host.is_pinned()
    stream = emu.current_stream()
    hold = _hold(stream)
    try:
        host.copy_(src, non_blocking=True)
        assert not stream.query()
        assert float(host.sum()) == 0.0  # read before synchronize: the copy has not run
    finally:
        hold.release()
    emu.synchronize()
    assert stream.query()
    assert torch.equal(host, torch.arange(1024.0))


def test_blocking_copy_waits_for_queued_work(emu):
    src = torch.arange(16.0, device="emu")
    dst = torch.empty(16, device="emu")
    with emu.stream(emu.Stream()):
        dst.copy_(src)  # device-to-device on a side stream: queued
        assert dst.cpu().tolist() == src.cpu().tolist()  # the copy to the host waits for it


def test_streams_are_independent_until_waited_on(emu):
    s1, s2 = emu.Stream(), emu.Stream()
    assert s1.stream_id != s2.stream_id
    hold = _hold(s1)
    try:
        event = emu.Event()
        with emu.stream(s1):
            assert emu.current_stream() == s1
            event.record()
        assert not event.query()
        s2.wait_event(event)
        assert not s2.query()  # s2 waits behind s1's gate
    finally:
        hold.release()
    event.synchronize()
    s2.synchronize()
    assert event.query() and s2.query()
    assert emu.current_stream() == emu.default_stream()


def test_event_elapsed_time(emu):
    start, end = emu.Event(enable_timing=True), emu.Event(enable_timing=True)
    x = torch.randn(256, 256, device="emu")
    start.record()
    for _ in range(3):
        x = x.clone()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0
    untimed = emu.Event()
    untimed.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        start.elapsed_time(untimed)


def test_torch_accelerator_synchronize_and_streams(emu):
    torch.accelerator.synchronize()
    assert torch.accelerator.current_stream().device.type == "emu"


def test_queued_copies_of_dropped_tensors_do_not_deadlock():
    # a queued copy may hold the last reference to a tensor Python already dropped; releasing it
    # needs the GIL, which the thread waiting for the stream holds (this hung collectives and FSDP)
    from conftest import SUBPROCESS_TIMEOUT, run_python

    result = run_python(
        """
        import torch, accel_emu
        accel_emu.load()
        total = 0.0
        with torch.emu.stream(torch.emu.Stream()):  # a side stream queues every copy
            for i in range(300):
                a = torch.full((4096,), float(i), device="emu")
                b = torch.empty_like(a)
                b.copy_(a)  # queued on the stream, holding a and b
                del a
                total += float(b.cpu()[0])  # waits for the stream with the GIL held
        print("total", total)
        """,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "total 44850.0" in result.stdout


def test_storage_resize_waits_for_queued_copies():
    # FSDP frees a parameter's storage (resize to 0) while a copy from it may still be queued
    from conftest import SUBPROCESS_TIMEOUT, run_python

    result = run_python(
        """
        import torch, accel_emu
        accel_emu.load()
        ok = 0
        with torch.emu.stream(torch.emu.Stream()):  # a side stream queues every copy
            for i in range(100):
                a = torch.full((65536,), float(i), device="emu")
                b = torch.empty_like(a)
                b.copy_(a)                       # queued
                a.untyped_storage().resize_(0)   # frees a's memory: must wait for the copy
                ok += int(float(b.cpu()[-1]) == float(i))
                a.untyped_storage().resize_(65536 * 4)
        print("ok", ok)
        """,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert "ok 100" in result.stdout


def test_a_queued_copy_keeps_the_shape_it_was_queued_with(emu):
    # in-place metadata operators (t_, resize_, unsqueeze_) change a tensor whose copy is still queued;
    # the copy must write the layout the tensor had when it was queued, as on a real device
    x = torch.arange(12.0).reshape(3, 4)
    source = x.to("emu")
    stream = emu.current_stream()
    hold = _hold(stream)
    try:
        transposed, reshaped, unsqueezed = source.clone(), source.clone(), source.clone()
        assert not stream.query()  # the three copies wait behind the hold
        transposed.t_()
        reshaped.resize_(2, 6)
        unsqueezed.unsqueeze_(0)
    finally:
        hold.release()
    emu.synchronize()
    assert torch.equal(transposed.cpu(), x.t())
    assert torch.equal(reshaped.cpu(), x.reshape(2, 6))
    assert torch.equal(unsqueezed.cpu(), x.unsqueeze(0))


@pytest.mark.parametrize("side_stream", [False, True], ids=["default-stream", "side-stream"])
def test_queued_copies_run_one_at_a_time_in_order_whoever_runs_them(emu, side_stream):
    """A chain of copies comes out whole only in order, whether they run on the caller (an idle default
    stream), on the stream's worker (a side stream always queues), or both."""
    base = torch.arange(1024.0, device="emu")
    chain = [torch.empty(1024, device="emu") for _ in range(6)]
    with emu.stream(emu.Stream() if side_stream else emu.default_stream()):
        for round_ in range(300):
            previous = base + round_  # an operator: it waits for the stream
            for buffer in chain:
                buffer.copy_(previous)
                previous = buffer
            total = chain[-1].sum()  # waits for the chain
            assert total.item() == 1023 * 1024 / 2 + 1024 * round_, f"round {round_}: the copies ran out of order"


def test_a_copy_on_an_idle_default_stream_has_run_when_it_returns(emu):
    # nothing queued: the copy runs on the calling thread, with no round trip through the stream's worker
    src, dst = torch.arange(4096.0, device="emu"), torch.empty(4096, device="emu")
    stream = emu.default_stream()
    for _ in range(50):
        dst.copy_(src)
        assert stream.query(), "the copy was queued on an idle default stream"
    assert torch.equal(dst.cpu(), torch.arange(4096.0))


def test_a_copy_run_by_its_caller_and_the_streams_worker_never_overlap(emu):
    """Two threads copy on the one default stream: one caller's copy runs on its own thread while the other's
    is queued behind it. The stream still runs one copy at a time, so no copy reads a half-written buffer."""
    import threading

    n = 1 << 23  # 32 MB: copies long enough for the other thread to queue one and the worker to wake meanwhile
    ones, twos = torch.ones(n, device="emu"), torch.full((n,), 2.0, device="emu")
    middle, last = torch.ones(n, device="emu"), torch.ones(n, device="emu")
    torn, reads = [], 0

    def writer():
        for i in range(200):
            middle.copy_(twos if i % 2 else ones)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while thread.is_alive() or reads < 40:
            last.copy_(middle)
            values = last.cpu()
            reads += 1
            if values.min() != values.max():
                torn.append((float(values.min()), float(values.max())))
    finally:
        thread.join()
    assert not torn, f"{len(torn)} of {reads} copies read a buffer another copy was writing"


def test_a_synchronize_waits_for_the_work_queued_before_it_while_another_thread_goes_on_queuing(emu):
    """A device's synchronize waits for the work queued before it. A thread that keeps queuing copies faster
    than the stream runs them (a full queue holds it back) never lets the queue run empty, and must not keep
    the synchronizing thread waiting until it stops."""
    import threading

    side = emu.Stream()
    src, dst = torch.ones(1 << 20, device="emu"), torch.empty(1 << 20, device="emu")
    probe = torch.ones(4, device="emu")
    stop = threading.Event()
    cap = 100_000  # the writer's own end, should the synchronizing thread never get through

    def writer():
        with emu.stream(side):
            for _ in range(cap):
                if stop.is_set():
                    return
                dst.copy_(src)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        with emu.stream(side):
            for _ in range(5):
                assert probe.cpu().tolist() == [1.0] * 4  # waits for the side stream, without the GIL
        still_queuing = thread.is_alive()
    finally:
        stop.set()
        thread.join()
    assert still_queuing, f"the synchronizing thread waited until the other thread had queued all {cap} copies"
