"""Copy a sample between the device and the host without changing what it means.

A sample's tensors may be views into a larger storage (an offset, overlapping or partial strides:
``as_strided`` samples depend on that), so a tensor that is not a plain dense block is copied
storage and all and rebuilt with the same offset, sizes and strides. Each copy is a fresh leaf.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["mirror", "mirror_tensor"]


def _plain(tensor: torch.Tensor) -> bool:
    """Whether ``.to(device)`` keeps the tensor's layout exactly (a dense block that fills its storage)."""
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested:
        return True  # copied by .to(); these have no strides of their own to keep
    if tensor.is_conj() or tensor.is_neg():
        return True
    return (tensor.storage_offset() == 0 and _dense(tensor.size(), tensor.stride())
            and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size())


def _dense(sizes: torch.Size, strides: tuple[int, ...]) -> bool:
    """Whether the elements fill one block without gaps or overlaps, in some order of the dimensions."""
    expected = 1
    for size, stride in sorted((p for p in zip(sizes, strides) if p[0] != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def mirror_tensor(tensor: torch.Tensor, device: torch.device | str | None, requires_grad: bool | None = None) -> torch.Tensor:
    """A leaf copy of ``tensor`` on ``device`` (None: where it is) with the same storage layout;
    ``requires_grad`` as the original's unless given."""
    grad = tensor.requires_grad if requires_grad is None else requires_grad
    source = tensor.detach()
    device = source.device if device is None else device
    if _plain(source):
        copy = source.to(device, copy=True)
    else:
        size = source.element_size()
        whole = torch.empty(0, dtype=source.dtype, device=source.device)
        whole.set_(source.untyped_storage(), 0, (source.untyped_storage().nbytes() // size,), (1,))
        moved = whole.to(device, copy=True)
        copy = torch.empty(0, dtype=source.dtype, device=moved.device)
        copy.set_(moved.untyped_storage(), source.storage_offset(), source.size(), source.stride())
    if grad and (copy.is_floating_point() or copy.is_complex()):
        copy.requires_grad_(True)
    return copy


def mirror(value: Any, device: torch.device | str | None, requires_grad: bool | None = None, from_device: Any = None) -> Any:
    """``value`` (tensors inside lists, tuples and dicts) copied to ``device`` (None: each tensor where it
    is, as the sample made it: a host index tensor of a device sample stays on the host); a ``device``
    keyword naming ``from_device`` is pointed at ``device`` too (factory functions)."""
    if isinstance(value, torch.Tensor):
        return mirror_tensor(value, device, requires_grad)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(mirror(v, device, requires_grad, from_device) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(mirror(v, device, requires_grad, from_device) for v in value)
    if isinstance(value, dict):
        return {k: (_device_keyword(v, device, from_device) if k == "device" else mirror(v, device, requires_grad, from_device))
                for k, v in value.items()}
    return value


def _device_keyword(value: Any, device: torch.device | str | None, from_device: Any) -> Any:
    if device is not None and from_device is not None and value is not None and torch.device(value).type == torch.device(from_device).type:
        return device if isinstance(value, torch.device) else str(device)
    return value
