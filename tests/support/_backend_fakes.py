"""Test doubles for the backend layer.

``FakeDeviceModule`` stands in for a per-device torch module (the object a
``DeviceModuleBackend`` gets through ``module=``) and ``FakeAccelerator`` for the
device-generic ``torch.accelerator`` API. Both record every call in ``calls`` as
``(name, args)`` tuples so tests can check what the backend forwarded.

Nothing here names a real device module: the backends look those up themselves, and the
isolation test keeps every file outside ``accel/backends`` free of such references.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import torch

GiB = 1024**3


class FakeStream:
    def __init__(self, module: "FakeDeviceModule", label: str = "new"):
        self.module = module
        self.label = label


class FakeEvent:
    def __init__(self, module: "FakeDeviceModule", enable_timing: bool = False):
        self.module = module
        self.enable_timing = enable_timing
        self.recorded = 0
        self.synchronized = 0
        self.elapsed_queries: list[FakeEvent] = []
        module.events.append(self)

    def record(self, stream: Any = None) -> None:
        self.recorded += 1
        self.module.calls.append(("Event.record", ()))

    def synchronize(self) -> None:
        self.synchronized += 1
        self.module.calls.append(("Event.synchronize", ()))

    def elapsed_time(self, end: "FakeEvent") -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("both events must be created with enable_timing=True")
        if not (self.recorded and end.recorded):
            raise RuntimeError("elapsed_time asked before both events were recorded")
        self.elapsed_queries.append(end)
        self.module.calls.append(("Event.elapsed_time", ()))
        return self.module.elapsed_ms


class FakeDeviceModule:
    """Emulates the parts of a ``torch.<device>`` module that the backends use."""

    def __init__(
        self,
        count: int = 2,
        available: bool = True,
        probe_error: BaseException | None = None,
        bf16: bool = True,
        capability: tuple[int, int] = (8, 0),
        elapsed_ms: float = 250.0,
        props: dict[str, Any] | None = None,
    ):
        self.count = count
        self.available = available
        self.probe_error = probe_error
        self.bf16 = bf16
        self.capability = capability
        self.elapsed_ms = elapsed_ms
        self.props = props
        self.current = 0
        self.calls: list[tuple[str, tuple]] = []
        self.events: list[FakeEvent] = []
        self.streams_entered: list[FakeStream] = []
        self.seed: int | None = None
        self.rng_states: dict[int, torch.Tensor] = {
            i: torch.full((8,), i, dtype=torch.uint8) for i in range(max(count, 1))
        }
        # per-device allocator figures, distinct per index so forwarding of the index shows
        self.allocated = {i: 1000 + i for i in range(max(count, 1))}
        self.reserved = {i: 2000 + i for i in range(max(count, 1))}
        self.peak = {i: 3000 + i for i in range(max(count, 1))}
        self.free_total = {i: (4 * GiB + i, 16 * GiB) for i in range(max(count, 1))}
        # MPS-style figures
        self.current_allocated = 111
        self.driver_allocated = 222
        self.recommended_max = 1000

    def _log(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def called(self, name: str) -> list[tuple]:
        """Argument tuples of every call to ``name``."""
        return [args for n, args in self.calls if n == name]

    # ------------------------------------------------------------------ probing and devices
    def is_available(self) -> bool:
        self._log("is_available")
        if self.probe_error is not None:
            raise self.probe_error
        return self.available

    def device_count(self) -> int:
        self._log("device_count")
        return self.count

    def set_device(self, index: int) -> None:
        self._log("set_device", index)
        self.current = index

    def current_device(self) -> int:
        self._log("current_device")
        return self.current

    def synchronize(self, *args: Any) -> None:
        self._log("synchronize", *args)

    # ------------------------------------------------------------------ RNG
    def manual_seed_all(self, seed: int) -> None:
        self._log("manual_seed_all", seed)
        self.seed = seed

    def manual_seed(self, seed: int) -> None:
        self._log("manual_seed", seed)
        self.seed = seed

    def get_rng_state(self, device: int = 0) -> torch.Tensor:
        self._log("get_rng_state", device)
        return self.rng_states[device].clone()

    def set_rng_state(self, state: torch.Tensor, device: int = 0) -> None:
        self._log("set_rng_state", device)
        self.rng_states[device] = state.clone()

    # ------------------------------------------------------------------ memory
    def memory_allocated(self, device: int = 0) -> int:
        self._log("memory_allocated", device)
        return self.allocated[device]

    def memory_reserved(self, device: int = 0) -> int:
        self._log("memory_reserved", device)
        return self.reserved[device]

    def max_memory_allocated(self, device: int = 0) -> int:
        self._log("max_memory_allocated", device)
        return self.peak[device]

    def reset_peak_memory_stats(self, device: int = 0) -> None:
        self._log("reset_peak_memory_stats", device)
        self.peak[device] = self.allocated[device]

    def mem_get_info(self, device: int = 0) -> tuple[int, int]:
        self._log("mem_get_info", device)
        return self.free_total[device]

    def empty_cache(self) -> None:
        self._log("empty_cache")

    def current_allocated_memory(self) -> int:
        self._log("current_allocated_memory")
        return self.current_allocated

    def driver_allocated_memory(self) -> int:
        self._log("driver_allocated_memory")
        return self.driver_allocated

    def recommended_max_memory(self) -> int:
        self._log("recommended_max_memory")
        return self.recommended_max

    # ------------------------------------------------------------------ streams and events
    def Stream(self) -> FakeStream:  # noqa: N802 - mirrors the torch API
        self._log("Stream")
        return FakeStream(self)

    def current_stream(self) -> FakeStream:
        self._log("current_stream")
        return FakeStream(self, "current")

    @contextlib.contextmanager
    def stream(self, stream: FakeStream):
        self._log("stream", stream)
        self.streams_entered.append(stream)
        try:
            yield stream
        finally:
            self.streams_entered.pop()

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802 - mirrors the torch API
        self._log("Event", enable_timing)
        return FakeEvent(self, enable_timing)

    @property
    def event(self) -> SimpleNamespace:
        """The ``<module>.event.Event`` spelling some device modules use."""
        return SimpleNamespace(Event=self.Event)

    # ------------------------------------------------------------------ description
    def get_device_properties(self, index: int = 0) -> SimpleNamespace:
        self._log("get_device_properties", index)
        if self.props is not None:
            return SimpleNamespace(**self.props)
        return SimpleNamespace(
            name=f"Fake Accelerator {index}",
            total_memory=16 * GiB,
            major=self.capability[0],
            minor=self.capability[1],
            multi_processor_count=108,
        )

    def is_bf16_supported(self) -> bool:
        self._log("is_bf16_supported")
        return self.bf16

    def get_device_capability(self, index: int = 0) -> tuple[int, int]:
        self._log("get_device_capability", index)
        return self.capability


class FakeAccelerator:
    """Emulates the device-generic accelerator API; figures differ from the fake module's."""

    def __init__(self, count: int = 3, omit: tuple[str, ...] = ()):
        self.count = count
        self.current = 0
        self.calls: list[tuple[str, tuple]] = []
        self._omit = frozenset(omit)  # methods hidden to emulate an older accelerator API

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_") and name in object.__getattribute__(self, "_omit"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def called(self, name: str) -> list[tuple]:
        return [args for n, args in self.calls if n == name]

    def device_count(self) -> int:
        self.calls.append(("device_count", ()))
        return self.count

    def current_device_index(self) -> int:
        self.calls.append(("current_device_index", ()))
        return self.current

    def set_device_index(self, index: int) -> None:
        self.calls.append(("set_device_index", (index,)))
        self.current = index

    def synchronize(self, *args: Any) -> None:
        self.calls.append(("synchronize", args))

    def memory_allocated(self, device: int = 0) -> int:
        self.calls.append(("memory_allocated", (device,)))
        return 70_000 + device

    def memory_reserved(self, device: int = 0) -> int:
        self.calls.append(("memory_reserved", (device,)))
        return 80_000 + device

    def max_memory_allocated(self, device: int = 0) -> int:
        self.calls.append(("max_memory_allocated", (device,)))
        return 90_000 + device

    def reset_peak_memory_stats(self, device: int = 0) -> None:
        self.calls.append(("reset_peak_memory_stats", (device,)))

    def get_memory_info(self, device: int = 0) -> tuple[int, int]:
        self.calls.append(("get_memory_info", (device,)))
        return (5 * GiB, 32 * GiB)

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache", ()))
