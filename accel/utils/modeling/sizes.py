"""How big a model is: bytes per dtype, per module and per layer, and human sizes like ``"10GB"``."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Iterator, Mapping, Optional, Union

import torch
import torch.nn as nn

_UNCONVERTED_PREFIXES = ("torch.uint", "torch.int", "torch.bool")  # dtypes a dtype change leaves alone


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMG]I?B)\s*$", re.IGNORECASE)


def convert_file_size_to_int(size: Union[int, str]) -> int:
    """``"5MB"`` -> 5_000_000, ``"2GiB"`` -> 2 * 2**30 (a lower-case ``b`` means bits); ints pass through."""
    err = f"`size` {size} is not in a valid format. Use an integer for bytes, or a string with an unit (like '5.0GB')."
    if isinstance(size, bool):
        raise ValueError(err)
    if isinstance(size, int):
        if size < 0:
            raise ValueError(err)
        return size
    if not isinstance(size, str):
        raise ValueError(err)
    match = _SIZE_RE.match(size)
    if match is None:
        raise ValueError(err)
    number, unit = float(match.group(1)), match.group(2)
    upper = unit.upper()
    if upper.endswith("IB"):
        value = int(number * 2 ** {"K": 10, "M": 20, "G": 30}[upper[0]])
    else:
        value = int(number * 10 ** {"K": 3, "M": 6, "G": 9}[upper[0]])
        if unit.endswith("b"):
            value //= 8
    return value


def dtype_byte_size(dtype: torch.dtype) -> float:
    """Bytes one element of ``dtype`` takes (``torch.bool`` counts as 1/8, as in Accelerate)."""
    if dtype == torch.bool:
        return 1 / 8
    custom = getattr(dtype, "name", None)  # Accelerate's CustomDtype enum values
    if custom in ("INT2", "INT4", "FP8"):
        return {"INT2": 1 / 4, "INT4": 1 / 2, "FP8": 1}[custom]
    if isinstance(dtype, torch.dtype):
        if dtype.is_complex or dtype.is_floating_point or str(dtype).startswith(("torch.int", "torch.uint")):
            return torch.empty((), dtype=dtype).element_size()
    bits = re.search(r"[^\d](\d+)$", str(dtype))
    if bits is None:
        raise ValueError(f"`dtype` is not a valid dtype: {dtype}.")
    return int(bits.group(1)) // 8


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """(device, storage pointer, storage bytes): equal for tensors sharing one storage."""
    try:
        storage = tensor.untyped_storage()
        return tensor.device, storage.data_ptr(), storage.nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.device, 0, tensor.nelement() * tensor.element_size()


def _proper_dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
        value = getattr(torch, name, None)
        if not isinstance(value, torch.dtype):
            raise ValueError(f"{dtype!r} is not a torch dtype")
        return value
    return dtype


def named_module_tensors(
    module: nn.Module, include_buffers: bool = True, recurse: bool = False, remove_non_persistent: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters, then (optionally) buffers of ``module``, optionally without non-persistent buffers."""
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skip = get_non_persistent_buffers(module, recurse=recurse) if remove_non_persistent else set()
        for name, buffer in module.named_buffers(recurse=recurse):
            if name not in skip:
                yield name, buffer


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the non-persistent buffers of ``module`` (a new set; the module is not touched)."""
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, sub in module.named_modules():
            if fqns:
                names |= {f"{prefix}.{b}" if prefix else b for b in sub._non_persistent_buffers_set}
            else:
                names |= set(sub._non_persistent_buffers_set)
    return names


def compute_module_sizes(
    model: nn.Module,
    dtype: Optional[Union[str, torch.dtype]] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Bytes of every submodule and tensor (``""`` is the whole model), as they would be loaded in ``dtype``."""
    dtype_size = dtype_byte_size(_proper_dtype(dtype)) if dtype is not None else None
    special = {k: dtype_byte_size(_proper_dtype(v)) for k, v in (special_dtypes or {}).items()}
    sizes: dict[str, int] = defaultdict(int)
    tensors = model.named_buffers(recurse=True) if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        own = dtype_byte_size(tensor.dtype)
        if name in special:
            size = tensor.numel() * special[name]
        elif dtype_size is None or str(tensor.dtype).startswith(_UNCONVERTED_PREFIXES):
            size = tensor.numel() * own  # integer tensors are never converted on load
        else:
            size = tensor.numel() * min(dtype_size, own)
        parts = name.split(".")
        for i in range(len(parts) + 1):
            sizes[".".join(parts[:i])] += size
    return sizes


def compute_module_total_buffer_size(
    model: nn.Module,
    dtype: Optional[Union[str, torch.dtype]] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
) -> int:
    """Total bytes of the buffers of ``model``."""
    return compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True).get("", 0)


def _is_leaf_layer(module: Any, no_split: list[str]) -> bool:
    if not isinstance(module, nn.Module):
        return True
    return type(module).__name__ in no_split or next(iter(module.children()), None) is None


def get_max_layer_size(
    modules: list[tuple[str, nn.Module]], module_sizes: dict[str, int], no_split_module_classes: list[str]
) -> tuple[int, list[str]]:
    """Size of the largest unsplittable layer among ``modules`` and the names of the layers of that size."""
    best, names = 0, []
    pending = list(modules)
    while pending:
        name, module = pending.pop(0)
        if _is_leaf_layer(module, no_split_module_classes):
            size = module_sizes[name]
            if size > best:
                best, names = size, [name]
            elif size == best:
                names.append(name)
        else:
            pending[:0] = [(f"{name}.{child}", sub) for child, sub in module.named_children()]
    return best, names


def get_module_leaves(module_sizes: Mapping[str, int]) -> list[str]:
    """Names in ``module_sizes`` that have no child entry."""
    parents = {name.rsplit(".", 1)[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """(total bytes, (largest layer bytes, its names)); honours ``model._no_split_modules``."""
    sizes = compute_module_sizes(model)
    no_split = getattr(model, "_no_split_modules", None) or []
    top = _top_level_entries(model)
    return sizes[""], get_max_layer_size(top, sizes, no_split)


def _top_level_entries(model: nn.Module) -> list[tuple[str, Any]]:
    return (
        list(model.named_parameters(recurse=False))
        + list(model.named_children())
        + list(model.named_buffers(recurse=False))
    )
