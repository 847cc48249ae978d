"""Tensor operations and collectives with Accelerate's names (``gather``, ``reduce``, ``broadcast``, ...).

Every operation takes a tensor or a nested list/tuple/namedtuple/dict of tensors and works on one
process (no process group: identity or trivial results) and on N processes through
``torch.distributed`` with the group ``PartialState`` set up. Nothing here knows about devices:
tensors stay where they are and the process group's backend moves them.

Speed matters: ``gather`` and ``reduce`` are on the hot path of evaluation loops, so the fast path
is one collective into one preallocated output, with no shape exchange unless debug mode
(``ACCEL_DEBUG_MODE=1`` / ``ACCELERATE_DEBUG_MODE=1``) asks for one.
"""

from __future__ import annotations

import copy
import pickle
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from functools import update_wrapper, wraps
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..state import PartialState
from .dataclasses import DistributedType
from . import heartbeat

__all__ = [
    "CannotPadNestedTensorWarning",
    "ConvertOutputsToFp32",
    "DistributedOperationException",
    "TensorInformation",
    "broadcast",
    "broadcast_object_list",
    "chained_operation",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_object",
    "get_data_structure",
    "get_shape",
    "honor_type",
    "ignorant_find_batch_size",
    "initialize_tensors",
    "is_namedtuple",
    "is_tensor_information",
    "is_torch_tensor",
    "listify",
    "pad_across_processes",
    "pad_input_tensors",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
    "verify_operation",
]


class DistributedOperationException(Exception):
    """A collective cannot run because the processes passed incompatible tensors (debug mode says which)."""


class CannotPadNestedTensorWarning(UserWarning):
    """``pad_across_processes`` met a nested (jagged) tensor and left it as it was."""


@dataclass
class TensorInformation:
    """Shape and dtype of a tensor: enough to allocate a receive buffer for it."""

    shape: torch.Size
    dtype: torch.dtype


# ---------------------------------------------------------------------------- structure helpers
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


# ---------------------------------------------------------------------------- precision helpers
def convert_to_fp32(tensor: Any) -> Any:
    """Turn every float16/bfloat16 tensor of a nested structure into float32 (other leaves unchanged)."""

    def _is_half(t: Any) -> bool:
        return (isinstance(t, torch.Tensor) or hasattr(t, "dtype")) and t.dtype in (torch.float16, torch.bfloat16)

    return recursively_apply(lambda t: t.float(), tensor, test_type=_is_half)


