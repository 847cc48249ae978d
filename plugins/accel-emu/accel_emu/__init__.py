"""accel-emu: an emulated accelerator ("emu") for PyTorch, installed as an out-of-tree backend.

emu is a real PrivateUse1 device: its own allocator, device guard, streams, events, generators,
autocast policies and a c10d collective backend, with operators on dense tensors computed on the
host by the boxed CPU fallback (sparse layouts are refused). Importing this package is cheap and changes nothing; :func:`load` (or
``ACCEL_DEVICE=emu``/``--backend emu`` through accel) builds and loads the C++ extension and
claims the process's single PrivateUse1 slot.
"""

from __future__ import annotations

import threading
from types import ModuleType

__all__ = ["DEVICE_TYPE", "COMM_BACKEND", "fallback_calls", "fallback_results_copied", "host_outputs_on_device", "is_loaded",
           "load", "reset_fallback_calls"]

#: torch device type of the emulated accelerator
DEVICE_TYPE = "emu"
#: name of the torch.distributed backend registered for emu tensors
COMM_BACKEND = "emu_ccl"
__version__ = "0.1.0"

_lock = threading.Lock()
_loaded = False


def is_loaded() -> bool:
    """True once :func:`load` has registered emu in this process."""
    return _loaded


def load() -> ModuleType:
    """Build (first time only) and load the extension, register ``torch.emu``; returns it.

    Raises RuntimeError when another PrivateUse1 backend already owns this process.
    """
    global _loaded
    with _lock:
        import torch

        if _loaded:
            return torch.emu  # type: ignore[attr-defined]
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", DEVICE_TYPE):
            raise RuntimeError(
                f"cannot load emu: this process already uses PrivateUse1 for {current!r} "
                "(PyTorch allows one PrivateUse1 backend per process)"
            )
        if current != DEVICE_TYPE:
            torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
        from . import device as device_module
        from ._extension import load_extension

        load_extension()
        torch._register_device_module(DEVICE_TYPE, device_module)
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )
        from .distributed import register_comm_backend

        register_comm_backend()
        from .compiler import register as register_compiler

        register_compiler()  # torch.compile's device interface and code generator, as torch imports them
        import atexit

        from ._autograd_exit import settle

        atexit.register(settle)  # before the interpreter finalizes: see _autograd_exit
        _loaded = True
        return device_module


def fallback_calls() -> list[tuple[str, str, int]]:
    """Operators computed by the host fallback since the last reset: ``(name, path, calls)``.

    ``path`` is ``"direct"`` (the kernel ran on host tensors over the operands' host windows) or
    ``"copying"`` (operands copied to the host and results back: view operators and resizing ones).
    A profiling aid: an operator that copies where it could run directly shows here.
    """
    from ._extension import load_extension

    return [(str(name), str(path), int(calls)) for name, path, calls in load_extension().fallback_calls()]


def fallback_results_copied() -> int:
    """New results of the fallback's direct path copied into fresh device memory since the last reset.

    A host kernel run for emu allocates its results in device memory (:func:`host_outputs_on_device`),
    and they become emu tensors without a copy; a result whose memory cannot be taken over (another
    tensor shares it, or the kernel made it elsewhere) is copied and counted here.
    """
    from ._extension import load_extension

    return int(load_extension().fallback_results_copied())


def host_outputs_on_device() -> bool:
    """True when host kernels run for emu allocate their results in device memory: emu's host allocator,
    installed when the extension loads, holds the host's place (a host allocator of a higher priority
    would keep it, and results would then be copied)."""
    from ._extension import load_extension

    return bool(load_extension().host_outputs_on_device())


def reset_fallback_calls() -> None:
    """Set the counts of :func:`fallback_calls` and :func:`fallback_results_copied` back to zero."""
    from ._extension import load_extension

    load_extension().reset_fallback_calls()
