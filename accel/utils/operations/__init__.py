"""Tensor operations and collectives with Accelerate's names (``gather``, ``reduce``, ``broadcast``, ...).

Every operation takes a tensor or a nested list/tuple/namedtuple/dict of tensors and works on one
process (no process group: identity or trivial results) and on N processes through
``torch.distributed`` with the group ``PartialState`` set up. Nothing here knows about devices:
tensors stay where they are and the process group's backend moves them.

Speed matters: ``gather`` and ``reduce`` are on the hot path of evaluation loops, so the fast path
is one collective into one preallocated output, with no shape exchange unless debug mode
(``ACCEL_DEBUG_MODE=1`` / ``ACCELERATE_DEBUG_MODE=1``) asks for one.

The nested-structure helpers live in :mod:`accel.utils.operations._structure` and the per-tensor
collective plumbing (the fused all-gather and its fallbacks) in :mod:`accel.utils.operations._collectives`;
every public name is importable from here.
"""

from __future__ import annotations

import pickle
import warnings
from dataclasses import dataclass
from functools import update_wrapper, wraps
from typing import Any, Callable

import torch
import torch.distributed as dist

from ...state import PartialState
from ..dataclasses import DistributedType
from . import _collectives
from ...launch import heartbeat
from ._collectives import (
    _DTYPE_CODES,
    _GATHER_MODE,
    _MAX_DIMS,
    _REDUCTIONS,
    _all_gather_fallback,
    _all_gather_into,
    _broadcast_one,
    _check_process,
    _gather_one,
    _is_unsupported,
    _mean_and_scale,
    _pad_input_one,
    _pad_one,
    _reduce_one,
)
from ._structure import (
    TensorInformation,
    _leaves,
    concatenate,
    find_batch_size,
    find_device,
    get_data_structure,
    get_shape,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    listify,
    recursively_apply,
    send_to_device,
    slice_tensors,
)

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


_NO = DistributedType.NO
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
            _collectives.FUSED_ALL_GATHER(output, tensor)  # looked up there: the one place to replace it
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

        from ...state import AcceleratorState

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
