"""Sharing emu tensors between processes (``torch.multiprocessing``), as CUDA tensors are shared.

torch's own reducers (``torch.multiprocessing.reductions``) know CUDA's IPC handles and the host's
shared memory, nothing for a PrivateUse1 device: an emu tensor put in a ``torch.multiprocessing``
queue failed in the sending process's feeder thread (``_share_fd_: only available on CPU``) and
the receiver waited for ever. :func:`install` registers emu's reducer in front of torch's (every
other tensor still takes torch's path):

* the sender waits for the device's streams (queued copies have landed), and the block holding
  the tensor's storage becomes shareable: emu moves it, at the same address, onto a memory file
  (``memfd``) and sends that file's descriptor, its size and where the storage lies in it;
* the receiver (emu is loaded there on the way) maps the file as emu memory of the same device
  index and builds a tensor of the same dtype, sizes, strides and offset over it.

Both then use the same memory, as two processes sharing a CUDA allocation do: writes of one are
seen by the other after the writer synchronizes. ``tensor.share_memory_()`` is, as for CUDA, a
no-op (an emu tensor can always be sent). A shared block is not cached again when the sender frees
its tensor: it is unmapped, so new tensors never alias memory a receiver still holds. A storage sent
on its own (not through a tensor) is refused with an error saying to send a tensor.
"""

from __future__ import annotations

from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any

import torch

__all__ = ["install", "rebuild_emu_tensor"]

_installed = False


def rebuild_emu_tensor(handle: Any, mapped: int, offset: int, nbytes: int, device: int, dtype: torch.dtype,
                       size: tuple[int, ...], stride: tuple[int, ...], storage_offset: int,
                       requires_grad: bool) -> torch.Tensor:
    """In the receiving process: map the sender's block and build the tensor over it (loads emu first)."""
    import accel_emu
    from ._extension import load_extension

    accel_emu.load()
    fd = handle.detach()
    storage = load_extension().import_shared_block(fd, mapped, offset, nbytes, device).untyped_storage()
    tensor = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, storage_offset, size, stride)
    tensor.requires_grad_(requires_grad)
    return tensor


def _rebuild_empty(device: int, dtype: torch.dtype, size: tuple[int, ...], stride: tuple[int, ...],
                   requires_grad: bool) -> torch.Tensor:
    import accel_emu

    accel_emu.load()
    return torch.empty_strided(size, stride, dtype=dtype, device=f"emu:{device}").requires_grad_(requires_grad)


def _reduce_emu_tensor(tensor: torch.Tensor) -> tuple[Any, tuple[Any, ...]]:
    from ._extension import load_extension

    if tensor.layout != torch.strided:
        raise RuntimeError(f"emu tensors with layout {tensor.layout} cannot be shared between processes")
    index = tensor.device.index if tensor.device.index is not None else torch.emu.current_device()
    torch.emu.synchronize(index)
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:  # no memory to share
        return _rebuild_empty, (index, tensor.dtype, tuple(tensor.size()), tuple(tensor.stride()), tensor.requires_grad)
    fd, mapped, offset = load_extension().share_block(tensor)
    return rebuild_emu_tensor, (DupFd(fd), mapped, offset, storage.nbytes(), index, tensor.dtype,
                                tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset(),
                                tensor.requires_grad)


def _reducer(torch_reduce: Any) -> Any:
    def reduce(obj: Any) -> Any:
        if obj.device.type == "emu":
            return _reduce_emu_tensor(obj)
        return torch_reduce(obj)

    return reduce


def _storage_reducer(torch_reduce: Any) -> Any:
    def reduce(storage: Any) -> Any:
        if storage.device.type == "emu":
            raise RuntimeError("an emu storage cannot be sent between processes on its own: send a tensor over it "
                               "(torch.empty(0, device='emu').set_(storage)) instead")
        return torch_reduce(storage)

    return reduce


def install() -> None:
    """Register emu's reducers for tensors, parameters and storages with ``torch.multiprocessing``'s
    pickler (once; torch's reducers keep every other device)."""
    global _installed
    if _installed:
        return
    import torch.multiprocessing  # noqa: F401 - registers torch's reducers first, so emu's wrap them

    table = ForkingPickler._extra_reducers
    for cls in (torch.Tensor, torch.nn.Parameter):
        ForkingPickler.register(cls, _reducer(table[cls]))
    ForkingPickler.register(torch.UntypedStorage, _storage_reducer(table[torch.UntypedStorage]))
    _installed = True
