"""accel's Backend for emu, found through the ``accel.backends`` entry point.

Importing this module is cheap (no extension build). The availability probe loads emu only
when it was asked for: ``ACCEL_DEVICE=emu``, ``accel ... --backend emu``, ``pytest -m emu`` or
``--backend emu`` in the harness (all of which call :meth:`EmuBackend.request`), or an earlier
:func:`accel_emu.load` in this process. PyTorch allows one PrivateUse1 backend per process, so a
machine with a vendor's own PrivateUse1 device must never have emu claim the slot by accident.
Capabilities are answered by probing the loaded device, as for any real backend.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from accel.backends.base import Availability, Capability, DeviceProperties
from accel.backends.device_module import DeviceModuleBackend

from . import COMM_BACKEND, DEVICE_TYPE, __version__, is_loaded, load

__all__ = ["EmuBackend"]

_NOT_REQUESTED = "emu is loaded only when asked for (ACCEL_DEVICE=emu, --backend emu or -m emu)"


class EmuBackend(DeviceModuleBackend):
    """The emulated accelerator: a PrivateUse1 device whose kernels run on the host."""

    name = DEVICE_TYPE
    device_type = DEVICE_TYPE
    visible_devices_env = "EMU_VISIBLE_DEVICES"
    start_method = "spawn"  # stream workers do not survive a fork, as on a real device
    fork_server_ranks = True  # the fork server imports torch only; emu loads in each rank
    priority = 50  # after the vendors' devices, before cpu; only ever available when requested
    use_host_timers = False  # emu has device events
    compile_backend = "inductor"  # host C++ kernels over emu memory (accel_emu.compiler)
    distributed_type = "MULTI_GPU"
    oom_messages = ("emu out of memory",)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._requested = False

    # ------------------------------------------------------------------ probing
    def request(self) -> None:
        """A caller asked for emu by name: let the next probe load it."""
        if not self._requested:
            self._requested = True
            self.__dict__.pop("availability", None)

    def _asked_for(self) -> bool:
        return self._requested or is_loaded() or os.environ.get("ACCEL_DEVICE", "").strip().lower() == DEVICE_TYPE

    def _load_module(self) -> Any:
        return getattr(torch, DEVICE_TYPE, None) if is_loaded() else None

    def _probe(self) -> Availability:
        if not self._asked_for():
            return Availability(False, _NOT_REQUESTED)
        try:
            load()
        except Exception as exc:
            return Availability(False, f"loading emu failed: {type(exc).__name__}: {exc}")
        self._module = None  # look the module up again now that it is registered
        available = super()._probe()
        if available:
            mem = self.module.get_device_properties(0).total_memory
            return Availability(True, f"{available.reason}, {mem / 2**30:.1f} GiB each (ACCEL_EMU_MEMORY)")
        return available

    def runtime_initialized(self) -> bool:
        """Exact for emu: its runtime counts as started once device memory or a stream is used, and only
        then does a forked child lose it (its stream workers); loading and probing start nothing."""
        return is_loaded() and bool(self.module.is_initialized())

    def _why_not_available(self) -> str:
        return "torch.emu.is_available() is False: EMU_VISIBLE_DEVICES hides every emu device"

    def device_environment(self) -> dict[str, str]:
        """emu's own settings as set here, and the extension's build folder (so an isolated child run,
        whose home folder is a fresh one, reuses the build instead of compiling again)."""
        from ._extension import build_dir

        names = ("ACCEL_EMU_DEVICES", "ACCEL_EMU_MEMORY", "ACCEL_EMU_PROTECT", "EMU_VISIBLE_DEVICES")
        env = {name: os.environ[name] for name in names if name in os.environ}
        env["ACCEL_EMU_BUILD_DIR"] = str(build_dir())
        return env

    # ------------------------------------------------------------------ collectives
    @property
    def comm_backend(self) -> str | None:
        import torch.distributed as dist

        if not dist.is_available() or not self.is_available():
            return None
        return COMM_BACKEND if COMM_BACKEND.upper() in dist.Backend._plugins else None

    def comm_backend_reason(self) -> str:
        import torch.distributed as dist

        if not dist.is_available():
            return "torch.distributed is not available in this build"
        if not self.is_available():
            return f"backend unavailable: {self.availability.reason}"
        return f"the {COMM_BACKEND} collective backend is not registered"

    # ------------------------------------------------------------------ DeepSpeed
    @property
    def deepspeed_accelerator(self) -> str | None:
        """emu's own DeepSpeed accelerator (DeepSpeed's list has no emu); accel installs it with
        ``deepspeed.accelerator.set_accelerator`` wherever DeepSpeed runs on emu."""
        return "accel_emu.deepspeed_accelerator:EmuAccelerator"

    # ------------------------------------------------------------------ memory
    @property
    def memory_stats_capability(self) -> Capability:
        if not self.is_available():
            return Capability(False, f"backend unavailable: {self.availability.reason}")
        try:
            stats = self.module.memory_stats(0)
        except Exception as exc:
            return Capability(False, f"torch.emu.memory_stats failed: {type(exc).__name__}: {exc}")
        if "allocated_bytes.all.current" not in stats:
            return Capability(False, "torch.emu.memory_stats has no allocated_bytes.all.current")
        return Capability(True, "torch.emu allocator statistics")

    # ------------------------------------------------------------------ AMP
    def amp_capability(self, dtype: torch.dtype) -> Capability:
        """Probed on the device (``Backend.probe_autocast``): emu has autocast lists for fp16 and bf16."""
        return self.probe_autocast(dtype)

    @property
    def grad_scaler_capability(self) -> Capability:
        cap = self.amp_capability(torch.float16)
        if not cap:
            return Capability(False, f"no fp16 autocast, so no GradScaler: {cap.reason}")
        try:
            param = torch.nn.Parameter(torch.ones(2, device=self.device(0)))
            param.grad = torch.full((2,), 4.0, device=self.device(0))
            scaler = torch.amp.GradScaler(self.autocast_device_type, init_scale=2.0)
            optimizer = torch.optim.SGD([param], lr=0.0)
            scaler.scale(param.sum())
            scaler.unscale_(optimizer)
            value = float(param.grad[0].item())
        except Exception as exc:
            return Capability(False, f"GradScaler({self.autocast_device_type!r}) failed: {type(exc).__name__}: {exc}")
        if value != 2.0:
            return Capability(False, f"GradScaler unscale gave {value}, expected 2.0")
        return Capability(True, f"torch.amp.GradScaler({self.autocast_device_type!r})")

    # ------------------------------------------------------------------ description
    def device_properties(self, index: int = 0) -> DeviceProperties:
        props = self.module.get_device_properties(index)
        return DeviceProperties(
            index=index,
            name=props.name,
            total_memory=props.total_memory,
            runtime_version=self.runtime_version(),
            extra={"physical_index": props.physical_index, "memory_protection": self._protection()},
        )

    def _protection(self) -> bool:
        from ._extension import load_extension

        return bool(load_extension().protection_enabled())

    def runtime_version(self) -> str | None:
        return f"accel-emu {__version__}"
