"""Pipeline-parallel inference with ``torch.distributed.pipelining`` (``accelerate.inference``).

:func:`prepare_pippy` cuts a model into one stage per process at balanced split points, builds a
GPipe schedule and replaces ``model.forward``: the first process feeds the inputs (split into
micro-batches), the last process returns the output, the others return None (or everyone gets the
output with ``gather_output=True``). It runs on any backend with point-to-point collectives,
gloo on CPU included.
"""

from __future__ import annotations

from types import MethodType
from typing import Any, Optional, Union

import torch

from .state import PartialState
from .utils.operations import copy_tensor_to_devices, ignorant_find_batch_size, pad_input_tensors, send_to_device

__all__ = ["balanced_split_points", "build_pipeline", "find_pippy_batch_size", "pippy_forward", "prepare_pippy"]


def _cut_units(module: torch.nn.Module, no_split: set[str], prefix: str = "") -> list[tuple[str, int]]:
    """``(qualified name, parameter bytes)`` of the modules a pipeline may cut between, in forward order.

    A module is one unit when it has no children, owns parameters directly, or its class is in
    ``no_split``; otherwise its children are visited.
    """
    own = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
    children = list(module.named_children())
    if prefix and (not children or own or type(module).__name__ in no_split):
        return [(prefix, sum(p.numel() * p.element_size() for p in module.parameters()))]
    units: list[tuple[str, int]] = []
    for name, child in children:
        units.extend(_cut_units(child, no_split, f"{prefix}.{name}" if prefix else name))
    return units


def balanced_split_points(model: torch.nn.Module, num_stages: int, no_split_module_classes: Optional[list[str]] = None) -> list[str]:
    """Names of the ``num_stages - 1`` modules that begin stages 2..n, balancing parameter bytes per stage."""
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    units = _cut_units(model, set(no_split_module_classes or ()))
    if num_stages > len(units):
        raise ValueError(f"cannot cut the model into {num_stages} stages: it has only {len(units)} splittable "
                         f"modules ({[name for name, _ in units]})")
    sizes = [size for _, size in units]
    if not any(sizes):
        sizes = [1] * len(units)  # no parameters: balance the number of modules instead
    total = sum(sizes)
    points: list[str] = []
    running = 0
    for index, (name, _) in enumerate(units):
        stages_left = num_stages - 1 - len(points)
        if stages_left == 0:
            break
        # cut before this unit once the running share is reached, or when each remaining unit must start a stage
        if index > 0 and (running >= total * (len(points) + 1) / num_stages or len(units) - index == stages_left):
            points.append(name)
        running += sizes[index]
    return points


def find_pippy_batch_size(args: Any, kwargs: Any) -> Optional[int]:
    """The batch size of the first tensor found in ``args``, then in ``kwargs`` (None when there is none)."""
    for value in list(args or ()) + list((kwargs or {}).values()):
        found = ignorant_find_batch_size(value)
        if found is not None:
            return found
    return None


def build_pipeline(model: torch.nn.Module, split_points: list[str], args: tuple, kwargs: Optional[dict], num_chunks: int) -> Any:
    """Trace ``model`` on the example inputs, cut it before each of ``split_points`` and return a GPipe schedule
    for this process's stage (``num_chunks`` micro-batches per call)."""
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    state = PartialState()
    pipe = pipeline(model, mb_args=args, mb_kwargs=kwargs, split_spec={p: SplitPoint.BEGINNING for p in split_points})
    if pipe.num_stages != state.num_processes:
        raise ValueError(f"the split gave {pipe.num_stages} stages for {state.num_processes} processes; "
                         "pass one split point fewer than there are processes")
    stage = pipe.build_stage(state.process_index, device=state.device)
    return ScheduleGPipe(stage, num_chunks)


def pippy_forward(forward: Any, num_chunks: int, gather_output: bool, *args: Any, **kwargs: Any) -> Any:
    """One pipelined call: the first process feeds the inputs (padded to a multiple of ``num_chunks``), the last
    returns the output; with ``gather_output`` every process gets a copy of it."""
    state = PartialState()
    output = None
    if state.num_processes == 1:
        output = forward(*args, **kwargs)
    elif state.process_index == 0:
        batch = find_pippy_batch_size(args, kwargs)
        if batch is None:
            raise ValueError("prepare_pippy's forward found no tensor in its arguments to take the batch size from")
        if batch % num_chunks:
            args = pad_input_tensors(args, batch, num_chunks)
            kwargs = pad_input_tensors(kwargs, batch, num_chunks)
        forward(*args, **kwargs)
    elif state.is_last_process:
        output = forward()
    else:
        forward()
    if gather_output and state.num_processes > 1:
        output = copy_tensor_to_devices(output)
    return output


def prepare_pippy(
    model: torch.nn.Module,
    split_points: Optional[Union[str, list[str]]] = "auto",
    no_split_module_classes: Optional[list[str]] = None,
    example_args: Optional[tuple[Any, ...]] = (),
    example_kwargs: Optional[dict[str, Any]] = None,
    num_chunks: Optional[int] = None,
    gather_output: Optional[bool] = False,
) -> torch.nn.Module:
    """Make ``model`` run as a pipeline over the processes: one stage per process, ``num_chunks`` micro-batches.

    ``split_points="auto"`` balances parameter bytes over the stages (modules of a class in
    ``no_split_module_classes`` stay whole); a list names the modules that begin stages 2..n.
    ``example_args``/``example_kwargs`` are one micro-batch of inputs (traced on the host). Every
    process must call the new ``model.forward`` together.
    """
    from .utils.imports import is_pippy_available

    if not is_pippy_available():
        raise ImportError("prepare_pippy needs torch.distributed.pipelining (torch >= 2.4)")
    state = PartialState()
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("prepare_pippy runs one pipeline stage per process and needs a process group: start the "
                           "script with `accel launch --num_processes N` (or torchrun), N >= 2")
    if num_chunks is None:
        num_chunks = state.num_processes
    if num_chunks < 1:
        raise ValueError(f"num_chunks must be >= 1, got {num_chunks}")
    if split_points == "auto":
        split_points = balanced_split_points(model, state.num_processes, no_split_module_classes)
    elif isinstance(split_points, str):
        split_points = [split_points]
    split_points = list(split_points)
    names = dict(model.named_modules())
    unknown = [p for p in split_points if p not in names]
    if unknown:
        raise ValueError(f"split points {unknown} are not modules of {type(model).__name__}")
    example_args = send_to_device(example_args, "cpu")
    example_kwargs = send_to_device(example_kwargs, "cpu")
    schedule = build_pipeline(model, split_points, tuple(example_args or ()), example_kwargs, num_chunks)
    model._original_forward = model.forward
    model.pippy_stage = schedule
    model.hf_split_points = split_points

    def forward(*args: Any, **kwargs: Any) -> Any:
        return pippy_forward(schedule.step, num_chunks, gather_output, *args, **kwargs)

    forward.__wrapped__ = MethodType(type(model).forward, model)
    model.forward = forward
    return model
