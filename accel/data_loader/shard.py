"""The sharding loader: each process reads its own share, and batches are moved to the process's device."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
from torch.utils.data import BatchSampler

from ..backends import is_host_device
from ..state import GradientState
from ..utils.dataclasses import RNGType
from ..utils.random import synchronize_rng_states
from .adapter import DataLoaderAdapter
from .progress import DataLoaderStateMixin
from .samplers import IterableDatasetShard, _unskipped


def _placer(device: Any, non_blocking: bool) -> Callable[[Any], Any] | None:
    """The function that moves each batch to ``device`` (``None``: batches stay where they are).

    A plain tuple, list or dict of tensors that already sit on ``device`` is handed back as it is:
    ``Tensor.to`` would return the very same tensors, at a cost per tensor that is paid on every batch.
    Anything else goes through ``send_to_device``.
    """
    if device is None:
        return None
    from ..utils.operations import send_to_device

    try:
        target = torch.device(device)
    except (TypeError, RuntimeError):  # something send_to_device understands but torch.device does not
        target = None
    tensor = torch.Tensor
    on_cpu = target is not None and is_host_device(target)  # ``is_cpu`` is cheaper than building ``.device``

    def place(batch: Any) -> Any:
        kind = type(batch)
        if target is not None and (kind is tuple or kind is list or kind is dict):
            for value in (batch.values() if kind is dict else batch):
                if type(value) is not tensor or not (value.is_cpu if on_cpu else value.device == target):
                    break
            else:
                return batch
        return send_to_device(batch, device, non_blocking=non_blocking)

    return place


class DataLoaderShard(DataLoaderAdapter, DataLoaderStateMixin):
    """This process's share of a loader: moves batches to ``device`` and keeps RNGs in step.

    At the start of every iteration the ``rng_types`` (and ``synchronized_generator``, the sampler's
    generator) are copied from the main process, so every process shuffles alike and each takes its own
    share. ``skip_batches`` drops the first batches of every iteration (resuming mid-epoch).
    """

    def __init__(
        self,
        dataset: Any,
        device: torch.device | None = None,
        rng_types: list[str | RNGType] | None = None,
        synchronized_generator: torch.Generator | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ):
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.device = device
        self.rng_types = rng_types
        self.synchronized_generator = synchronized_generator
        self.skip_batches = skip_batches
        self.gradient_state = GradientState()
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.torch_device_mesh = torch_device_mesh
        self.iteration = iteration

    def wrapper_kwargs(self) -> dict[str, Any]:
        """This class's own constructor arguments (beyond ``DataLoader``'s) that rebuild a loader with
        these settings; ``skip_first_batches`` builds its copy from them."""
        return {
            "device": self.device,
            "rng_types": self.rng_types,
            "synchronized_generator": self.synchronized_generator,
            "_drop_last": self._drop_last,
            "_non_blocking": self._non_blocking,
            "torch_device_mesh": self.torch_device_mesh,
            "iteration": self.iteration,
            "use_stateful_dataloader": self.use_stateful_dataloader,
        }

    def __iter__(self) -> Iterator[Any]:
        if self.rng_types is not None:
            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        self.begin()
        try:
            self.set_epoch(self.iteration)
            batches = self._plain_iter()
            try:
                current = next(batches)
            except StopIteration:
                return
            place = _placer(self.device, self._non_blocking)
            skip, stateful = self.skip_batches, self.use_stateful_dataloader
            if not skip and not stateful:  # the usual epoch, without the per-batch bookkeeping of the loop below
                if place is not None:
                    current = place(current)
                for upcoming in batches:  # one batch of look-ahead, so the last one is known as the last
                    yield current
                    current = place(upcoming) if place is not None else upcoming
                self.end_of_dataloader = True
                yield current
                self._advance_epoch()
                return
            index = 0
            while True:
                if place is not None:  # move before looking ahead, so the copy overlaps the next fetch
                    current = place(current)
                if stateful:
                    self._remember_position()
                try:
                    upcoming = next(batches)
                except StopIteration:
                    self.end_of_dataloader = True
                    if stateful:
                        self._remember_position(finished=True)
                    if index >= skip:
                        yield current
                    break
                if index >= skip:
                    yield current
                index += 1
                current = upcoming
            self._advance_epoch()
        finally:
            self.end()

    @property
    def total_batch_size(self) -> int:
        """Samples per step over all processes."""
        if isinstance(self.dataset, IterableDatasetShard):
            return self.dataset.total_batch_size
        holder = _unskipped(self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler)
        if getattr(holder, "split_batches", False):
            return holder.batch_size
        return holder.batch_size * getattr(holder, "num_processes", 1)

    @property
    def total_dataset_length(self) -> int:
        """Length of the dataset over all processes, for ``remainder``."""
        return getattr(self.dataset, "total_length", None) or len(self.dataset)


class SkipDataLoader(DataLoaderAdapter, DataLoaderStateMixin):
    """A ``DataLoader`` that drops its first ``skip_batches`` batches (for iterable datasets)."""

    def __init__(self, dataset: Any, skip_batches: int = 0, use_stateful_dataloader: bool = False, **kwargs: Any):
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.skip_batches = skip_batches
        self.gradient_state = GradientState()

    def __iter__(self) -> Iterator[Any]:
        self.begin()
        try:
            skip = self.skip_batches
            for index, batch in enumerate(self._plain_iter()):
                if index >= skip:
                    self._remember_position()
                    yield batch
            self._remember_position(finished=True)
        finally:
            self.end()

    def __len__(self) -> int:
        return self._plain_len() - self.skip_batches
