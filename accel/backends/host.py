"""The host as a device: whether a ``torch.device`` (or a device's name) is the host's memory and compute.

``Backend.is_host`` answers the question for a backend; code that holds a device rather than a backend
(a tensor's ``.device``, the state's device, a device-map entry) asks :func:`is_host_device`, so that no
module outside ``accel/backends`` compares a device type with the host's name itself.
"""

from __future__ import annotations

from typing import Any

from ..facts.backends import HOST_BACKEND

__all__ = ["HOST_DEVICE_TYPE", "is_host_device"]

#: torch's device type of the host (the host backend's device type is its name)
HOST_DEVICE_TYPE = HOST_BACKEND


def is_host_device(device: Any) -> bool:
    """True when ``device`` is the host: a ``torch.device`` (anything with a ``type``) of the host's type,
    or its name with or without an index (``"cpu"``, ``"cpu:0"``). Other names (``"disk"``, ``"meta"``,
    an accelerator's) and integer device ids are not the host; anything else is a TypeError naming it."""
    if isinstance(device, str):
        return device.split(":", 1)[0].strip() == HOST_DEVICE_TYPE
    kind = getattr(device, "type", None)
    if isinstance(kind, str):
        return kind == HOST_DEVICE_TYPE
    if isinstance(device, int) and not isinstance(device, bool):
        return False  # an accelerator's index, as device maps and ``torch.device(0)`` take it
    raise TypeError(f"is_host_device needs a torch.device, a device name or an index, got {device!r}")
