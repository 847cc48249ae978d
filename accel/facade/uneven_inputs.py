"""When processes do not get the same number of samples: trimming gathered metrics, joining early.

A prepared loader pads its last batch by repeating samples so every process steps alike;
:func:`gather_for_metrics` gathers and drops those repeats again. :func:`join_uneven_inputs` lets DDP
processes with fewer batches leave early (``torch.distributed.algorithms.Join``) instead of hanging.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator, Sequence

__all__ = ["gather_for_metrics", "join_uneven_inputs"]


def gather_for_metrics(input_data: Any, gradient_state: Any, use_gather_object: bool = False) -> Any:
    """``input_data`` gathered from every process, less the samples repeated to even out the last batch.

    ``gradient_state`` says whether the loader is at its end and how many samples of the last batch are
    real (``remainder``). Data without tensors is gathered as objects (so is any with ``use_gather_object``).
    """
    from ..utils.operations import gather, gather_object, recursively_apply

    if not use_gather_object:
        leaves: list[bool] = []
        recursively_apply(lambda t: leaves.append(True) or t, input_data)
        use_gather_object = not leaves
    data = gather_object(input_data) if use_gather_object else gather(input_data)
    if not gradient_state.end_of_dataloader or gradient_state.remainder <= 0:
        return data
    keep = gradient_state.remainder
    if use_gather_object:
        return data[:keep]
    return recursively_apply(lambda t: t[:keep], data)


@contextlib.contextmanager
def join_uneven_inputs(joinables: list[Any], distributed_type: Any, use_distributed: bool, dataloaders: Sequence[Any],
                       even_batches: bool | None = None) -> Iterator[None]:
    """Run the block under ``Join(joinables)`` on a multi-process data-parallel run; elsewhere as it is.

    ``even_batches`` overrides the setting of the map-style ``dataloaders`` for the block (iterable ones
    cannot change it: a warning says so). Outside multi-device data parallelism a warning says the
    block runs without joining (no warning for a single process, ``NO``).
    """
    from ..utils.dataclasses import DistributedType

    distributed_type = DistributedType(distributed_type)
    if not (use_distributed and distributed_type.is_multi_device_data_parallel):
        if distributed_type != DistributedType.NO:
            # Accelerate's wording, word for word: scripts and tests match it
            warnings.warn("Joining uneven inputs is only supported for multi-GPU training, as a result "
                          "`join_uneven_inputs` will have no effect.", stacklevel=3)
        yield
        return
    from torch.distributed.algorithms.join import Join

    previous = []
    if even_batches is not None:
        iterable_seen = False
        for loader in dataloaders:
            sampler = getattr(loader, "batch_sampler", None)
            if sampler is not None and hasattr(sampler, "even_batches"):
                previous.append((sampler, sampler.even_batches))
                sampler.even_batches = even_batches
            else:
                iterable_seen = True
        if iterable_seen:
            warnings.warn("Overriding even_batches is only supported for map-style datasets, yet some "
                          "dataloaders given were iterable", stacklevel=3)
    try:
        with Join(joinables):
            yield
    finally:
        for sampler, value in previous:
            sampler.even_batches = value
