"""Per-tensor collective plumbing under :mod:`accel.utils.operations`' gather, broadcast, reduce and padding.

The fused all-gather into a preallocated buffer, with the byte-view and ``all_gather`` fallbacks
chosen once per backend and dtype, and the one-tensor steps the public functions apply to each leaf.
Private: the public operations are in :mod:`accel.utils.operations`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from ...state import PartialState

_UNSUPPORTED_WORDS = ("not support", "unsupported", "not implemented", "no support", "invalid scalar type")


def _no_fused_all_gather(output: torch.Tensor, tensor: torch.Tensor) -> None:
    raise NotImplementedError("this torch has no fused all-gather (all_gather_single / all_gather_into_tensor)")


# all_gather_single is the newer name (all_gather_into_tensor warns about deprecation on torch>=2.13)
FUSED_ALL_GATHER: Callable[..., Any] = (
    getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None) or _no_fused_all_gather
)
# (process-group backend, dtype) -> how gather moves it: 0 fused, 1 fused as bytes, 2 all_gather as bytes.
# Filled only once a backend has refused the fused collective; while empty, gather takes the fast path.
_GATHER_MODE: dict[tuple[str, torch.dtype], int] = {}


def _is_unsupported(exc: BaseException) -> bool:
    """Whether a collective refused its input before communicating (a capability gap, the same on
    every rank), as opposed to a failure midway that must propagate."""
    if isinstance(exc, NotImplementedError):
        return True
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, ValueError, TypeError)) and any(w in text for w in _UNSUPPORTED_WORDS)


def _all_gather_into(output: torch.Tensor, tensor: torch.Tensor, world: int) -> None:
    """Fill ``output`` (``world`` copies of ``tensor``'s shape, concatenated on dim 0) with every
    rank's ``tensor``: one fused collective into the caller's buffer, no extra copy."""
    if not _GATHER_MODE:
        try:
            FUSED_ALL_GATHER(output, tensor)
            return
        except Exception as exc:
            if not _is_unsupported(exc):
                raise
        _all_gather_fallback(output, tensor, world, first_mode=1)
    else:
        _all_gather_fallback(output, tensor, world)


def _all_gather_fallback(output: torch.Tensor, tensor: torch.Tensor, world: int, first_mode: int | None = None) -> None:
    """Where the backend refuses the fused collective for a dtype (or torch lacks it): the same on
    a byte view (gathering only moves bytes, so any dtype can travel as uint8), then ``all_gather``
    into views of ``output``. Still no copy; the choice is remembered per backend and dtype."""
    key = (dist.get_backend(), tensor.dtype)
    mode = first_mode if first_mode is not None else _GATHER_MODE.get(key, 0)
    while True:
        try:
            if mode == 0:
                FUSED_ALL_GATHER(output, tensor)
            elif mode == 1:
                FUSED_ALL_GATHER(output.view(torch.uint8), tensor.view(torch.uint8))
            else:
                dist.all_gather(list(output.view(torch.uint8).chunk(world)), tensor.view(torch.uint8))
            _GATHER_MODE[key] = mode
            return
        except Exception as exc:
            if mode == 2 or not _is_unsupported(exc):
                raise
            mode += 1


def _gather_one(tensor: torch.Tensor, world: int) -> torch.Tensor:
    if tensor.requires_grad:
        # gather is not differentiable (as in Accelerate): collectives on a tensor that requires
        # grad fail inside torch ("A view was created in no_grad mode ..."), so move its values only
        tensor = tensor.detach()
    if tensor.ndim == 0:
        tensor = tensor.reshape(1)
    elif not tensor.is_contiguous():
        tensor = tensor.contiguous()
    shape = tensor.shape
    output = tensor.new_empty((world * shape[0], *shape[1:]))
    _all_gather_into(output, tensor, world)
    return output


def _check_process(name: str, value: int, state: PartialState) -> None:
    if not isinstance(value, int) or not 0 <= value < state.num_processes:
        raise ValueError(f"{name} must be a process index in [0, {state.num_processes - 1}], got {value!r}")


def _broadcast_one(tensor: torch.Tensor, src: int) -> torch.Tensor:
    if tensor.is_contiguous():
        dist.broadcast(tensor, src=src)
        return tensor
    buffer = tensor.contiguous()  # broadcast needs contiguous memory; keep the in-place contract
    dist.broadcast(buffer, src=src)
    tensor.copy_(buffer)
    return tensor


_REDUCTIONS = ("mean", "sum", "none", "max", "min")


def _reduce_one(tensor: torch.Tensor, op: Any, divide_by: int, scale: float, mean: bool = False) -> torch.Tensor:
    # one copy: the result must not alias the input (callers keep using it, e.g. a loss)
    result = tensor.clone(memory_format=torch.contiguous_format)
    if op is not None:
        dist.all_reduce(result, op=op)
    return _mean_and_scale(result, divide_by, scale, mean)


def _mean_and_scale(result: torch.Tensor, divide_by: int, scale: float, mean: bool) -> torch.Tensor:
    if mean:
        if not (result.is_floating_point() or result.is_complex()):
            result = result / divide_by  # an integer mean would truncate: floating point instead
        elif divide_by > 1:
            result.div_(divide_by)
    if scale != 1.0:
        if result.is_floating_point() or result.is_complex():
            result.mul_(scale)
        else:
            result = result * scale
    return result


def _pad_one(tensor: torch.Tensor, dim: int, size: int, pad_index: Any, pad_first: bool) -> torch.Tensor:
    old = tensor.shape[dim]
    if old == size:
        return tensor
    new_shape = list(tensor.shape)
    new_shape[dim] = size
    padded = tensor.new_full(new_shape, pad_index)
    start = size - old if pad_first else 0
    padded.narrow(dim, start, old).copy_(tensor)
    return padded


def _pad_input_one(tensor: torch.Tensor, batch_size: int, num_processes: int, dim: int) -> torch.Tensor:
    padded = -(-batch_size // num_processes) * num_processes  # next multiple of num_processes
    if tensor.shape[dim] == padded:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = padded
    result = tensor.new_zeros(shape)
    result.narrow(dim, 0, tensor.shape[dim]).copy_(tensor)
    return result


_DTYPE_CODES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
]
_MAX_DIMS = 64  # torch's own limit on tensor dimensions
