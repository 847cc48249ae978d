"""``torch.emu``: the device module of the emu accelerator, shaped like ``torch.cuda``.

Registered with ``torch._register_device_module("emu", ...)`` by :func:`accel_emu.load`; every
function here calls the loaded extension (``accel_emu._extension``), so importing this module
on its own builds nothing.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ._extension import load_extension
from .ipc import install as _install_ipc

# torch.multiprocessing shares emu tensors through emu's reducers (accel_emu.ipc)
_install_ipc()

__all__ = [
    "Event",
    "Stream",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "host_memory_stats",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_host_memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_host_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]


def _ext() -> Any:
    return load_extension()


def _index(device: Any = None) -> int:
    """A device index from None (current), an int, a string or a torch.device of type emu."""
    if device is None:
        return _ext().current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "emu":
            raise ValueError(f"expected an emu device, got {device}")
        return _ext().current_device() if device.index is None else device.index
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            return _ext().current_device()
        count = device_count()
        if device >= count:
            raise ValueError(f"emu: invalid device index {device} (this process sees {count} emu device(s))")
        return device
    raise TypeError(f"expected a device index, a device string or a torch.device, got {type(device).__name__}")


# ------------------------------------------------------------------ devices
def is_available() -> bool:
    """True when at least one emu device is visible."""
    return device_count() > 0


def is_initialized() -> bool:
    """True once device memory or a stream has been used in this process."""
    return bool(_ext().is_initialized())


def _is_in_bad_fork() -> bool:
    """True in a child forked after emu was initialized (its stream workers did not survive)."""
    return bool(_ext().in_bad_fork())


def device_count() -> int:
    """Number of emu devices this process sees (``ACCEL_EMU_DEVICES`` and ``EMU_VISIBLE_DEVICES``)."""
    return int(_ext().device_count())


def current_device() -> int:
    """Index of the current emu device of this thread."""
    return int(_ext().current_device())


def set_device(device: Any) -> None:
    """Make ``device`` the current emu device of this thread."""
    _ext().set_device(_index(device))


@contextlib.contextmanager
def device(device: Any) -> Iterator[None]:
    """Context manager that makes ``device`` current and restores the previous one on exit."""
    previous = current_device()
    set_device(device)
    try:
        yield
    finally:
        set_device(previous)


def synchronize(device: Any = None) -> None:
    """Wait until every stream of ``device`` has finished its queued work."""
    _ext().synchronize(_index(device))


class _DeviceProperties:
    """What ``get_device_properties`` reports (the fields torch.cuda's properties also have)."""

    def __init__(self, index: int):
        self.index = index
        self.physical_index = int(_ext().physical_index(index))
        self.name = "emu (emulated accelerator)"
        self.total_memory = int(_ext().capacity())
        self.type = "emu"
        self.major, self.minor = 1, 0
        self.multi_processor_count = 1

    def __repr__(self) -> str:
        return (
            f"_EmuDeviceProperties(name={self.name!r}, index={self.index}, physical_index={self.physical_index}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB)"
        )


def get_device_properties(device: Any = None) -> _DeviceProperties:
    """Name, total memory and index of an emu device."""
    return _DeviceProperties(_index(device))


def get_device_name(device: Any = None) -> str:
    """The device's name."""
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """A (major, minor) version of the emulated hardware."""
    props = get_device_properties(device)
    return props.major, props.minor


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """emu computes every dtype the host does, bfloat16 included."""
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes ``torch.autocast("emu", dtype=...)`` accepts."""
    return [torch.float16, torch.bfloat16]


# ------------------------------------------------------------------ memory
def memory_stats(device: Any = None) -> dict[str, int]:
    """Allocator statistics of a device, with the keys ``torch.cuda.memory_stats`` gives (sorted).

    emu maps one block per allocation and never splits one, so ``inactive_split*`` and
    ``oversize_*`` stay 0; blocks of up to 1 MiB count in ``small_pool``, larger ones in ``large_pool``.
    """
    stats = _ext().memory_stats(_index(device))
    return {key: int(stats[key]) for key in sorted(stats)}


def memory_allocated(device: Any = None) -> int:
    """Bytes held by live tensors on the device."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since start or the last :func:`reset_peak_memory_stats`."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device: Any = None) -> int:
    """Bytes mapped by the allocator on the device (live tensors plus its cache)."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: Any = None) -> int:
    """Peak of :func:`memory_reserved`."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: Any = None) -> None:
    """Set the peaks to the current values."""
    _ext().reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Reset the allocation/free counters."""
    _ext().reset_accumulated_memory_stats(_index(device))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device; total is ``ACCEL_EMU_MEMORY``."""
    free, total = _ext().mem_get_info(_index(device))
    return int(free), int(total)


