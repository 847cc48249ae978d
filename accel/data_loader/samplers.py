"""Samplers that shard, skip or reseed batches, so every process reads its own share of the data."""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler


def _default_generator() -> torch.Generator:
    """A generator on torch's default device, as ``RandomSampler`` would create one."""
    get_default = getattr(torch, "get_default_device", None)
    return torch.Generator(device=get_default() if get_default is not None else "cpu")


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose permutation depends only on ``data_seed`` (or torch's initial seed) + epoch.

    Every process builds the same permutation for an epoch without any communication, and a resumed run
    rebuilds it exactly. The epoch advances by one after each full pass; ``set_epoch`` overrides it.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        data_seed = kwargs.pop("data_seed", None)
        super().__init__(*args, **kwargs)
        self.initial_seed = torch.random.initial_seed() if data_seed is None else data_seed
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = _default_generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class _WrapsBatchSampler:
    """For batch samplers that wrap another: ``sampler`` is the index sampler underneath (so
    ``get_sampler`` and ``set_epoch`` find it through any number of wrappers)."""

    batch_sampler: Any

    @property
    def sampler(self) -> Any:
        """The index sampler underneath (so ``get_sampler`` finds it through the shard)."""
        return getattr(self.batch_sampler, "sampler", None)

    @sampler.setter
    def sampler(self, sampler: Any) -> None:
        self.batch_sampler.sampler = sampler


class BatchSamplerShard(_WrapsBatchSampler, BatchSampler):
    """The batches of ``batch_sampler`` that belong to process ``process_index`` of ``num_processes``.

    ``split_batches=False``: process *p* gets batches p, p+N, p+2N, ... (the global batch is N batches).
    ``split_batches=True``: every batch is cut in N equal slices and process *p* gets slice *p* (the batch
    size must divide by N). With ``even_batches`` (and the inner sampler not dropping its last batch) the
    last global batch is completed with indices from the start of the data, so every process sees the same
    number of full batches and collectives stay in step; without it the last batches are simply uneven.
    """

    def __init__(
        self,
        batch_sampler: BatchSampler,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ):
        # BatchSampler.__init__ is deliberately not called: this wraps a batch sampler, not a sampler.
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)
        if split_batches and (self.batch_size is None or self.batch_size % num_processes != 0):
            raise ValueError(
                f"To use `BatchSamplerShard` in `split_batches` mode, the batch size ({self.batch_size}) "
                f"needs to be a round multiple of the number of processes ({num_processes})."
            )

    @property
    def total_length(self) -> int:
        return len(self.batch_sampler)

    def __len__(self) -> int:
        total = len(self.batch_sampler)
        if self.split_batches:
            return total
        full_rounds, leftover = divmod(total, self.num_processes)
        if leftover == 0 or self.drop_last:
            return full_rounds
        if self.even_batches:
            return full_rounds + 1
        return full_rounds + (1 if self.process_index < leftover else 0)

    def __iter__(self) -> Iterator[list]:
        return self._iter_split() if self.split_batches else self._iter_whole()

    def _iter_split(self) -> Iterator[list]:
        size = self.batch_size
        share = size // self.num_processes
        lo, hi = share * self.process_index, share * (self.process_index + 1)
        first: list | None = None
        last: list | None = None
        for batch in self.batch_sampler:
            if first is None:
                first = list(batch)
            last = batch
            if len(batch) == size:
                yield batch[lo:hi]
        if self.drop_last or first is None or len(last) == size:
            return
        # the last batch is short
        if not self.even_batches:
            if len(last) > lo:
                yield last[lo:hi]
            return
        filler = first
        while len(filler) < size:  # less data than one batch: repeat it
            filler = filler + filler
        yield (list(last) + filler)[lo:hi]

    def _iter_whole(self) -> Iterator[list]:
        n, me, size = self.num_processes, self.process_index, self.batch_size
        keep_head = not self.drop_last
        head: list = []  # indices (or, without a batch size, batches) of the first round, to loop back to
        mine = None  # this process's batch in the current round
        position = -1
        batch: list = []
        for position, batch in enumerate(self.batch_sampler):
            if keep_head and position < n:
                if size is None:
                    head.append(batch)
                else:
                    head.extend(batch)
            slot = position % n
            if slot == me:
                mine = batch
            if slot == n - 1 and (size is None or len(batch) == size):
                yield mine
                mine = None
        if not keep_head or not head:
            return
        if not self.even_batches:
            if mine:
                yield mine
            return
        if mine and (size is None or len(mine) == size):
            yield mine
        # complete the last round from the head of the data
        needed = n if size is None else n * size
        while len(head) < needed:
            head = head + head
        if size is None or len(batch) == size:
            partial: list = []
            position += 1
        else:
            partial = list(batch)
        cursor = 0
        while position % n != 0 or partial:
            if size is None:
                filled = head[cursor]
                cursor += 1
            else:
                end = cursor + size - len(partial)
                filled = partial + head[cursor:end]
                cursor = end
            if position % n == me:
                yield filled
            partial = []
            position += 1


