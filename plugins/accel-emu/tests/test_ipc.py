"""emu tensors shared between processes with torch.multiprocessing, as CUDA tensors are."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

#: generous for a loaded 2-core machine: a spawned child imports torch and loads emu
TIMEOUT = 120


def _child(inbox, outbox) -> None:
    """Receive emu tensors, report what they hold, write into the shared one, send a new one back."""
    import accel_emu

    accel_emu.load()
    shared, view = inbox.get(timeout=TIMEOUT)
    outbox.put(("received", str(shared.device), shared.dtype, shared.cpu().tolist(), view.cpu().tolist(),
                view.stride(), view.storage_offset()))
    shared.add_(100)  # lands in the sender's memory
    torch.emu.synchronize()
    outbox.put(("written", torch.arange(3.0, device="emu:1") * 2))
    inbox.get(timeout=TIMEOUT)  # keep the child's tensor alive until the parent has read it


def _get(queue, what: str):
    try:
        return queue.get(timeout=TIMEOUT)
    except Exception as exc:  # queue.Empty: name what never arrived
        pytest.fail(f"the spawned child sent no {what} within {TIMEOUT} s ({type(exc).__name__})")


def test_emu_tensors_pass_through_a_queue_to_a_spawned_process_and_share_memory():
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    shared = torch.arange(12.0, device="emu:1").reshape(3, 4)
    assert shared.share_memory_() is shared and shared.is_shared()  # a no-op, as for CUDA tensors
    view = shared.t()[1:]  # a strided view with an offset: the child sees the same geometry
    child = ctx.Process(target=_child, args=(inbox, outbox))
    child.start()
    try:
        inbox.put((shared, view))
        tag, device, dtype, values, view_values, stride, offset = _get(outbox, "report of the tensors")
        assert (tag, device, dtype) == ("received", "emu:1", torch.float32)
        assert values == torch.arange(12.0).reshape(3, 4).tolist()
        assert view_values == torch.arange(12.0).reshape(3, 4).t()[1:].tolist()
        assert (stride, offset) == (view.stride(), view.storage_offset())
        tag, from_child = _get(outbox, "tensor of its own")
        assert tag == "written" and from_child.device == torch.device("emu:1")
        assert from_child.cpu().tolist() == [0.0, 2.0, 4.0]
        # the child's in-place add happened in this process's memory
        assert shared.cpu().tolist() == (torch.arange(12.0).reshape(3, 4) + 100).tolist()
        inbox.put("done")
        child.join(TIMEOUT)
        assert child.exitcode == 0, f"the child ended with exit code {child.exitcode}"
    finally:
        if child.is_alive():
            child.kill()
            child.join()


def test_a_shared_block_is_not_reused_for_new_tensors_after_the_sender_frees_it(emu):
    from multiprocessing.reduction import ForkingPickler

    t = torch.full((1024,), 7.0, device="emu:0")
    reserved = emu.memory_reserved(0)
    ForkingPickler.dumps(t)  # what a queue does: the block becomes shareable
    assert emu.memory_reserved(0) == reserved
    del t
    assert emu.memory_reserved(0) == reserved - 4096  # unmapped, not cached for the next tensor
    again = torch.zeros(1024, device="emu:0")
    assert float(again.sum()) == 0.0


def test_an_emu_storage_sent_on_its_own_is_refused_clearly():
    from multiprocessing.reduction import ForkingPickler

    storage = torch.ones(4, device="emu").untyped_storage()
    with pytest.raises(RuntimeError, match="an emu storage cannot be sent between processes on its own: send a tensor"):
        ForkingPickler.dumps(storage)