def host_memory_stats() -> dict[str, int]:
    """Statistics of emu's pinned host allocator, keyed like ``torch.cuda.host_memory_stats`` (sorted).

    The allocator caches nothing: ``allocations`` equals ``active_requests`` and every block is a
    ``num_host_alloc``; times are in microseconds.
    """
    stats = _ext().host_memory_stats()
    return {key: int(stats[key]) for key in sorted(stats)}


def reset_peak_host_memory_stats() -> None:
    """Set the host allocator's peaks to the current values."""
    _ext().reset_peak_host_memory_stats()


def reset_accumulated_host_memory_stats() -> None:
    """Reset the host allocator's allocated/freed counters and timing totals."""
    _ext().reset_accumulated_host_memory_stats()


def empty_cache() -> None:
    """Return cached (unused) device memory to the host."""
    _ext().empty_cache()


# ------------------------------------------------------------------ random numbers
def default_generators() -> tuple[torch.Generator, ...]:
    """The default generator of each device."""
    return tuple(_ext().default_generator(i) for i in range(device_count()))


def _generator(device: Any = None) -> torch.Generator:
    return _ext().default_generator(_index(device))


def manual_seed(seed: int) -> None:
    """Seed the current device's generator."""
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator."""
    for gen in default_generators():
        gen.manual_seed(int(seed))


def seed() -> None:
    """Seed the current device's generator from a non-deterministic source."""
    _generator().seed()


def seed_all() -> None:
    """Seed every device's generator from one non-deterministic draw."""
    value = _generator().seed()
    for gen in default_generators():
        gen.manual_seed(value)


def initial_seed() -> int:
    """The seed the current device's generator was last seeded with."""
    return int(_generator().initial_seed())


def get_rng_state(device: Any = "emu") -> torch.Tensor:
    """The state of a device's generator as a uint8 CPU tensor."""
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "emu") -> None:
    """Restore a device's generator from :func:`get_rng_state`."""
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError("set_rng_state expects the uint8 tensor returned by get_rng_state")
    _generator(device).set_state(new_state.cpu())


def get_rng_state_all() -> list[torch.Tensor]:
    """Every device's generator state."""
    return [gen.get_state() for gen in default_generators()]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    """Restore every device's generator state."""
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


# ------------------------------------------------------------------ streams and events
class Stream:
    """``Stream(device=None, priority=0)``: a new stream (a ``torch.Stream``) on an emu device.

    Copies queued on a stream run asynchronously on its worker. Instances are plain
    ``torch.Stream`` objects, which torch's own stream and event methods require.
    """

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> torch.Stream:  # type: ignore[misc]
        if kwargs:
            return torch.Stream(**kwargs)
        return torch.Stream(device=torch.device("emu", _index(device)), priority=priority)


class Event:
    """``Event(enable_timing=False)``: a marker in a stream (a ``torch.Event`` on emu).

    ``elapsed_time`` between two timed events is in milliseconds. Instances are plain
    ``torch.Event`` objects, which torch's own methods require.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:  # type: ignore[misc]
        return torch.Event(device=torch.device("emu"), enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def _device_type_code() -> int:
    """The c10 DeviceType number of PrivateUse1 (what torch.Stream's ``device_type`` holds)."""
    return int(torch._C._autograd.DeviceType.PrivateUse1.value)


def current_stream(device: Any = None) -> torch.Stream:
    """The current stream of ``device`` for this thread."""
    index = _index(device)
    sid = int(_ext().current_stream_id(index))
    return Stream(stream_id=sid, device_index=index, device_type=_device_type_code())


def default_stream(device: Any = None) -> torch.Stream:
    """The default stream of ``device``."""
    return Stream(stream_id=0, device_index=_index(device), device_type=_device_type_code())


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream`` the current stream of its device for this thread."""
    if stream.device_type != _device_type_code():
        raise ValueError(f"set_stream expects an emu stream, got {stream}")
    _ext().set_stream(int(stream.stream_id), int(stream.device_index))


@contextlib.contextmanager
def stream(stream: torch.Stream | None) -> Iterator[None]:
    """Context manager that makes ``stream`` current (None: no change)."""
    if stream is None:
        yield
        return
    previous = current_stream(stream.device_index)
    set_stream(stream)
    try:
        yield
    finally:
        set_stream(previous)