class IterableDatasetShard(IterableDataset):
    """The elements of an iterable dataset that belong to one process.

    Elements are read in global batches (``batch_size * num_processes`` elements, or ``batch_size`` with
    ``split_batches``) and each process keeps its contiguous slice of every global batch. Unless
    ``drop_last``, a short final global batch is completed by repeating elements of the first one.
    """

    def __init__(
        self,
        dataset: IterableDataset,
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
    ):
        if split_batches and batch_size > 1 and batch_size % num_processes != 0:
            raise ValueError(
                f"To use `IterableDatasetShard` in `split_batches` mode, the batch size ({batch_size}) "
                f"needs to be a round multiple of the number of processes ({num_processes})."
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    @property
    def total_batch_size(self) -> int:
        """Elements of one global batch: what all processes read together in a step."""
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def total_length(self) -> int:
        """Length of the wrapped dataset (all processes together), for ``remainder``."""
        return len(self.dataset)

    def __len__(self) -> int:
        per_process = self.batch_size // self.num_processes if self.split_batches else self.batch_size
        rounds = len(self.dataset) / self.total_batch_size
        return (math.floor(rounds) if self.drop_last else math.ceil(rounds)) * per_process

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)
        global_size = self.total_batch_size
        per_process = self.batch_size // self.num_processes if self.split_batches else self.batch_size
        lo, hi = self.process_index * per_process, (self.process_index + 1) * per_process
        first: list | None = None
        pending: list = []
        for element in self.dataset:
            pending.append(element)
            if len(pending) == global_size:
                yield from pending[lo:hi]
                if first is None:
                    first = pending
                pending = []
        if self.drop_last or not pending:
            return
        filler = pending[:] if first is None else first
        while len(pending) < global_size:
            pending = pending + filler
        yield from pending[lo:hi]


class SkipBatchSampler(_WrapsBatchSampler, BatchSampler):
    """Yields the batches of ``batch_sampler`` after the first ``skip_batches``.

    ``keep_head`` (0 at first): how many of the skipped first batches each iteration keeps in
    ``head_batches`` (a ``DataLoaderDispatcher`` sets it to complete a short last step with the epoch's
    first rows). The constructor keeps Accelerate's signature.
    """

    def __init__(self, batch_sampler: Any, skip_batches: int = 0):
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches
        self.keep_head = 0
        self.head_batches: list = []

    def __iter__(self) -> Iterator[list]:
        skip, keep = self.skip_batches, self.keep_head
        head: list = []
        self.head_batches = head
        for index, batch in enumerate(self.batch_sampler):
            if index >= skip:
                yield batch
            elif index < keep:
                head.append(batch)

    @property
    def total_length(self) -> int:
        return len(self.batch_sampler)

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip_batches, 0)  # resuming at the very end: nothing left


def _unskipped(batch_sampler: Any) -> Any:
    """The batch sampler under any ``SkipBatchSampler`` wrappers (the one that knows the batch size)."""
    while isinstance(batch_sampler, SkipBatchSampler):
        batch_sampler = batch_sampler.batch_sampler
    return batch_sampler


def get_sampler(dataloader: DataLoader) -> Any:
    """The index sampler of ``dataloader`` (under its batch sampler, sharded or not)."""
    if isinstance(dataloader.sampler, BatchSampler):
        return getattr(dataloader.sampler, "sampler", None)
    return getattr(dataloader.batch_sampler, "sampler", None)
