"""The ``emu_ccl`` collective backend: c10d collectives on emu tensors, staged through gloo.

A device's collective library (nccl for cuda, xccl for xpu) moves data between devices; emu's
devices are host memory, so ``emu_ccl`` copies emu tensors to the host, runs the collective on a
gloo process group built from the same store, and copies the result back. Registered for the
``emu`` device type, so ``init_process_group("cpu:gloo,emu:emu_ccl")`` or the default
device-to-backend map route emu tensors to it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

__all__ = ["register_comm_backend"]

_registered = False


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    import torch.distributed as dist

    from ._extension import load_extension

    host = dist.ProcessGroupGloo(dist.PrefixStore("emu_ccl/", store), rank, size, timeout)
    return load_extension().EmuCCL(host, rank, size)


def register_comm_backend() -> None:
    """Register ``emu_ccl`` with torch.distributed for the emu device (idempotent)."""
    global _registered
    if _registered:
        return
    import torch.distributed as dist

    from . import COMM_BACKEND, DEVICE_TYPE

    if not dist.is_available():
        return
    if COMM_BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(COMM_BACKEND, _create, devices=[DEVICE_TYPE])
    _registered = True
