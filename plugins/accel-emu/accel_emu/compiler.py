"""torch.compile on emu: Dynamo's device interface and Inductor's code generator for the device.

emu memory is host memory, so Inductor generates host C++ kernels for emu exactly as it does for the
CPU (its ``CppScheduling``), and a Python wrapper that allocates buffers on emu and launches each
kernel through :func:`kernel_launcher`: the launch waits for the current stream of each emu tensor's
device and hands the kernel each emu tensor as a host tensor over its block's host window, as emu's
host fallback does for every eager kernel. Without it a generated kernel reading a device address
(mapped without access while ``ACCEL_EMU_PROTECT`` is on) would die with SIGSEGV.

Registration costs nothing at :func:`accel_emu.load`: importing Dynamo takes about a second, so the
device interface is registered right after ``torch._dynamo.device_interface`` is first imported, and
the code generator right after ``torch._inductor.compile_fx`` is (each at once when already imported).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import DEVICE_TYPE

__all__ = ["INTERFACE_MODULE", "INDUCTOR_MODULE", "is_registered", "kernel_launcher", "register"]

#: Dynamo's module holding the device interfaces; emu's is registered once it is imported
INTERFACE_MODULE = "torch._dynamo.device_interface"
#: Inductor's entry module; emu's code generator is registered once it is imported
INDUCTOR_MODULE = "torch._inductor.compile_fx"

_lock = threading.Lock()
_done: set[str] = set()
_pending: set[str] = set()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback`` right after the module ``name`` is first executed (a one-shot import hook)."""

    def __init__(self, name: str, callback: Callable[[], None]):
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> Any:
        """Hand back the module's ordinary spec with a loader that calls ``callback`` after it ran."""
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot, and the lookup below must not find us again
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_register(module: ModuleType) -> None:
            run_module(module)
            callback()

        spec.loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


def _once(name: str, action: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        with _lock:
            if name in _done:
                return
            _done.add(name)
        action()

    return run


def _register_interface() -> None:
    from torch._dynamo.device_interface import register_interface_for_device

    from ._compile_device import EmuInterface

    register_interface_for_device(DEVICE_TYPE, EmuInterface)
    for index in range(EmuInterface.device_count()):
        register_interface_for_device(f"{DEVICE_TYPE}:{index}", EmuInterface)


def _register_codegen() -> None:
    from ._compile_codegen import register_codegen

    register_codegen()


_ACTIONS = {INTERFACE_MODULE: _register_interface, INDUCTOR_MODULE: _register_codegen}


def register() -> None:
    """Make emu a device torch.compile can target (called by :func:`accel_emu.load`).

    Each part is registered now when torch has already imported its module, otherwise right after
    it does, so loading emu does not import Dynamo or Inductor.
    """
    for module, action in _ACTIONS.items():
        run = _once(module, action)
        if module in sys.modules:
            run()
            continue
        with _lock:
            if module in _pending:
                continue
            _pending.add(module)
        sys.meta_path.insert(0, _AfterImport(module, run))


def is_registered() -> dict[str, bool]:
    """Which parts are registered so far: Dynamo's device interface and Inductor's code generator."""
    return {"device_interface": INTERFACE_MODULE in _done, "inductor": INDUCTOR_MODULE in _done}


def kernel_launcher() -> Callable[..., Any]:
    """The callable Inductor's generated wrapper launches every emu kernel through:
    ``launch(kernel, *args)`` waits for the current stream of each emu tensor's device and calls
    ``kernel`` with each emu tensor replaced by a host tensor over its block's host window."""
    from ._extension import load_extension

    return load_extension().launch
