"""What a device-map value means as a torch device (integers are devices of the active backend).

A module of its own inside ``accel.utils.modeling`` (the device-map vocabulary), used there and by
``accel.utils.offload`` and ``accel.hooks``; it imports nothing of accel at module level.
"""

from __future__ import annotations

from typing import Union

import torch

__all__ = ["as_torch_device"]


def _backend():
    from accel.backends import get_backend

    return get_backend()


def as_torch_device(device: Union[int, str, torch.device]) -> torch.device:
    """The torch device a device-map value means: integers are devices of the active backend."""
    if isinstance(device, torch.device):
        return device
    if isinstance(device, bool):
        raise ValueError(f"{device!r} is not a device")
    if isinstance(device, int):
        return _backend().device(device)
    if device == "disk":
        raise ValueError('"disk" is an offload target, not a device tensors can be put on')
    return torch.device(device)