class ConvertOutputsToFp32:
    """Wraps a forward function so its half-precision outputs come back as float32.

    Not picklable on purpose, as in Accelerate: a pickled model would carry the wrapper; unwrap the
    model first.
    """

    def __init__(self, model_forward: Callable[..., Any]):
        self.model_forward = model_forward
        update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise pickle.PicklingError(
            "Cannot pickle a prepared model with automatic mixed precision; unwrap it with "
            "`Accelerator.unwrap_model(model)` before pickling."
        )


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """A plain function around :class:`ConvertOutputsToFp32`; ``__wrapped__`` lets unwrapping remove it."""
    wrapped = ConvertOutputsToFp32(model_forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return wrapped(*args, **kwargs)

    forward.__wrapped__ = wrapped  # type: ignore[attr-defined]
    return forward


# ---------------------------------------------------------------------------- debug-mode checks
@dataclass(frozen=True)
class _Layout:
    """What debug mode compares across ranks for one tensor (picklable, printable)."""

    shape: tuple[int, ...]
    dtype: str

    def __repr__(self) -> str:
        return f"{list(self.shape)} {self.dtype}"


def _is_layout(x: Any) -> bool:
    return isinstance(x, _Layout)


def _describe(data: Any) -> Any:
    return recursively_apply(lambda t: _Layout(tuple(t.shape), str(t.dtype).removeprefix("torch.")), data)


def _ndim_only(description: Any) -> Any:
    return recursively_apply(lambda lay: len(lay.shape), description, test_type=_is_layout)


def _check_across_processes(operation: str, data: Any, state: PartialState, same_shape: bool = True) -> None:
    """Raise :class:`DistributedOperationException` on every rank if the ranks' tensors cannot meet.

    ``same_shape`` demands identical shapes and dtypes (gather, broadcast, reduce); otherwise only
    the structure and the number of dimensions must agree (what pad_across_processes needs).
    """
    device = find_device(data)
    local_problem = None
    if device is not None and device.type != state.device.type:
        local_problem = f"on {device.type} while this process runs on {state.device.type}"
    description = _describe(data)
    everyone: list[Any] = [None] * state.num_processes
    dist.all_gather_object(everyone, (description, local_problem))
    misplaced = [(rank, problem) for rank, (_, problem) in enumerate(everyone) if problem]
    if misplaced:
        lines = "\n  - ".join(f"Process {rank}: tensors {problem}" for rank, problem in misplaced)
        raise DistributedOperationException(
            f"Operation `{operation}` got tensors on the wrong device; move them to the process's device first.\n  - {lines}"
        )
    key = (lambda d: d) if same_shape else _ndim_only
    reference = key(everyone[0][0])
    odd = [rank for rank, (desc, _) in enumerate(everyone) if key(desc) != reference]
    if odd:
        need = "the same shapes and dtypes" if same_shape else "the same structure and number of dimensions"
        lines = "\n  - ".join(f"Process {rank}: {desc!r}" for rank, (desc, _) in enumerate(everyone))
        raise DistributedOperationException(
            f"Cannot apply `{operation}`: it needs {need} on every process, but process(es) "
            f"{', '.join(map(str, odd))} differ from process 0.\n\nOperation: `{operation}`\nInput shapes:\n  - {lines}"
        )


def verify_operation(function: Callable[..., Any]) -> Callable[..., Any]:
    """In debug mode, check that every process passes tensors of one shape before ``function`` runs."""
    operation = f"{function.__module__}.{function.__qualname__}"

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        state = PartialState()
        if state.debug and state.use_distributed:
            _check_across_processes(operation, kwargs["tensor"] if "tensor" in kwargs else args[0], state)
        return function(*args, **kwargs)

    return wrapper


def chained_operation(function: Callable[..., Any]) -> Callable[..., Any]:
    """Re-raise a :class:`DistributedOperationException` from inside ``function`` naming ``function`` too."""
    operation = f"{function.__module__}.{function.__qualname__}"

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DistributedOperationException as exc:
            raise DistributedOperationException(
                f"Error found while calling `{operation}`: {exc}"
            ) from exc

    return wrapper


# ---------------------------------------------------------------------------- collectives: plumbing
_NO = DistributedType.NO
_UNSUPPORTED_WORDS = ("not support", "unsupported", "not implemented", "no support", "invalid scalar type")


def _no_fused_all_gather(output: torch.Tensor, tensor: torch.Tensor) -> None:
    raise NotImplementedError("this torch has no fused all-gather (all_gather_single / all_gather_into_tensor)")


# all_gather_single is the newer name (all_gather_into_tensor warns about deprecation on torch>=2.13)
_FUSED_ALL_GATHER: Callable[..., Any] = (
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
            _FUSED_ALL_GATHER(output, tensor)
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
                _FUSED_ALL_GATHER(output, tensor)
            elif mode == 1:
                _FUSED_ALL_GATHER(output.view(torch.uint8), tensor.view(torch.uint8))
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


# ---------------------------------------------------------------------------- collectives: public
# gather, broadcast, reduce and pad_across_processes check shapes in debug mode as @verify_operation
# does, but inline: outside debug mode the common path pays for no wrapper
def gather(tensor: Any) -> Any:
    """Every process's tensors concatenated along dim 0 (0-d tensors become 1-d), in rank order.

    All processes must pass tensors of the same shape (pad them with
    :func:`pad_across_processes` first). On one process the input is returned as it is.
    """
    # Fast path for the common call (one contiguous tensor, several processes, no debug mode): it
    # reads the attributes all PartialState instances share straight from their shared dict and
    # issues the collective at once. Right after a collective the interpreter runs with cold
    # caches, where each avoided Python step is worth ~1 % of a 1 MiB gather on a small CPU host.
    if heartbeat.active:  # progress for accel launch's hang watchdog
        heartbeat.beat()
    shared = PartialState._shared_state
    world = shared.get("num_processes", 0)
    if (world > 1 and type(tensor) is torch.Tensor and not _GATHER_MODE and not shared.get("debug", True)
            and shared.get("distributed_type", _NO) is not _NO and tensor.is_contiguous()
            and not tensor.requires_grad):
        shape = tensor.shape
        if shape:
            output = tensor.new_empty((world * shape[0], *shape[1:]))
        else:
            tensor = tensor.reshape(1)
            output = tensor.new_empty(world)
        try:
            _FUSED_ALL_GATHER(output, tensor)
        except Exception as exc:
            if not _is_unsupported(exc):
                raise
            _all_gather_fallback(output, tensor, world, first_mode=1)
        return output
    return _gather(tensor)


def _gather(tensor: Any) -> Any:
    state = PartialState()
    if not state.use_distributed:
        return tensor
    if state.debug:
        _check_across_processes(f"{__name__}.gather", tensor, state)
    world = state.num_processes
    if isinstance(tensor, torch.Tensor):
        return _gather_one(tensor, world)
    return recursively_apply(_gather_one, tensor, world, error_on_other_type=True)


def gather_object(object: Any) -> Any:
    """Every process's picklable object, flattened: each process passes a list and gets the
    concatenation of all lists in rank order (a non-list object is one element).

    On one process the object is returned as it is.
    """
    state = PartialState()
    if not state.use_distributed:
        return object
    everyone: list[Any] = [None] * state.num_processes
    dist.all_gather_object(everyone, object)
    result: list[Any] = []
    for item in everyone:
        if isinstance(item, (list, tuple)):
            result.extend(item)
        else:
            result.append(item)
    return result


def _broadcast_one(tensor: torch.Tensor, src: int) -> torch.Tensor:
    if tensor.is_contiguous():
        dist.broadcast(tensor, src=src)
        return tensor
    buffer = tensor.contiguous()  # broadcast needs contiguous memory; keep the in-place contract
    dist.broadcast(buffer, src=src)
    tensor.copy_(buffer)
    return tensor


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Overwrite every process's tensors, in place, with those of ``from_process``; returns them.

    All processes must pass tensors of the same shape and dtype.
    """
    state = PartialState()
    _check_process("from_process", from_process, state)
    if not state.use_distributed:
        return tensor
    if state.debug:
        _check_across_processes(f"{__name__}.broadcast", tensor, state)
    if isinstance(tensor, torch.Tensor):
        return _broadcast_one(tensor, from_process)
    return recursively_apply(_broadcast_one, tensor, from_process, error_on_other_type=True)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the items of ``object_list`` (in place) with those of ``from_process``'s list."""
    state = PartialState()
    _check_process("from_process", from_process, state)
    if state.use_distributed:
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


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


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduce every tensor across processes into a new tensor (inputs are left untouched).

    ``reduction``: "sum"; "mean" (sum / num_processes; integer inputs give a floating-point mean);
    "none" sums without dividing, as Accelerate does; "max"/"min" take the elementwise extreme.
    The result is multiplied by ``scale`` (Accelerate applies it on XLA only; accel everywhere, so
    the result does not depend on the device). On one process the result is a scaled copy (an integer
    "mean" still comes back as floating point, so the dtype never depends on the world size).
    """
    # fast path for one tensor summed or averaged across processes (see gather)
    shared = PartialState._shared_state
    world = shared.get("num_processes", 0)
    if (world > 1 and type(tensor) is torch.Tensor and (reduction == "sum" or reduction == "mean")
            and not shared.get("debug", True) and shared.get("distributed_type", _NO) is not _NO
            and tensor.is_contiguous()):
        result = tensor.clone()  # the one copy: the input stays untouched
        dist.all_reduce(result)  # SUM
        if reduction == "sum" and scale == 1.0:
            return result
        return _mean_and_scale(result, world, scale, reduction == "mean")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(map(repr, _REDUCTIONS))}, got {reduction!r}")
    state = PartialState()
    op = None
    divide_by = 1
    mean = reduction == "mean"
    if state.use_distributed:
        if state.debug:
            _check_across_processes(f"{__name__}.reduce", tensor, state)
        red = dist.ReduceOp
        op = red.MAX if reduction == "max" else red.MIN if reduction == "min" else red.SUM
        divide_by = state.num_processes if reduction == "mean" else 1
    if isinstance(tensor, torch.Tensor):
        return _reduce_one(tensor, op, divide_by, scale, mean)
    return recursively_apply(_reduce_one, tensor, op, divide_by, scale, mean, error_on_other_type=True)


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


def _leave_nested(t: torch.Tensor) -> torch.Tensor:
    if getattr(t, "is_nested", False):
        warnings.warn("Cannot pad nested tensors without more information; leaving them unprocessed.",
                      CannotPadNestedTensorWarning, stacklevel=4)
    return t


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False) -> Any:
    """Pad every tensor along ``dim`` to the largest size any process has, so they can be gathered.

    Padding is ``pad_index`` at the end (or the start with ``pad_first``). The sizes of all the
    tensors of a nested structure travel in one small collective. Tensors with fewer than ``dim``
    dimensions and nested (jagged) tensors are returned as they are.
    """
    state = PartialState()
    if not state.use_distributed:
        # keep the type check of the distributed path so single-process runs fail the same way
        return recursively_apply(_leave_nested, tensor, error_on_other_type=True)
    if state.debug:
        _check_across_processes(f"{__name__}.pad_across_processes", tensor, state, same_shape=False)
    # one entry per tensor leaf, in traversal order: the padded dimension, or None to leave it be
    leaves = _leaves(tensor, error_on_other_type=True)  # type errors before any collective
    plan: list[int | None] = []
    for t in leaves:
        d = dim + t.ndim if dim < 0 else dim
        plan.append(d if not getattr(t, "is_nested", False) and 0 <= d < t.ndim else None)
    padded_leaves = [(t, d) for t, d in zip(leaves, plan) if d is not None]
    if not padded_leaves:
        return recursively_apply(_leave_nested, tensor, error_on_other_type=True)
    device = padded_leaves[0][0].device
    local = torch.tensor([t.shape[d] for t, d in padded_leaves], dtype=torch.int64, device=device)
    everyone = torch.empty(state.num_processes * local.numel(), dtype=torch.int64, device=device)
    _all_gather_into(everyone, local, state.num_processes)
    largest = iter(everyone.view(state.num_processes, -1).amax(dim=0).tolist())
    steps = iter(plan)

    def _pad(t: torch.Tensor) -> torch.Tensor:
        d = next(steps)
        if d is None:
            return _leave_nested(t)
        return _pad_one(t, d, next(largest), pad_index, pad_first)

    return recursively_apply(_pad, tensor, error_on_other_type=True)


def _pad_input_one(tensor: torch.Tensor, batch_size: int, num_processes: int, dim: int) -> torch.Tensor:
    padded = -(-batch_size // num_processes) * num_processes  # next multiple of num_processes
    if tensor.shape[dim] == padded:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = padded
    result = tensor.new_zeros(shape)
    result.narrow(dim, 0, tensor.shape[dim]).copy_(tensor)
    return result


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Pad every tensor in ``tensor`` with zeros along ``dim`` to the next multiple of ``num_processes``.

    Used to split one batch evenly between processes (pipeline inference): a batch of 61 on 6
    processes becomes 66 rows, the 5 extra rows zero. A batch already divisible is returned as is.
    """
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be a positive integer, got {num_processes!r}")
    if not isinstance(batch_size, int) or batch_size < 0:
        raise ValueError(f"batch_size must be a non-negative integer, got {batch_size!r}")
    return recursively_apply(_pad_input_one, tensor, batch_size, num_processes, dim, error_on_other_type=True)


_DTYPE_CODES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
]
_MAX_DIMS = 64  # torch's own limit on tensor dimensions


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Give every process a copy of a tensor that only some processes have (the others pass None).

    Unlike :func:`broadcast`, the receivers need not know the shape or dtype. With one holder the
    tensor is broadcast from it; with several, as in Accelerate, their tensors (zeros elsewhere)
    are summed, so "main has it, the rest pass zeros" also works. Always returns a new tensor.
    """
    state = PartialState()
    if not state.use_distributed:
        if tensor is None:
            raise ValueError("copy_tensor_to_devices needs a tensor on at least one process; every process passed None")
        return tensor.clone()
    if tensor is not None and not isinstance(tensor, torch.Tensor):
        raise TypeError(f"copy_tensor_to_devices takes a tensor or None, got {type(tensor).__name__}")
    world = state.num_processes
    device = tensor.device if tensor is not None else state.device
    # header: [has tensor, dtype code, ndim, *shape]
    header = torch.zeros(3 + _MAX_DIMS, dtype=torch.int64, device=device)
    if tensor is not None:
        if tensor.dtype not in _DTYPE_CODES:
            raise TypeError(f"copy_tensor_to_devices cannot send dtype {tensor.dtype}")
        header[0] = 1
        header[1] = _DTYPE_CODES.index(tensor.dtype)
        header[2] = tensor.ndim
        header[3:3 + tensor.ndim] = torch.tensor(tensor.shape, dtype=torch.int64)
    everyone = torch.empty(world * header.numel(), dtype=torch.int64, device=device)
    _all_gather_into(everyone, header, world)
    rows = everyone.view(world, -1).tolist()
    holders = [rank for rank, row in enumerate(rows) if row[0]]
    if not holders:
        raise ValueError("copy_tensor_to_devices needs a tensor on at least one process; every process passed None")
    layouts = {rank: (rows[rank][1], tuple(rows[rank][3:3 + rows[rank][2]])) for rank in holders}
    if len(set(layouts.values())) > 1:
        detail = ", ".join(f"process {r}: {list(s)} {_DTYPE_CODES[c]}" for r, (c, s) in layouts.items())
        raise ValueError(f"copy_tensor_to_devices got different tensors on several processes ({detail})")
    code, shape = layouts[holders[0]]
    if tensor is None:
        result = torch.zeros(shape, dtype=_DTYPE_CODES[code], device=device)
    else:
        result = tensor.clone(memory_format=torch.contiguous_format)
    if len(holders) == 1:
        dist.broadcast(result, src=holders[0])
    else:
        dist.all_reduce(result, op=dist.ReduceOp.SUM)
    return result


# ---------------------------------------------------------------------------------------------------
# Accelerate's dtype codes for shape exchange, and ZeRO-3 parameter gathering
#: dtype -> the integer Accelerate sends beside a shape (``gather_tensor_shape``)
TENSOR_TYPE_TO_INT = {
    torch.float: 1, torch.double: 2, torch.half: 3, torch.bfloat16: 4, torch.uint8: 5,
    torch.int8: 6, torch.int16: 7, torch.int32: 8, torch.int64: 9, torch.bool: 10,
}
#: the inverse of :data:`TENSOR_TYPE_TO_INT`
TENSOR_INT_TO_DTYPE = {code: dtype for dtype, code in TENSOR_TYPE_TO_INT.items()}


def is_torch_xpu_tensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a torch tensor on an Intel XPU."""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xpu"


def gather_tensor_shape(tensor: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """The shape and dtype code of a tensor that one process holds (the others pass None), on every process.

    Returns ``(shape as an int tensor, code)``; :data:`TENSOR_INT_TO_DTYPE` maps the code back to a dtype.
    """
    state = PartialState()
    packed = torch.zeros(_MAX_DIMS + 1, dtype=torch.int64, device=state.device)
    if tensor is not None:
        if tensor.dtype not in TENSOR_TYPE_TO_INT:
            raise TypeError(f"gather_tensor_shape cannot send dtype {tensor.dtype}; "
                            f"supported: {sorted(map(str, TENSOR_TYPE_TO_INT))}")
        if tensor.dim() > _MAX_DIMS or any(size == 0 for size in tensor.shape):
            raise ValueError(f"gather_tensor_shape needs 1 to {_MAX_DIMS} non-zero dimensions, got shape {tuple(tensor.shape)}")
        packed[: tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        packed[-1] = TENSOR_TYPE_TO_INT[tensor.dtype]
    packed = reduce(packed, reduction="sum")
    dims = packed[:-1]
    return dims[dims.nonzero().flatten()], int(packed[-1])


class GatheredParameters:
    """Context manager gathering ZeRO-3 partitioned ``params`` (DeepSpeed's), a no-op without ZeRO-3.

    Lets code read or modify full parameters the same way whether or not DeepSpeed shards them.
    """

    def __init__(self, params: Any, modifier_rank: int | None = None, fwd_module: Any = None, enabled: bool = True):
        self.params, self.modifier_rank, self.fwd_module, self.enabled = params, modifier_rank, fwd_module, enabled
        self._context: Any = None

    def _inner(self) -> Any:
        import contextlib

        from ..state import AcceleratorState

        state = AcceleratorState()
        plugin = state.deepspeed_plugin if state.distributed_type == DistributedType.DEEPSPEED else None
        if plugin is None or not plugin.is_zero3_init_enabled():
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(self.params, modifier_rank=self.modifier_rank,
                                                 fwd_module=self.fwd_module, enabled=self.enabled)

    def __enter__(self) -> None:
        self._context = self._inner()
        self._context.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._context.__exit__(*exc)


__all__ += ["GatheredParameters", "TENSOR_INT_TO_DTYPE", "TENSOR_TYPE_TO_INT", "gather_tensor_shape", "is_torch_xpu_tensor"]
