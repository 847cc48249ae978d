"""Shared implementation for backends driven by a ``torch.<device>`` module (cuda, xpu, hpu, mps).

The device module is looked up lazily and can be injected (``module=``) so the logic is testable
on a machine without the device: tests hand in a fake module and exercise the real code paths.
Where the installed torch has the device-generic ``torch.accelerator`` API and it is driving this
device type, it is preferred; otherwise the per-device module answers.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from packaging.version import Version

from .base import Availability, Backend, Capability, DeviceProperties

_MISSING = object()


def properties_from_module(module: Any, index: int, device_type: str, runtime_version: str | None = None) -> DeviceProperties:
    """:class:`DeviceProperties` of device ``index`` from ``module.get_device_properties`` (``torch.cuda``,
    ``torch.xpu`` and the PrivateUse1 modules answer it alike); shared by the module and profile backends."""
    props = module.get_device_properties(index)
    extra = {
        key: getattr(props, key)
        for key in ("major", "minor", "multi_processor_count", "gcnArchName", "driver_version", "platform_name")
        if hasattr(props, key)
    }
    total = getattr(props, "total_memory", None)
    return DeviceProperties(
        index=index,
        name=str(getattr(props, "name", device_type)),
        total_memory=int(total) if total is not None else None,
        driver_version=str(extra.pop("driver_version")) if "driver_version" in extra else None,
        runtime_version=runtime_version,
        extra=extra,
    )


class DeviceModuleBackend(Backend):
    """A backend whose operations map onto ``torch.<device_type>``."""

    #: minimum torch release for memory statistics (None: always there)
    memory_stats_min_torch: str | None = None
    #: minimum torch release for autocast per dtype name ("float16"/"bfloat16"); None: always
    amp_min_torch: dict[str, str] = {}

    def __init__(
        self,
        torch_version: Version | str | None = None,
        module: Any = None,
        accelerator: Any = _MISSING,
    ):
        super().__init__(torch_version)
        self._module = module
        self._accelerator = accelerator

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the device modules it caches (a module cannot be pickled: a prepared data
        loader or a saved object that holds the backend would fail); they are looked up again."""
        state = self.__dict__.copy()
        state["_module"] = None
        state.pop("_accelerator", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._accelerator = _MISSING

    # ------------------------------------------------------------------ module lookup
    @property
    def module(self) -> Any:
        """The ``torch.<device>`` module, or None when this torch build lacks it."""
        if self._module is None:
            self._module = self._load_module()
        return self._module

    def _load_module(self) -> Any:
        return getattr(torch, self.device_type, None)

    @property
    def accelerator(self) -> Any:
        """``torch.accelerator`` when it exists and drives this device type, else None."""
        if self._accelerator is _MISSING:
            self._accelerator = None
            acc = getattr(torch, "accelerator", None)
            if acc is not None and hasattr(acc, "current_accelerator"):
                try:
                    current = acc.current_accelerator()
                except Exception:
                    current = None
                if current is not None and current.type == self.device_type:
                    self._accelerator = acc
        return self._accelerator

    def _api(self, name: str) -> Any:
        """``torch.accelerator.<name>`` when present, else ``module.<name>``."""
        acc = self.accelerator
        if acc is not None and hasattr(acc, name):
            return getattr(acc, name)
        return getattr(self.module, name)

    # ------------------------------------------------------------------ probing
    def _probe(self) -> Availability:
        module = self.module
        if module is None:
            return Availability(False, self._why_no_module())
        if not module.is_available():
            return Availability(False, self._why_not_available())
        count = module.device_count()
        if count < 1:
            return Availability(False, f"torch.{self.device_type}.is_available() is True but device_count() is {count}")
        return Availability(True, f"{count} device(s) visible")

    def _why_no_module(self) -> str:
        return f"torch {self.torch_version} has no torch.{self.device_type} module"

    def _why_not_available(self) -> str:
        hint = ""
        if self.visible_devices_env and self.visible_devices_env in os.environ:
            hint = f"; {self.visible_devices_env}={os.environ[self.visible_devices_env]!r} may hide devices"
        return f"torch.{self.device_type}.is_available() is False: no device or driver found{hint}"

    # ------------------------------------------------------------------ devices
    def device_count(self) -> int:
        if not self.is_available():
            return 0
        if self.accelerator is not None:
            return self.accelerator.device_count()
        return self.module.device_count()

    def set_device(self, index: int) -> None:
        """Make device ``index`` current. ``torch.<device>.set_device`` does it when the module has one, so
        whatever replaced it (a test that patches it, as Accelerate's do) is obeyed and the module refuses
        an index it does not have; otherwise the index is range-checked and ``torch.accelerator`` sets it."""
        module_set = getattr(self.module, "set_device", None)
        if callable(module_set):
            module_set(index)
            return
        self.device(index)  # range check with a clear message
        if self.accelerator is not None and hasattr(self.accelerator, "set_device_index"):
            self.accelerator.set_device_index(index)
        else:
            raise self.unsupported("set_device", f"torch.{self.device_type} has no set_device and torch.accelerator "
                                                 "does not drive this device")

    def current_device(self) -> int:
        if self.accelerator is not None and hasattr(self.accelerator, "current_device_index"):
            return self.accelerator.current_device_index()
        return self.module.current_device()

    def synchronize(self, index: int | None = None) -> None:
        if index is None:
            self._api("synchronize")()
        else:
            self._api("synchronize")(index)

    # ------------------------------------------------------------------ RNG
    def manual_seed(self, seed: int) -> None:
        self.module.manual_seed_all(seed)

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        return self.module.get_rng_state(self._index(index))

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        self.module.set_rng_state(state, self._index(index))

    def _index(self, index: int | None) -> int:
        return self.current_device() if index is None else index

    # ------------------------------------------------------------------ memory
    @property
    def memory_stats_capability(self) -> Capability:
        need = self.memory_stats_min_torch
        if need and self.torch_version < Version(need):
            return Capability(False, f"{self.name} memory statistics need torch >= {need} (installed {self.torch_version})")
        return Capability(True, f"torch.{self.device_type} allocator statistics")

    def _memory_call(self, feature: str, index: int | None) -> Any:
        self._require_memory_stats(feature)
        return self._api(feature)(self._index(index))

    def memory_allocated(self, index: int | None = None) -> int:
        return int(self._memory_call("memory_allocated", index))

    def memory_reserved(self, index: int | None = None) -> int:
        return int(self._memory_call("memory_reserved", index))

    def max_memory_allocated(self, index: int | None = None) -> int:
        return int(self._memory_call("max_memory_allocated", index))

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        self._memory_call("reset_peak_memory_stats", index)

    def mem_get_info(self, index: int | None = None) -> tuple[int, int]:
        self._require_memory_stats("mem_get_info")
        acc = self.accelerator
        if acc is not None and hasattr(acc, "get_memory_info"):
            free, total = acc.get_memory_info(self._index(index))
        else:
            free, total = self.module.mem_get_info(self._index(index))
        return int(free), int(total)

    def empty_cache(self) -> None:
        if self.is_available():
            self._api("empty_cache")()

    # ------------------------------------------------------------------ streams and events
    def stream(self) -> Any:
        return self.module.Stream()

    def current_stream(self) -> Any:
        return self.module.current_stream()

    def stream_context(self, stream: Any) -> contextlib.AbstractContextManager:
        return self.module.stream(stream)

    def event(self, enable_timing: bool = False) -> Any:
        return self.module.Event(enable_timing=enable_timing)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory()

    # ------------------------------------------------------------------ AMP
    def amp_capability(self, dtype: torch.dtype) -> Capability:
        key = str(dtype).removeprefix("torch.")
        need = self.amp_min_torch.get(key)
        if need and self.torch_version < Version(need):
            return Capability(False, f"{self.name} {key} autocast needs torch >= {need} (installed {self.torch_version})")
        if not self.is_available():
            return Capability(False, f"backend unavailable: {self.availability.reason}")
        return self.dtype_capability(dtype)

    @property
    def grad_scaler_capability(self) -> Capability:
        return self.grad_scaler_after_fp16()

    # ------------------------------------------------------------------ description
    def device_properties(self, index: int = 0) -> DeviceProperties:
        return properties_from_module(self.module, index, self.device_type, self.runtime_version())

    def runtime_version(self) -> str | None:
        return None
