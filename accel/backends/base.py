"""The Backend contract: everything the rest of accel may ask about a device.

Only modules under ``accel/backends/`` touch device modules (``torch.cuda``, ``torch.xpu``, ...).
Everything else holds a :class:`Backend` and asks it questions. A feature a backend (or the
installed torch) lacks raises :class:`UnsupportedFeatureError` with the reason, so callers and
reports can say *why* instead of getting a silent ``None`` or ``0``.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from packaging.version import Version

from .host import is_host_device

__all__ = [
    "Availability",
    "Backend",
    "BackendError",
    "BackendUnavailableError",
    "Capability",
    "DeviceProperties",
    "Timer",
    "UnsupportedFeatureError",
    "torch_version",
]


class BackendError(RuntimeError):
    """Base class of the errors the backend layer raises."""


class BackendUnavailableError(BackendError):
    """A backend was asked for but cannot be used on this machine (the message says why)."""


class UnsupportedFeatureError(BackendError, NotImplementedError):
    """A backend, or the installed torch, does not provide a feature."""

    def __init__(self, backend: str, feature: str, reason: str):
        self.backend = backend
        self.feature = feature
        self.reason = reason
        super().__init__(f"{backend}: {feature} is not supported ({reason})")


@functools.lru_cache(maxsize=None)
def torch_version() -> Version:
    """The installed torch release, without local build tags (``2.13.0+cpu`` -> ``2.13.0``)."""
    return Version(Version(torch.__version__).base_version)


@dataclass(frozen=True)
class Availability:
    """Whether a backend can be used here and, either way, why."""

    available: bool
    reason: str

    def __bool__(self) -> bool:
        return self.available


@dataclass(frozen=True)
class Capability:
    """One capability answer: supported or not, and the reason."""

    supported: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.supported


@dataclass
class DeviceProperties:
    """What reports need to know about one device."""

    index: int
    name: str
    total_memory: int | None = None
    driver_version: str | None = None
    runtime_version: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Timer:
    """Times a region on a backend; synchronizes before reading any clock.

    Device events are used when the backend supports them (the time then excludes host launch
    overhead of the region's surroundings); otherwise host ``perf_counter`` after a synchronize.
    ``elapsed`` is in seconds.
    """

    def __init__(self, backend: "Backend"):
        self.backend = backend
        self.elapsed: float | None = None
        self._use_events = not backend.use_host_timers
        self._start: Any = None
        self._end: Any = None

    def __enter__(self) -> "Timer":
        self.elapsed = None
        if self._use_events:
            self._start = self.backend.event(enable_timing=True)
            self._end = self.backend.event(enable_timing=True)
            self._start.record()
        else:
            self.backend.synchronize()
            self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._use_events:
            self._end.record()
            self._end.synchronize()
            self.elapsed = self._start.elapsed_time(self._end) / 1000.0
        else:
            self.backend.synchronize()
            self.elapsed = time.perf_counter() - self._start


class Backend(abc.ABC):
    """A hardware backend. Subclasses set the class attributes and define the contract's abstract methods.

    The contract, in one place: every backend answers ``_probe``, ``device_count``, ``set_device``,
    ``current_device``, ``synchronize``, ``comm_backend``, ``manual_seed``, ``get_rng_state``,
    ``set_rng_state``, ``grad_scaler_capability`` and ``device_properties`` (a class that leaves one out
    cannot be instantiated). The rest has a default that holds for any device: memory statistics,
    streams and events are unsupported (with the reason), ``amp_capability`` runs the autocast probe,
    ``empty_cache`` and ``pin_memory`` do nothing, and DeepSpeed chooses its own accelerator
    (``deepspeed_accelerator`` is None).

    Instances are cheap; probing (``availability``) runs once and is cached. ``torch_version``
    can be passed to ask what the backend would support under another torch release, which is how
    version-dependent capabilities are tested.
    """

    #: registry name, also the pytest marker and the ``ACCEL_DEVICE`` value
    name: str = ""
    #: torch device type used in ``torch.device(...)``
    device_type: str = ""
    #: environment variable that restricts the visible devices (None: no such thing)
    visible_devices_env: str | None = None
    #: multiprocessing start method for worker processes
    start_method: str = "spawn"
    #: True when a spawn-only device's worker processes may instead fork from a fork server (multiprocessing's
    #: ``forkserver``) that imported torch (and what every rank imports) but never touched the device: each rank
    #: then starts without fresh imports. Only for devices whose runtime is documented (or tested) to work there.
    fork_server_ranks: bool = False
    #: probe order: lower is tried first (cpu is last)
    priority: int = 100
    #: True when device events are unreliable/absent and host timers must be used
    use_host_timers: bool = False
    #: the torch.compile backend that fits this device
    compile_backend: str = "inductor"
    #: Accelerate's DistributedType member used when this backend runs several processes
    distributed_type: str = "MULTI_GPU"
    #: substrings of an out-of-memory error message on this backend
    oom_messages: tuple[str, ...] = ()
    #: True when the device's memory is the host's own RAM: filling it would take the machine down,
    #: so tests that allocate until the device refuses do not run there
    memory_is_host: bool = False

    @property
    def is_host(self) -> bool:
        """True for the host itself (torch's ``cpu`` device): there is no separate device to select, seed,
        snapshot or offload to. The one place the rest of accel learns it for a backend (for a device:
        :func:`accel.backends.is_host_device`); nothing outside ``accel/backends`` compares with ``"cpu"``."""
        return is_host_device(self.device_type)

    def __init__(self, torch_version: Version | str | None = None):
        self._torch_version = Version(Version(str(torch_version)).base_version) if torch_version else None

    # ------------------------------------------------------------------ identity and probing
    @property
    def torch_version(self) -> Version:
        return self._torch_version or torch_version()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    @functools.cached_property
    def availability(self) -> Availability:
        try:
            return self._probe()
        except Exception as exc:  # a broken driver must not break detection of the others
            return Availability(False, f"probe failed: {type(exc).__name__}: {exc}")

    def is_available(self) -> bool:
        return self.availability.available

    def request(self) -> None:
        """Called when a caller asks for this backend by name (flag, ``ACCEL_DEVICE``, ``-m``).

        A plug-in that must not load its runtime unless asked for (one PrivateUse1 device per
        process) answers "not requested" from its probe until this is called, then drops its
        cached availability. Built-in backends need nothing here.
        """

    def runtime_initialized(self) -> bool:
        """Whether this process has done anything with the device after which a child it forks could not
        use it (CUDA's "Cannot re-initialize CUDA in forked subprocess"). Never for a host backend. A device
        backend answers True unless it knows better: its probe alone may have started its driver (CUDA's
        device count initializes the driver, though ``torch.cuda.is_initialized()`` stays False), so only
        a backend whose runtime reports every start exactly overrides this."""
        return not self.is_host

    def device_environment(self) -> dict[str, str]:
        """Variables a child process needs to see this device as this process does (device counts,
        memory sizes, a build cache), kept when a run is isolated from the caller's configuration
        (``accel qualify --upstream``). Built-in backends need none."""
        return {}

    @abc.abstractmethod
    def _probe(self) -> Availability:
        """Whether this backend can be used here, and why (called once; an exception counts as unavailable)."""

    def require_available(self) -> None:
        if not self.is_available():
            raise BackendUnavailableError(f"backend {self.name!r} is not available: {self.availability.reason}")

    def unsupported(self, feature: str, reason: str) -> UnsupportedFeatureError:
        return UnsupportedFeatureError(self.name, feature, reason)

    # ------------------------------------------------------------------ devices
    @abc.abstractmethod
    def device_count(self) -> int:
        """How many devices this process sees (0 when the backend is unavailable)."""

    def device(self, index: int | None = None) -> torch.device:
        """The torch device for ``index`` (default: the current device)."""
        if index is None:
            index = self.current_device()
        count = self.device_count()
        if count == 0:
            self.require_available()
        if not 0 <= index < count:
            raise ValueError(f"{self.name}: device index {index} out of range (this process sees {count} device(s))")
        return torch.device(self.device_type, index)

    def devices(self) -> list[torch.device]:
        return [torch.device(self.device_type, i) for i in range(self.device_count())]

    @abc.abstractmethod
    def set_device(self, index: int) -> None:
        """Make device ``index`` this process's current device."""

    @abc.abstractmethod
    def current_device(self) -> int:
        """The index of this process's current device."""

    @abc.abstractmethod
    def synchronize(self, index: int | None = None) -> None:
        """Wait until the work queued on device ``index`` (default: the current one) has finished."""

    # ------------------------------------------------------------------ collectives and processes
    @property
    @abc.abstractmethod
    def comm_backend(self) -> str | None:
        """Name of the torch.distributed backend for this device, or None (single process only)."""

    def comm_backend_reason(self) -> str:
        return ""

    def supports_multiprocess(self) -> bool:
        return self.comm_backend is not None

    # ------------------------------------------------------------------ DeepSpeed
    @property
    def deepspeed_accelerator(self) -> str | None:
        """``"module:Class"`` of the DeepSpeed accelerator this backend brings, or None (the default).

        DeepSpeed picks its accelerator from a fixed list (``DS_ACCELERATOR`` or its own probe); a device
        outside that list brings its own ``deepspeed.accelerator.DeepSpeedAccelerator`` subclass (built with
        no arguments), and accel installs it with DeepSpeed's ``set_accelerator`` in every process that runs
        DeepSpeed on this backend. None leaves the choice to DeepSpeed, as for the devices it knows. Answering
        must not import DeepSpeed (the harness and ``accel env`` ask without it).
        """
        return None

    def create_deepspeed_accelerator(self) -> Any:
        """A new instance of the class :attr:`deepspeed_accelerator` names (imports DeepSpeed through it)."""
        spec = self.deepspeed_accelerator
        if not spec:
            raise self.unsupported("DeepSpeed accelerator", "this backend brings none; DeepSpeed chooses its own")
        import importlib

        module_name, _, class_name = spec.partition(":")
        if not module_name or not class_name:
            raise BackendError(f"{self.name}: deepspeed_accelerator must be 'module:Class', got {spec!r}")
        return getattr(importlib.import_module(module_name), class_name)()

    # ------------------------------------------------------------------ RNG
    @abc.abstractmethod
    def manual_seed(self, seed: int) -> None:
        """Seed every device of this backend (the host generator is seeded by ``set_seed``)."""

    @abc.abstractmethod
    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        """The random generator state of device ``index`` (default: the current one), for checkpoints."""

    @abc.abstractmethod
    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        """Restore a state :meth:`get_rng_state` returned."""

    # ------------------------------------------------------------------ memory
    @property
    def memory_stats_capability(self) -> Capability:
        return Capability(False, "no memory statistics on this backend")

    @property
    def has_memory_stats(self) -> bool:
        return self.memory_stats_capability.supported

    def _require_memory_stats(self, feature: str) -> None:
        cap = self.memory_stats_capability
        if not cap:
            raise self.unsupported(feature, cap.reason)

    def memory_allocated(self, index: int | None = None) -> int:
        raise self.unsupported("memory_allocated", self.memory_stats_capability.reason)

    def memory_reserved(self, index: int | None = None) -> int:
        raise self.unsupported("memory_reserved", self.memory_stats_capability.reason)

    def max_memory_allocated(self, index: int | None = None) -> int:
        raise self.unsupported("max_memory_allocated", self.memory_stats_capability.reason)

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        raise self.unsupported("reset_peak_memory_stats", self.memory_stats_capability.reason)

    def mem_get_info(self, index: int | None = None) -> tuple[int, int]:
        """(free, total) bytes."""
        raise self.unsupported("mem_get_info", self.memory_stats_capability.reason)

    def empty_cache(self) -> None:
        """Release cached blocks to the driver. A no-op where there is no cache."""

    # ------------------------------------------------------------------ streams, events, timing
    def stream(self) -> Any:
        """A new stream on the current device."""
        raise self.unsupported("streams", "this backend has no streams")

    def current_stream(self) -> Any:
        raise self.unsupported("streams", "this backend has no streams")

    def stream_context(self, stream: Any) -> contextlib.AbstractContextManager:
        raise self.unsupported("streams", "this backend has no streams")

    def event(self, enable_timing: bool = False) -> Any:
        raise self.unsupported("events", "this backend has no events")

    def timer(self) -> Timer:
        return Timer(self)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        """Page-locked copy of ``tensor`` for fast host->device copies (unchanged where pointless)."""
        return tensor

    # ------------------------------------------------------------------ profiling
    @property
    def profiler_activity(self) -> Any:
        """The ``torch.profiler.ProfilerActivity`` that records this device's own work, or None (the host,
        or a device torch's profiler has no activity for in this build).

        Derived from torch, so a backend needs no entry of its own: the activity named like the device
        type (CUDA, XPU, MTIA, HPU; a plug-in device's name is an alias of ``PrivateUse1`` once torch's
        PrivateUse1 backend is renamed to it), when this torch lists it among ``supported_activities()``."""
        if self.is_host:
            return None
        from torch.profiler import ProfilerActivity, supported_activities

        activity = getattr(ProfilerActivity, self.device_type.upper(), None)
        return activity if activity is not None and activity in supported_activities() else None

    @property
    def profiler_activities(self) -> list[Any]:
        """The activities to hand ``torch.profiler.profile`` so that it records this backend's work: the
        host's (CPU), where operators are dispatched, plus :attr:`profiler_activity` where there is one."""
        from torch.profiler import ProfilerActivity

        device = self.profiler_activity
        return [ProfilerActivity.CPU] if device is None else [ProfilerActivity.CPU, device]

    # ------------------------------------------------------------------ dtypes and AMP
    def dtype_capability(self, dtype: torch.dtype) -> Capability:
        """Whether tensors of ``dtype`` can be computed with (matmul and add) on this backend."""
        return self._dtype_capability_cached(dtype)

    @functools.lru_cache(maxsize=None)  # noqa: B019 - backends live for the process
    def _dtype_capability_cached(self, dtype: torch.dtype) -> Capability:
        if not self.is_available():
            return Capability(False, f"backend unavailable: {self.availability.reason}")
        return _probe_dtype(self.device(0 if self.device_count() else None), dtype)

    @property
    def supports_fp16(self) -> Capability:
        return self.dtype_capability(torch.float16)

    @property
    def supports_bf16(self) -> Capability:
        return self.dtype_capability(torch.bfloat16)

    @property
    def supports_fp8(self) -> Capability:
        dtype = getattr(torch, "float8_e4m3fn", None)
        if dtype is None:
            return Capability(False, f"torch {self.torch_version} has no float8 dtypes")
        return self._fp8_capability()

    def _fp8_capability(self) -> Capability:
        if not self.is_available():
            return Capability(False, f"backend unavailable: {self.availability.reason}")
        device = self.device(0)
        try:
            a = torch.ones(16, 16, device=device).to(torch.float8_e4m3fn)
            value = float((a @ a)[0, 0].float().item())
        except Exception as exc:
            return Capability(False, f"float8_e4m3fn matmul failed on {device}: {type(exc).__name__}: {exc}")
        if value != 16.0:
            return Capability(False, f"float8_e4m3fn matmul on {device} gave {value}, expected 16.0")
        return Capability(True, f"float8_e4m3fn matmul runs on {device}")

    @property
    def autocast_device_type(self) -> str:
        return self.device_type

    def amp_capability(self, dtype: torch.dtype) -> Capability:
        """Whether ``torch.autocast(device_type, dtype)`` really runs in ``dtype`` here (by default: the
        autocast probe, :meth:`probe_autocast`)."""
        return self.probe_autocast(dtype)

    def probe_autocast(self, dtype: torch.dtype) -> Capability:
        """Run a tiny matmul on device 0 under ``torch.autocast`` and check it came out in ``dtype``: the
        probe an ``amp_capability`` can answer with when the device module offers no query."""
        if not self.is_available():
            return Capability(False, f"backend unavailable: {self.availability.reason}")
        device = self.device(0)
        try:
            a = torch.ones(4, 4, device=device)
            with torch.autocast(self.autocast_device_type, dtype=dtype):
                out = a @ a
        except Exception as exc:
            return Capability(False, f"torch.autocast({self.autocast_device_type!r}, {dtype}) failed on {device}: "
                                     f"{type(exc).__name__}: {exc}")
        if out.dtype != dtype:
            return Capability(False, f"no {dtype} autocast on {device}: a matmul under autocast gave {out.dtype}")
        return Capability(True, f"a matmul under torch.autocast({self.autocast_device_type!r}) runs in {dtype} on {device}")

    @property
    def supports_fp16_amp(self) -> Capability:
        return self.amp_capability(torch.float16)

    @property
    def supports_bf16_amp(self) -> Capability:
        return self.amp_capability(torch.bfloat16)

    @property
    @abc.abstractmethod
    def grad_scaler_capability(self) -> Capability:
        """Whether ``torch.amp.GradScaler`` works for this device (fp16 training), and why."""

    def grad_scaler_after_fp16(self, build: bool = False) -> Capability:
        """The usual answer for a device: a ``GradScaler`` works where fp16 autocast does. With ``build``, one
        is also constructed, for devices whose scaler support is not known ahead (a vendor's profile)."""
        cap = self.amp_capability(torch.float16)
        if not cap:
            return Capability(False, f"no fp16 autocast, so no GradScaler: {cap.reason}")
        what = f"torch.amp.GradScaler({self.autocast_device_type!r})"
        if build:
            try:
                torch.amp.GradScaler(self.autocast_device_type)
            except Exception as exc:
                return Capability(False, f"{what} failed: {type(exc).__name__}: {exc}")
        return Capability(True, what)

    def grad_scaler(self, **kwargs: Any) -> "torch.amp.GradScaler":
        cap = self.grad_scaler_capability
        if not cap:
            raise self.unsupported("GradScaler", cap.reason)
        return torch.amp.GradScaler(self.autocast_device_type, **kwargs)

    def autocast(self, dtype: torch.dtype, enabled: bool = True, **kwargs: Any) -> contextlib.AbstractContextManager:
        return torch.autocast(self.autocast_device_type, dtype=dtype, enabled=enabled, **kwargs)

    # ------------------------------------------------------------------ errors
    def is_oom_error(self, exc: BaseException) -> bool:
        """True if ``exc`` is this backend's out-of-memory error."""
        if isinstance(exc, torch.OutOfMemoryError):
            return True
        if not isinstance(exc, RuntimeError) or not exc.args:
            return False
        text = str(exc.args[0])
        return any(m in text for m in self.oom_messages)

    # ------------------------------------------------------------------ description
    @abc.abstractmethod
    def device_properties(self, index: int = 0) -> DeviceProperties:
        """Name, memory and versions of device ``index``, for reports."""

    def capabilities(self) -> dict[str, Capability]:
        """Every capability with its answer; what `accel env` and reports show."""
        def multiprocess() -> Capability:
            comm = self.comm_backend
            return Capability(comm is not None, comm or self.comm_backend_reason())

        caps: dict[str, Capability] = {}
        probes: dict[str, Callable[[], Capability]] = {
            "memory_stats": lambda: self.memory_stats_capability,
            "multiprocess": multiprocess,
            "fp16": lambda: self.supports_fp16,
            "bf16": lambda: self.supports_bf16,
            "fp8": lambda: self.supports_fp8,
            "fp16_amp": lambda: self.supports_fp16_amp,
            "bf16_amp": lambda: self.supports_bf16_amp,
            "grad_scaler": lambda: self.grad_scaler_capability,
        }
        for key, probe in probes.items():
            try:
                caps[key] = probe()
            except Exception as exc:  # a capability probe must not take the report down
                caps[key] = Capability(False, f"probe failed: {type(exc).__name__}: {exc}")
        return caps

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description for environment reports."""
        info: dict[str, Any] = {
            "name": self.name,
            "device_type": self.device_type,
            "available": self.availability.available,
            "reason": self.availability.reason,
            "priority": self.priority,
        }
        if not self.is_available():
            return info
        try:
            info["device_count"] = self.device_count()
            info["comm_backend"] = self.comm_backend
        except Exception as exc:
            info["error"] = f"{type(exc).__name__}: {exc}"
            return info
        info["visible_devices_env"] = self.visible_devices_env
        info["start_method"] = self.start_method
        info["timing"] = "host timers" if self.use_host_timers else "device events"
        info["compile_backend"] = self.compile_backend
        info["devices"] = []
        for i in range(self.device_count()):
            try:
                info["devices"].append(self.device_properties(i).as_dict())
            except Exception as exc:
                info["devices"].append({"index": i, "error": f"{type(exc).__name__}: {exc}"})
        info["capabilities"] = {k: {"supported": c.supported, "reason": c.reason} for k, c in self.capabilities().items()}
        return info


def _probe_dtype(device: torch.device, dtype: torch.dtype) -> Capability:
    """Try a tiny matmul and add in ``dtype`` on ``device``."""
    try:
        a = torch.ones(4, 4, dtype=dtype, device=device)
        b = (a @ a) + a
        value = float(b[0, 0].float().item())
    except Exception as exc:
        return Capability(False, f"{dtype} matmul failed on {device}: {type(exc).__name__}: {exc}".strip())
    if value != 5.0:
        return Capability(False, f"{dtype} matmul on {device} gave {value}, expected 5.0")
    return Capability(True, f"{dtype} matmul runs on {device}")
