"""A device profile: one declarative file that makes a backend, with claims the harness checks.

A vendor describes its device in YAML or TOML (or reuses a transformers-style ``spec.py``) instead of
writing a :class:`~accel.backends.base.Backend` subclass::

    device: {name: mycpu, device_type: cpu}
    hooks: {seed: "torch:manual_seed", get_rng_state: "torch:get_rng_state"}
    capabilities: {dtypes: [fp32, bf16], autocast: [bf16], collectives: true}
    tolerances: {bf16: {training: 0.05}}
    known_issues: [...]

:func:`load_profile` validates the file (errors name the file, line and key, with a "did you mean";
:mod:`accel.backends.profile_load`) and :class:`ProfileBackend` turns it into a backend; what a profile
is lives in :mod:`accel.backends.profile_spec`, and every name stays importable from here. A hook the profile does not name is filled, in
order, from ``torch.accelerator`` (when it drives the profile's device type), from the device module
(``torch.<module>``) and from accel's built-in backend for the same device type. ``docs/profile.md``
is the reference for every field.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable

import torch

from .base import Availability, Backend, Capability, DeviceProperties
from .device_module import properties_from_module
from .profile_load import (  # noqa: F401 - the loader's private names stay importable from here too
    _CAPABILITY_KEYS,
    _DEVICE_KEYS,
    _SECTIONS,
    _SPEC_NAMES,
    _SPEC_NONE_IS_NO_OP,
    _from_spec,
    _line,
    _read_toml,
    _read_yaml,
    _spec_key,
    _tolerance_value,
    _validate,
    load_profile,
    spec_no_op,
)
from .profile_spec import (  # noqa: F401
    _DTYPE_ALIASES,
    _STRING_HOOKS,
    CAPABILITY_AREAS,
    HOOKS,
    DeviceProfile,
    ProfileError,
    _suggest,
    canonical_dtype,
    resolve_callable,
)

__all__ = [
    "CAPABILITY_AREAS",
    "HOOKS",
    "DeviceProfile",
    "ProfileBackend",
    "ProfileError",
    "canonical_dtype",
    "load_profile",
    "resolve_callable",
    "spec_no_op",
]

# module attribute names that stand in for a hook the profile leaves out
_MODULE_NAMES = {"seed": ("manual_seed_all", "manual_seed")}


# ---------------------------------------------------------------------------- the backend
_NOT_FOUND = object()


class ProfileBackend(Backend):
    """A backend made from a :class:`DeviceProfile` alone, no plug-in code.

    Each operation uses the profile's hook; a hook it leaves out comes from ``torch.accelerator``
    (when that drives the profile's device type), then the device module, then accel's built-in
    backend for the device type. An operation none of them provides raises
    :class:`~accel.backends.base.UnsupportedFeatureError` naming the missing hook.
    """

    priority = 50  # a profile asked for explicitly comes before the detected built-ins

    def __init__(self, profile: DeviceProfile, torch_version: Any = None):
        super().__init__(torch_version)
        self.profile = profile
        self.name = profile.name
        self.device_type = profile.device_type
        extra = profile.device_extra
        self._use_host_timers: bool | None = None  # None: decided by what provides events (see use_host_timers)
        base = self.base
        for attr in ("start_method", "visible_devices_env", "distributed_type", "oom_messages", "use_host_timers",
                     "compile_backend", "memory_is_host"):
            if attr in extra:
                setattr(self, attr, extra[attr])
            elif base is not None:
                setattr(self, attr, getattr(base, attr))
        if "ranks_share_device" in extra:
            self.ranks_share_device = extra["ranks_share_device"]

    @functools.cached_property
    def base(self) -> Backend | None:
        """accel's built-in backend for this device type, or None (the last source of missing hooks)."""
        from .builtin import builtin_factories

        for factory in builtin_factories():
            if getattr(factory, "device_type", None) == self.device_type:
                return factory(self._torch_version) if isinstance(factory, type) else factory()
        return None

    @property
    def module(self) -> Any:
        """``torch.<module>`` (the profile's ``device.module``, else the device type), or None.

        Found once it exists: a plug-in may register it only when the profile's ``is_available`` hook
        loads the device, so a lookup before that is not remembered."""
        found = self.__dict__.get("_module")
        if found is None:
            found = getattr(torch, self.module_name, None)
            if found is not None:
                self.__dict__["_module"] = found
        return found

    @property
    def module_name(self) -> str:
        """The name of the device module under ``torch`` (``device.module``, else the device type)."""
        return self.profile.module or self.device_type

    @property
    def use_host_timers(self) -> bool:
        """Whether the timer reads the host clock: as the built-in backend for the device type says, else
        True exactly when the device module has no ``Event`` to time with."""
        if self._use_host_timers is not None:
            return self._use_host_timers
        return self._module_callable("Event") is None

    @use_host_timers.setter
    def use_host_timers(self, value: bool) -> None:
        self._use_host_timers = bool(value)

    def _module_callable(self, attr: str) -> Callable[..., Any] | None:
        """``torch.<module>.<attr>`` when the device module has it and it is callable, else None."""
        found = getattr(self.module, attr, None) if self.module is not None else None
        return found if callable(found) else None

    def _from_module(self, attr: str, feature: str) -> Callable[..., Any]:
        """``torch.<module>.<attr>`` for ``feature`` where no built-in backend covers the device type; an
        UnsupportedFeatureError names what is missing otherwise."""
        found = self._module_callable(attr)
        if found is None:
            where = (f"torch.{self.module_name} has no {attr}" if self.module is not None
                     else f"torch has no {self.module_name} module")
            raise self.unsupported(feature, f"profile {self.profile.name!r}: no built-in backend for {self.device_type!r} "
                                            f"and {where}")
        return found

    @functools.cached_property
    def accelerator(self) -> Any:
        """``torch.accelerator`` when this torch has it and it drives the profile's device type."""
        acc = getattr(torch, "accelerator", None)
        try:
            current = acc.current_accelerator() if acc is not None else None
        except Exception:
            current = None
        return acc if current is not None and current.type == self.device_type else None

    @functools.lru_cache(maxsize=None)  # noqa: B019 - backends live for the process
    def hook(self, name: str) -> Any:
        """The callable behind ``name`` (see the class docstring), None when the profile says "none",
        or a missing marker when nothing provides it."""
        given = self.profile.hooks.get(name, _NOT_FOUND)
        if given is not _NOT_FOUND:
            return None if given is None else resolve_callable(given, f"hooks.{name}")
        attrs = _MODULE_NAMES.get(name, (name,))
        for source in (self.accelerator, self.module):
            for attr in attrs:
                fn = getattr(source, attr, None) if source is not None else None
                if callable(fn):
                    return fn
        return _NOT_FOUND

    def hook_source(self, name: str) -> str:
        """Where ``name`` comes from: "profile", "torch.accelerator", "torch.<module>", "built-in" or "none"."""
        if name in self.profile.hooks:
            return "profile"
        fn = self.hook(name)
        if fn is _NOT_FOUND:
            return "built-in" if self.base is not None else "none"
        for source, label in ((self.accelerator, "torch.accelerator"), (self.module, f"torch.{self.module_name}")):
            if source is not None and any(getattr(source, a, None) is fn for a in _MODULE_NAMES.get(name, (name,))):
                return label
        return "none"

    def _call(self, name: str, index: int | None, *args: Any, fallback: Callable[[], Any] | None = None,
              none_means: Any = _NOT_FOUND) -> Any:
        fn = self.hook(name)
        if fn is None:
            if none_means is not _NOT_FOUND:
                return none_means
            raise self.unsupported(name, f"profile {self.profile.name!r} sets hooks.{name} to none")
        if fn is _NOT_FOUND:
            if fallback is not None and self.base is not None:
                return fallback()
            raise self.unsupported(name, f"profile {self.profile.name!r} names no hooks.{name} and neither torch.accelerator "
                                         f"nor torch.{self.profile.module or self.device_type} provides one")
        if index is not None and _takes_argument(fn, len(args) + 1):
            return fn(*args, index)
        return fn(*args)

    # ------------------------------------------------------------------ probing and devices
    def _probe(self) -> Availability:
        source = self.hook("is_available")
        if callable(source):
            if not source():
                return Availability(False, f"profile {self.profile.name!r}: is_available() is False")
        elif self.base is not None and not self.base.is_available():
            return Availability(False, f"profile {self.profile.name!r}: {self.base.availability.reason}")
        count = self.device_count_raw()
        if count < 1:
            return Availability(False, f"profile {self.profile.name!r}: device_count() is {count}")
        return Availability(True, f"profile {self.profile.name!r} ({self.profile.format}): {count} {self.device_type} device(s)")

    def device_count_raw(self) -> int:
        """The device count the hook reports, without asking availability first (the probe uses it)."""
        return int(self._call("device_count", None, fallback=lambda: self.base.device_count()))

    def device_count(self) -> int:
        return self.device_count_raw() if self.is_available() else 0

    def device(self, index: int | None = None) -> torch.device:
        if self.base is not None and self.device_type == getattr(self.base, "device_type", None):
            return self.base.device(index)
        return super().device(index)

    def devices(self) -> list[torch.device]:
        return self.base.devices() if self.base is not None else super().devices()

    def set_device(self, index: int) -> None:
        if self.base is not None:
            self.base.set_device(index)
        elif self.module is not None and hasattr(self.module, "set_device"):
            self.module.set_device(index)
        else:
            raise self.unsupported("set_device", f"torch.{self.device_type} has no set_device")

    def current_device(self) -> int:
        if self.base is not None:
            return self.base.current_device()
        if self.module is not None and hasattr(self.module, "current_device"):
            return int(self.module.current_device())
        return 0

    def synchronize(self, index: int | None = None) -> None:
        self._call("synchronize", index, fallback=lambda: self.base.synchronize(index), none_means=None)

    # ------------------------------------------------------------------ DeepSpeed
    @property
    def deepspeed_accelerator(self) -> str | None:
        """The profile's ``hooks.deepspeed_accelerator``, else the built-in backend's answer for this device type."""
        if self.profile.deepspeed_accelerator:
            return self.profile.deepspeed_accelerator
        return self.base.deepspeed_accelerator if self.base is not None else None

    # ------------------------------------------------------------------ collectives
    @property
    def comm_backend(self) -> str | None:
        if self.profile.comm_backend:
            return self.profile.comm_backend
        if self.base is not None:
            return self.base.comm_backend
        from torch.distributed import Backend as DistBackend

        return DistBackend.default_device_backend_map.get(self.device_type)

    def comm_backend_reason(self) -> str:
        return f"profile {self.profile.name!r} names no hooks.comm_backend and torch has no default for {self.device_type}"

    # ------------------------------------------------------------------ RNG
    def manual_seed(self, seed: int) -> None:
        self._call("seed", None, seed, fallback=lambda: self.base.manual_seed(seed))

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        return self._call("get_rng_state", index, fallback=lambda: self.base.get_rng_state(index))

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        self._call("set_rng_state", index, state, fallback=lambda: self.base.set_rng_state(state, index))

    # ------------------------------------------------------------------ memory
    @property
    def memory_stats_capability(self) -> Capability:
        fn = self.hook("memory_allocated")
        if callable(fn):
            return Capability(True, f"hooks.memory_allocated ({self.hook_source('memory_allocated')})")
        if fn is _NOT_FOUND and self.base is not None:
            return self.base.memory_stats_capability
        return Capability(False, f"profile {self.profile.name!r} has no memory_allocated hook")

    def memory_allocated(self, index: int | None = None) -> int:
        self._require_memory_stats("memory_allocated")
        return int(self._call("memory_allocated", index, fallback=lambda: self.base.memory_allocated(index)))

    def max_memory_allocated(self, index: int | None = None) -> int:
        self._require_memory_stats("max_memory_allocated")
        return int(self._call("max_memory_allocated", index, fallback=lambda: self.base.max_memory_allocated(index)))

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        self._require_memory_stats("reset_peak_memory_stats")
        self._call("reset_peak_memory_stats", index, fallback=lambda: self.base.reset_peak_memory_stats(index))

    def memory_reserved(self, index: int | None = None) -> int:
        if self.base is not None and self.base.has_memory_stats:
            return self.base.memory_reserved(index)
        return self.memory_allocated(index)

    def mem_get_info(self, index: int | None = None) -> tuple[int, int]:
        if self.base is not None:
            return self.base.mem_get_info(index)
        return super().mem_get_info(index)

    def empty_cache(self) -> None:
        self._call("empty_cache", None, fallback=lambda: self.base.empty_cache(), none_means=None)

    # ------------------------------------------------------------------ streams, events, copies
    # the built-in backend for the device type answers when there is one, else the device module's
    # Stream, current_stream, stream and Event (what torch.cuda and the PrivateUse1 modules offer)
    def stream(self) -> Any:
        if self.base is not None:
            return self.base.stream()
        return self._from_module("Stream", "streams")()

    def current_stream(self) -> Any:
        if self.base is not None:
            return self.base.current_stream()
        return self._from_module("current_stream", "streams")()

    def stream_context(self, stream: Any) -> contextlib.AbstractContextManager:
        if self.base is not None:
            return self.base.stream_context(stream)
        return self._from_module("stream", "streams")(stream)

    def event(self, enable_timing: bool = False) -> Any:
        if self.base is not None:
            return self.base.event(enable_timing)
        return self._from_module("Event", "events")(enable_timing=enable_timing)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.base.pin_memory(tensor) if self.base is not None else tensor

    # ------------------------------------------------------------------ AMP
    def amp_capability(self, dtype: torch.dtype) -> Capability:
        """Probed on the device: a tiny matmul under ``torch.autocast`` must come out in ``dtype``."""
        return self._amp_probe(dtype)

    @functools.lru_cache(maxsize=None)  # noqa: B019 - backends live for the process
    def _amp_probe(self, dtype: torch.dtype) -> Capability:
        return self.probe_autocast(dtype)

    @property
    def grad_scaler_capability(self) -> Capability:
        return self.grad_scaler_after_fp16(build=True)

    # ------------------------------------------------------------------ description
    def device_properties(self, index: int = 0) -> DeviceProperties:
        if self.base is not None:
            props = self.base.device_properties(index)
        elif self._module_callable("get_device_properties") is not None:
            props = properties_from_module(self.module, index, self.device_type)
        else:
            props = DeviceProperties(index=index, name=self.device_type)
        props.extra = {**props.extra, "profile": self.profile.name}
        return props

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["profile"] = {"path": str(self.profile.path) if self.profile.path else None, "sha256": self.profile.sha256,
                           "hooks": {h: self.hook_source(h) for h in HOOKS}}
        return info


def _takes_argument(fn: Callable[..., Any], count: int) -> bool:
    """Whether ``fn`` accepts ``count`` positional arguments (unknown signatures: yes)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    try:
        sig.bind(*range(count))
    except TypeError:
        return False
    return True
