"""Dynamo's device interface for emu: devices, streams, events and properties as torch.compile sees them.

Imported only once Dynamo is (see :mod:`accel_emu.compiler`). Every answer comes from ``torch.emu``;
the kernels Inductor generates for emu are host C++, so the properties a code generator asks for
(how many cores run a kernel) are the host's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface

from . import DEVICE_TYPE

__all__ = ["EmuDeviceProperties", "EmuInterface"]


@dataclass(frozen=True)
class EmuDeviceProperties:
    """What Inductor may ask of an emu device: its name, memory, and the host cores its kernels use."""

    name: str
    total_memory: int
    multi_processor_count: int


def _emu() -> Any:
    return getattr(torch, DEVICE_TYPE)


def _index(device: Any = None) -> int:
    if device is None:
        return _emu().current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != DEVICE_TYPE:
        raise ValueError(f"expected an {DEVICE_TYPE} device, got {device}")
    return _emu().current_device() if device.index is None else device.index


def _properties(device: Any = None) -> EmuDeviceProperties:
    props = _emu().get_device_properties(_index(device))
    return EmuDeviceProperties(props.name, int(props.total_memory), os.cpu_count() or 1)


class EmuInterface(DeviceInterface):
    """emu as Dynamo and Inductor query a device (``register_interface_for_device``)."""

    class device:  # type: ignore[no-redef]
        """``torch.emu.device(index)``: makes an emu device current for a block."""

        def __new__(cls, device: Any) -> Any:  # type: ignore[misc]
            return _emu().device(device)

    class Stream:  # type: ignore[no-redef]
        """``torch.emu.Stream``: a ``torch.Stream`` on an emu device."""

        def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> torch.Stream:  # type: ignore[misc]
            return _emu().Stream(device, priority, **kwargs)

    class Event:  # type: ignore[no-redef]
        """``torch.emu.Event``: a ``torch.Event`` on emu."""

        def __new__(cls, *args: Any, **kwargs: Any) -> torch.Event:  # type: ignore[misc]
            return _emu().Event(*args, **kwargs)

    class Worker:
        """The same answers in Inductor's compile workers (emu needs no device there)."""

        @staticmethod
        def set_device(device: int) -> None:
            _emu().set_device(device)

        @staticmethod
        def current_device() -> int:
            return _emu().current_device()

        @staticmethod
        def get_device_properties(device: Any = None) -> EmuDeviceProperties:
            return _properties(device)

    @staticmethod
    def current_device() -> int:
        return _emu().current_device()

    @staticmethod
    def set_device(device: Any) -> None:
        _emu().set_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        previous = _emu().current_device()
        if device >= 0 and device != previous:
            _emu().set_device(device)
        return previous

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = _emu().current_device()
        _emu().set_device(device)
        return previous

    @staticmethod
    def device_count() -> int:
        return _emu().device_count()

    @staticmethod
    def is_available() -> bool:
        return _emu().is_available()

    @staticmethod
    def stream(stream: torch.Stream) -> Any:
        return _emu().stream(stream)

    @staticmethod
    def current_stream() -> torch.Stream:
        return _emu().current_stream()

    @staticmethod
    def set_stream(stream: torch.Stream) -> None:
        _emu().set_stream(stream)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        _emu().set_stream(torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return _emu().current_stream(device_idx).stream_id

    @staticmethod
    def synchronize(device: Any = None) -> None:
        _emu().synchronize(device)

    @classmethod
    def get_device_properties(cls, device: Any = None) -> EmuDeviceProperties:
        return _properties(device)

    @staticmethod
    def get_compute_capability(device: Any = None) -> str:
        return ""  # host C++ kernels: no compute capability, as on the CPU

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return _emu().memory_allocated(device)

    @staticmethod
    def is_triton_capable(device: Any = None) -> bool:
        return False
