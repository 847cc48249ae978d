"""Nested structures of tensors for :mod:`accel.utils.operations`: walk, rebuild, describe and move them.

The layer every operation stands on (lists, tuples, namedtuples and mappings of tensors, rebuilt with
their own types); apart from the collectives so that each can be read on its own. Every public name
is importable from :mod:`accel.utils.operations` and :mod:`accel.utils`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch

@dataclass
class TensorInformation:
    """Shape and dtype of a tensor: enough to allocate a receive buffer for it."""

    shape: torch.Size
    dtype: torch.dtype


def is_torch_tensor(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor)


def is_tensor_information(tensor_info: Any) -> bool:
    return isinstance(tensor_info, TensorInformation)


def is_namedtuple(data: Any) -> bool:
    """A tuple with namedtuple's ``_fields``/``_asdict``: it must be rebuilt positionally."""
    return isinstance(data, tuple) and hasattr(data, "_asdict") and hasattr(data, "_fields")


def honor_type(obj: Any, generator: Any) -> Any:
    """Build a container of ``obj``'s type (list, tuple, namedtuple) from ``generator``."""
    if is_namedtuple(obj):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def _rebuild_mapping(data: Mapping, items: dict) -> Any:
    """A mapping of ``data``'s type holding ``items``; types whose constructor differs from dict's
    (``defaultdict``, user classes) are copied and updated instead."""
    try:
        return type(data)(items)
    except TypeError:
        try:
            new = copy.copy(data)
            new.update(items)  # type: ignore[attr-defined]
            return new
        except Exception:
            return items


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Apply ``func`` to every leaf of ``data`` for which ``test_type`` holds, keeping the structure.

    Other leaves are returned unchanged, or raise ``TypeError`` with ``error_on_other_type``.
    """
    if isinstance(data, (tuple, list)):
        return honor_type(
            data,
            (recursively_apply(func, o, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs) for o in data),
        )
    if isinstance(data, Mapping):
        return _rebuild_mapping(
            data,
            {k: recursively_apply(func, v, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs)
             for k, v in data.items()},
        )
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        raise TypeError(
            # Accelerate's wording, which users' tests match on
            f"Unsupported types ({type(data)}) passed to `{getattr(func, '__name__', func)}`. Only nested "
            f"list/tuple/dicts of objects that are valid for `{getattr(test_type, '__name__', test_type)}` should be passed."
        )
    return data


def _leaves(data: Any, error_on_other_type: bool = False) -> list[torch.Tensor]:
    """The tensors of ``data``, in ``recursively_apply`` order."""
    found: list[torch.Tensor] = []

    def _collect(t: torch.Tensor) -> None:
        found.append(t)

    recursively_apply(_collect, data, error_on_other_type=error_on_other_type)
    return found


def send_to_device(tensor: Any, device: Any, non_blocking: bool = False, skip_keys: str | list[str] | None = None) -> Any:
    """Move every tensor (or object with a ``.to`` method) in a nested structure to ``device``.

    Objects with their own ``.to`` (e.g. a tokenizer's ``BatchEncoding``) are asked to move
    themselves; values under ``skip_keys`` in dictionaries stay where they are; other leaves are
    returned unchanged.
    """
    kind = type(tensor)
    if kind is list or kind is tuple:
        # the common batch (a plain list or tuple of tensors), taken without the generic checks below:
        # this runs for every batch of a prepared data loader
        try:
            return kind([t.to(device, non_blocking=non_blocking) if type(t) is torch.Tensor
                         else send_to_device(t, device, non_blocking, skip_keys) for t in tensor])
        except TypeError:  # e.g. a ``non_blocking`` that ``Tensor.to`` refuses: the generic path below retries
            pass
    if isinstance(tensor, torch.Tensor) or hasattr(tensor, "to"):
        try:
            return tensor.to(device, non_blocking=non_blocking)
        except TypeError:  # a user ``.to`` without ``non_blocking``
            return tensor.to(device)
    if isinstance(tensor, (tuple, list)):
        moved = [send_to_device(t, device, non_blocking, skip_keys) for t in tensor]
        return type(tensor)(*moved) if is_namedtuple(tensor) else type(tensor)(moved)
    if isinstance(tensor, Mapping):
        skip = [skip_keys] if isinstance(skip_keys, str) else (skip_keys or [])
        return _rebuild_mapping(
            tensor,
            {k: t if k in skip else send_to_device(t, device, non_blocking=non_blocking, skip_keys=skip_keys)
             for k, t in tensor.items()},
        )
    return tensor


def get_data_structure(data: Any) -> Any:
    """``data`` with every tensor replaced by its :class:`TensorInformation` (to rebuild it elsewhere)."""
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def get_shape(data: Any) -> Any:
    """``data`` with every tensor replaced by its shape as a list."""
    return recursively_apply(lambda t: list(t.shape), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Uninitialised tensors for a structure of :class:`TensorInformation` (receive buffers)."""
    return recursively_apply(
        lambda info: torch.empty(*info.shape, dtype=info.dtype), data_structure, test_type=is_tensor_information
    )


def find_batch_size(data: Any) -> int:
    """Size of the first dimension of the first tensor in ``data``."""
    if isinstance(data, (tuple, list, Mapping)) and len(data) == 0:
        raise ValueError(f"Cannot find the batch size from an empty {type(data).__name__}.")
    if isinstance(data, (tuple, list)):
        return find_batch_size(data[0])
    if isinstance(data, Mapping):
        return find_batch_size(next(iter(data.values())))
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"Can only find the batch size of tensors but got {type(data).__name__}.")
    if data.ndim == 0:
        raise ValueError("Cannot find the batch size of a 0-dimensional tensor.")
    return data.shape[0]


def ignorant_find_batch_size(data: Any) -> int | None:
    """:func:`find_batch_size`, or None where ``data`` has no batch size."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def listify(data: Any) -> Any:
    """``data`` with every tensor turned into (nested lists of) Python numbers, e.g. for logging."""

    def _to_list(tensor: torch.Tensor) -> Any:
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:  # NumPy-backed tolist has no bfloat16
            tensor = tensor.float()
        return tensor.tolist()

    return recursively_apply(_to_list, data)


def find_device(data: Any) -> torch.device | None:
    """Device of the first tensor in ``data`` (None if it holds none)."""
    if isinstance(data, torch.Tensor):
        return data.device
    if isinstance(data, Mapping):
        data = data.values()
    elif not isinstance(data, (tuple, list)):
        return None
    for obj in data:
        device = find_device(obj)
        if device is not None:
            return device
    return None


def slice_tensors(data: Any, tensor_slice: Any, process_index: int | None = None, num_processes: int | None = None) -> Any:
    """Index every tensor of ``data`` with ``tensor_slice``."""
    return recursively_apply(lambda t: t[tensor_slice], data)


def concatenate(data: Any, dim: int = 0) -> Any:
    """Concatenate a list of batches that share one structure (list/tuple/dict of tensors) along ``dim``."""
    if not isinstance(data, (tuple, list)) or len(data) == 0:
        raise TypeError(f"concatenate expects a non-empty list or tuple of batches, got {type(data).__name__}")
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        return _rebuild_mapping(first, {k: concatenate([d[k] for d in data], dim=dim) for k in first.keys()})
    if isinstance(first, torch.Tensor):
        return torch.cat(list(data), dim=dim)
    if len(data) == 1:
        return first
    raise TypeError(f"Can only concatenate tensors but got {type(first).__name__}")
