"""Data loaders that shard or dispatch batches across processes, with Accelerate's names and semantics.

Two ways to feed N processes from one ``DataLoader``:

* **sharding** (``DataLoaderShard``): every process runs its own loader over its own share of the
  indices (``BatchSamplerShard``) or of the stream (``IterableDatasetShard``);
* **dispatching** (``DataLoaderDispatcher``): only the main process reads data; it broadcasts each
  global batch and every process keeps its slice.

Both look one batch ahead so ``end_of_dataloader`` is already true while the last batch is being
used, and both report ``remainder`` (real samples in the last global batch) so ``gather_for_metrics``
can drop the samples that were repeated to give every process a full batch.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from .state import GradientState, PartialState
from .utils.dataclasses import DistributedType, RNGType
from .utils.random import synchronize_rng_states

__all__ = [
    "BatchSamplerShard",
    "DataLoaderAdapter",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "get_sampler",
    "prepare_data_loader",
    "skip_first_batches",
]

# Arguments the wrappers rebuild themselves instead of copying from the original loader.
_REBUILT_ARGS = frozenset({"dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"})


@functools.cache
def _dataloader_arg_defaults() -> dict[str, Any]:
    """``DataLoader.__init__`` keyword defaults of the installed torch (new arguments come for free)."""
    params = inspect.signature(DataLoader.__init__).parameters
    return {
        name: p.default
        for name, p in params.items()
        if name != "self" and name not in _REBUILT_ARGS and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def _copied_loader_kwargs(dataloader: Any) -> dict[str, Any]:
    """Settings (workers, collate_fn, pinning, ...) to carry from ``dataloader`` to its replacement."""
    return {name: getattr(dataloader, name, default) for name, default in _dataloader_arg_defaults().items()}


def _default_generator() -> torch.Generator:
    get_default = getattr(torch, "get_default_device", None)
    return torch.Generator(device=get_default() if get_default is not None else "cpu")


def _ops():
    # imported on first use: operations pulls in the collectives, which plain imports should not pay for
    from .utils import operations

    return operations


# ---------------------------------------------------------------------------------------------- samplers
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
    def _global_batch(self) -> int:
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def total_length(self) -> int:
        """Length of the wrapped dataset (all processes together), for ``remainder``."""
        return len(self.dataset)

    def __len__(self) -> int:
        per_process = self.batch_size // self.num_processes if self.split_batches else self.batch_size
        rounds = len(self.dataset) / self._global_batch
        return (math.floor(rounds) if self.drop_last else math.ceil(rounds)) * per_process

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)
        global_size = self._global_batch
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
    """Yields the batches of ``batch_sampler`` after the first ``skip_batches``."""

    _keep_head = 0  # a dispatcher sets this to recover the skipped first step's indices

    def __init__(self, batch_sampler: Any, skip_batches: int = 0):
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches
        self.head_batches: list = []

    def __iter__(self) -> Iterator[list]:
        skip, keep = self.skip_batches, self._keep_head
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


# ---------------------------------------------------------------------------------------------- loaders
def _set_epoch_everywhere(loader: DataLoader, epoch: int) -> None:
    """Pass ``epoch`` to every sampler in the wrapper chain that has ``set_epoch``, and to the dataset."""
    seen: set[int] = set()
    todo = [loader.batch_sampler if loader.batch_sampler is not None else loader.sampler]
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)
        todo.append(getattr(obj, "batch_sampler", None))
        todo.append(getattr(obj, "sampler", None))
    if hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(epoch)


def _unskipped(batch_sampler: Any) -> Any:
    while isinstance(batch_sampler, SkipBatchSampler):
        batch_sampler = batch_sampler.batch_sampler
    return batch_sampler


class DataLoaderStateMixin:
    """Tracks where an iteration stands and registers the loader with ``GradientState`` while it runs.

    ``end_of_dataloader`` is true while the last batch is in use; ``remainder`` is the number of real
    samples in the last global batch (``-1`` when unknown), so ``gather_for_metrics`` can cut the repeats.
    Classes using it set ``self.gradient_state = GradientState()``.
    """

    end_of_dataloader: bool = False
    remainder: int = -1
    _drop_last: bool = False

    def reset(self) -> None:
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Start of an iteration: reset the flags and become the active loader of ``GradientState``."""
        self.reset()
        if not self._drop_last:
            try:
                length = getattr(self.dataset, "total_dataset_length", None)
                if length is None:
                    length = self.total_dataset_length
                self.remainder = length % self.total_batch_size
            except Exception:  # unsized dataset or unknown batch size: remainder stays unknown
                pass
        self.gradient_state._add_dataloader(self)

    def end(self) -> None:
        """End of an iteration (also after a ``break``): stop being the active loader."""
        self.gradient_state._remove_dataloader(self)

    #: the loader a ``skip_first_batches`` copy resumes for; it shares the epoch counter
    _epoch_owner: Any = None

    def set_epoch(self, epoch: int) -> None:
        """Epoch for samplers / datasets that reshuffle per epoch (``set_epoch`` anywhere in the chain)."""
        self.iteration = epoch
        _set_epoch_everywhere(self, epoch)

    def _advance_epoch(self) -> None:
        """An epoch finished: count it here and in the loader this one stands in for, so the
        next epoch of the original reshuffles instead of replaying this epoch's order."""
        self.iteration += 1
        if self._epoch_owner is not None:
            self._epoch_owner.iteration = max(self._epoch_owner.iteration, self.iteration)


class _LoaderItself:
    """``loader.base_dataloader``: the loader itself (accel's loaders *are* the ``DataLoader``, or the
    ``StatefulDataLoader``, that Accelerate keeps in an attribute). Read on the class it raises
    AttributeError, as Accelerate's instance attribute does."""

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:
            raise AttributeError(f"'base_dataloader' is an attribute of {owner.__name__} instances, not of the class")
        return instance

    def __set__(self, instance: Any, value: Any) -> None:
        raise AttributeError("base_dataloader cannot be replaced: accel's loaders are the underlying loader")


def _stateful_dataloader_class() -> type:
    """torchdata's ``StatefulDataLoader``; ImportError naming the package when torchdata is missing."""
    from .utils.imports import is_torchdata_stateful_dataloader_available

    if not is_torchdata_stateful_dataloader_available():
        raise ImportError(
            "StatefulDataLoader is not available. Please install torchdata version 0.8.0 or higher to use it "
            "(pip install 'torchdata>=0.8.0')."
        )
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader


class _StatefulLoader:
    """What the stateful variant of an accel loader adds: a checkpointable position.

    ``state_dict()`` describes the batches handed to the caller so far (the loaders read one batch
    ahead; the state is taken before that read, so a restored loader continues with the next batch
    the caller has not seen). ``load_state_dict`` restores it before the next iteration.
    """

    _plain_class: type

    def state_dict(self) -> dict[str, Any]:
        """torchdata's state of this loader at the last batch handed out (the live state before any)."""
        snapshot = self.__dict__.get("_position")
        return dict(snapshot) if snapshot is not None else super().state_dict()  # type: ignore[misc]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict`` (from :meth:`state_dict`) at the next iteration."""
        self.__dict__["_position"] = None
        super().load_state_dict(state_dict)  # type: ignore[misc]

    def __reduce_ex__(self, protocol: Any) -> Any:
        # the combined class is built at run time: pickle the plain accel class and rebuild it on load
        return (_rebuild_stateful, (self._plain_class,), self.__getstate__())


_STATEFUL_CLASSES: dict[type, type] = {}


def _stateful_variant(cls: type) -> type:
    """``cls`` combined with torchdata's ``StatefulDataLoader`` (one class per ``cls``, cached)."""
    variant = _STATEFUL_CLASSES.get(cls)
    if variant is None:
        base = _stateful_dataloader_class()
        variant = type(cls.__name__, (_StatefulLoader, cls, base), {"_plain_class": cls, "__module__": cls.__module__,
                                                                       "__qualname__": cls.__qualname__,
                                                                       "__doc__": cls.__doc__})
        _STATEFUL_CLASSES[cls] = variant
    return variant


def _rebuild_stateful(cls: type) -> Any:
    return object.__new__(_stateful_variant(cls))


class _PicksStatefulVariant:
    """Creates the torchdata-backed variant of an accel loader when ``use_stateful_dataloader=True``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # the stateful variant is chosen at creation (an instance's class cannot be swapped later:
        # torchdata's loader has a different memory layout)
        stateful = kwargs.get("use_stateful_dataloader", False)
        if "use_stateful_dataloader" not in kwargs and args:
            try:
                stateful = inspect.signature(cls.__init__).bind(None, *args, **kwargs).arguments.get(
                    "use_stateful_dataloader", False)
            except TypeError:  # wrong arguments: let __init__ report them
                stateful = False
        if stateful and not issubclass(cls, _StatefulLoader):
            cls = _stateful_variant(cls)
        return super().__new__(cls)


class DataLoaderAdapter(_PicksStatefulVariant, DataLoader):
    """Base of the accel loaders: a real ``DataLoader`` subclass, so ``isinstance(dl, DataLoader)`` holds.

    With ``use_stateful_dataloader=True`` (needs torchdata >= 0.8) the loader is also a torchdata
    ``StatefulDataLoader`` (``isinstance`` holds for both and for the accel class) and has
    ``state_dict()``/``load_state_dict()``, which checkpoints save and restore. ``base_dataloader``
    is the loader itself.
    """

    base_dataloader = _LoaderItself()

    def __init__(self, dataset: Any, use_stateful_dataloader: bool = False, batch_sampler: Any = None, **kwargs: Any):
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self.use_stateful_dataloader = bool(use_stateful_dataloader)
        self._position: dict[str, Any] | None = None

    def _remember_position(self, finished: bool = False) -> None:
        """Stateful loaders: keep the state that resumes after the batches handed out so far."""
        if self.use_stateful_dataloader:
            position = super().state_dict()  # type: ignore[misc]
            if finished:
                position["_iterator_finished"] = True
            self._position = position

    def __getstate__(self) -> dict:
        # the shared process/gradient states are re-attached on load, never copied (a copy would detach
        # the loader from the GradientState that gather_for_metrics reads)
        state = self.__dict__.copy()
        for key in ("gradient_state", "state"):
            if key in state:
                state[key] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "gradient_state" in state:
            self.__dict__["gradient_state"] = GradientState()
        if "state" in state:
            self.__dict__["state"] = PartialState()

    def _plain_iter(self) -> Iterator[Any]:
        # the next class in the MRO: DataLoader, or torchdata's StatefulDataLoader for stateful loaders
        return super().__iter__()

    def _plain_len(self) -> int:
        return super().__len__()

    def get_sampler(self) -> Any:
        return get_sampler(self)

    def set_sampler(self, sampler: Any) -> None:
        """Replace the index sampler under the (possibly sharded) batch sampler."""
        holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        holder.sampler = sampler
        inner = getattr(holder, "batch_sampler", None)
        if inner is not None:
            inner.sampler = sampler


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
            device, non_blocking, skip = self.device, self._non_blocking, self.skip_batches
            send = _ops().send_to_device if device is not None else None
            index = 0
            stateful = self.use_stateful_dataloader
            while True:
                if send is not None:  # move before looking ahead, so the copy overlaps the next fetch
                    current = send(current, device, non_blocking=non_blocking)
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
            return self.dataset._global_batch
        holder = _unskipped(self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler)
        if getattr(holder, "split_batches", False):
            return holder.batch_size
        return holder.batch_size * getattr(holder, "num_processes", 1)

    @property
    def total_dataset_length(self) -> int:
        return getattr(self.dataset, "total_length", None) or len(self.dataset)


class DataLoaderDispatcher(DataLoaderAdapter, DataLoaderStateMixin):
    """The main process reads every batch; each process receives its slice by broadcast.

    Without ``split_batches`` the main process reads ``num_processes`` batches per step and concatenates
    them; with it, one batch that is cut in ``num_processes`` slices. A last batch that does not divide
    evenly is completed with the first samples of the first batch (unless ``drop_last``).
    """

    def __init__(
        self,
        dataset: Any,
        split_batches: bool = False,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        slice_fn: Callable | None = None,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ):
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.split_batches = split_batches
        self.gradient_state = GradientState()
        self.state = PartialState()
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.skip_batches = skip_batches
        self.torch_device_mesh = torch_device_mesh
        self.slice_fn = slice_fn
        self.iteration = iteration
        # tensor parallelism alone: every rank gets the same whole batch
        self._replicate = False
        names = tuple(getattr(torch_device_mesh, "mesh_dim_names", None) or ())
        if "tp" in names:
            if "dp" in names or "fsdp" in names:
                raise ValueError("DataLoaderDispatcher does not support tensor parallelism combined with dp/fsdp yet")
            self._replicate = True

    # ---- main process only
    def _read_step(self, batches: Iterator[Any]) -> tuple[Any, bool]:
        """Next global batch (or ``None``) and whether the underlying loader is now exhausted."""
        if self.split_batches or self._replicate:
            try:
                return next(batches), False
            except StopIteration:
                return None, True
        parts = []
        exhausted = False
        for _ in range(self.state.num_processes):
            try:
                parts.append(next(batches))
            except StopIteration:
                exhausted = True
                break
        if not parts or (exhausted and self._drop_last):
            return None, True
        try:
            return _ops().concatenate(parts, dim=0), exhausted
        except RuntimeError as exc:
            raise RuntimeError(
                "DataLoaderDispatcher could not concatenate batches of different shapes; batches dispatched "
                "without split_batches must stack. Pass dispatch_batches=False so each process reads its own "
                "batches, or split_batches=True so the main process reads one batch and slices it."
            ) from exc

    def _resumed_sampler(self) -> "SkipBatchSampler | None":
        holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        if isinstance(holder, SkipBatchSampler) and holder.skip_batches > 0:
            return holder
        return None

    def _rows_at(self, indices: list) -> Any:
        """Load the samples at ``indices`` the way this loader's fetcher would (main process)."""
        if self._auto_collation:
            getitems = getattr(self.dataset, "__getitems__", None)
            items = getitems(indices) if getitems is not None else [self.dataset[i] for i in indices]
            return self.collate_fn(items)
        return self.collate_fn(self.dataset[indices])

    def __iter__(self) -> Iterator[Any]:
        ops = _ops()
        state = self.state
        num, rank = state.num_processes, state.process_index
        is_main = rank == 0
        slice_fn = self.slice_fn or ops.slice_tensors
        # a short last step is completed with the first rows of the epoch's first step (unless drop_last)
        complete_last = not self._drop_last and not self._replicate
        resumed = self._resumed_sampler() if is_main and complete_last else None
        if resumed is not None:
            resumed._keep_head = 1 if self.split_batches else num  # remember the skipped first step's indices
        self.begin()
        try:
            self.set_epoch(self.iteration)
            # every rank builds the iterator (RNG draws and DataPipe seed sharing stay in step); only
            # the main process advances it
            batches = self._plain_iter()
            upcoming, exhausted = self._read_step(batches) if is_main else (None, True)
            first_rows = None
            index = 0
            while True:
                info: list[Any] = [None, True, 0]
                if is_main and upcoming is not None:
                    # main: read one step ahead so every rank learns together that this step is the last
                    batch, upcoming = upcoming, None
                    if not exhausted:
                        self._remember_position()
                        upcoming, exhausted = self._read_step(batches)
                    if upcoming is None:
                        self._remember_position(finished=True)
                    last = upcoming is None
                    observed = ops.find_batch_size(batch)
                    if complete_last:
                        if first_rows is None and resumed is None:
                            first_rows = slice_fn(batch, slice(0, num), process_index=0, num_processes=num)
                        if last and observed % num:
                            if first_rows is None:  # resumed: the first step was skipped, load its head
                                head = [i for b in resumed.head_batches for i in b][:num]
                                first_rows = self._rows_at(head) if head else batch
                            batch = ops.concatenate([batch, first_rows], dim=0)
                    info = [ops.get_data_structure(batch), last, observed]
                ops.broadcast_object_list(info)
                structure, last, observed = info
                if structure is None:
                    break
                batch = ops.initialize_tensors(structure) if not is_main else batch
                batch = ops.send_to_device(batch, state.device, non_blocking=self._non_blocking)
                batch = ops.broadcast(batch, from_process=0)
                if self._replicate:
                    mine = batch
                else:
                    per_process = observed // num + (1 if last and complete_last and observed % num else 0)
                    mine = slice_fn(
                        batch, slice(rank * per_process, (rank + 1) * per_process), process_index=rank, num_processes=num
                    )
                if last:
                    self.end_of_dataloader = True
                    self.remainder = observed
                if index >= self.skip_batches:
                    yield mine
                index += 1
                if last:
                    break
            self._advance_epoch()
        finally:
            self.end()


    def __len__(self) -> int:
        whole = self._plain_len()
        if self.split_batches or self._replicate:
            return whole
        if self._drop_last:
            return whole // self.state.num_processes
        return math.ceil(whole / self.state.num_processes)

    @property
    def total_batch_size(self) -> int:
        """Samples per step over all processes."""
        size = self.batch_size
        if size is None:
            holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
            size = getattr(_unskipped(holder), "batch_size", None)
        if size is None:
            raise AttributeError("DataLoaderDispatcher: the wrapped loader has no batch size")
        return size if self.split_batches or self._replicate else size * self.state.num_processes

    @property
    def total_dataset_length(self) -> int:
        return len(self.dataset)


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


# ---------------------------------------------------------------------------------------------- functions
def get_sampler(dataloader: DataLoader) -> Any:
    """The index sampler of ``dataloader`` (under its batch sampler, sharded or not)."""
    if isinstance(dataloader.sampler, BatchSampler):
        return getattr(dataloader.sampler, "sampler", None)
    return getattr(dataloader.batch_sampler, "sampler", None)


def _mesh_layout(torch_device_mesh: Any, state: PartialState, num_processes: int, process_index: int) -> tuple[int, int]:
    """Data-parallel (num_processes, process_index): ranks that share tp/cp coordinates read the same data."""
    names = tuple(torch_device_mesh.mesh_dim_names or ())

    def size(name: str) -> int:
        return torch_device_mesh[name].size() if name in names else 1

    if state.distributed_type == DistributedType.DEEPSPEED:
        tp = size("tp")
        return num_processes // tp, process_index // tp
    replicated = size("tp") * size("cp")
    return size("dp_replicate") * size("dp_shard"), process_index // replicated


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[str | RNGType] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> DataLoader:
    """Wrap ``dataloader`` so this process gets its share of every batch.

    ``dispatch_batches`` (default: true for iterable datasets when ``put_on_device``) makes the main
    process read and broadcast; otherwise each process reads its own shard. ``split_batches`` keeps the
    per-step batch equal to the original batch size (each process gets a slice) instead of multiplying it
    by the number of processes. ``even_batches`` repeats samples from the start so all processes get the
    same number of batches. ``rng_types`` are synchronised from the main process at every iteration.
    """
    if dispatch_batches is None:
        dispatch_batches = put_on_device and isinstance(dataloader.dataset, IterableDataset)
    if dispatch_batches and not put_on_device:
        raise ValueError("Using `dispatch_batches=True` requires `put_on_device=True`.")
    if use_stateful_dataloader:
        _stateful_dataloader_class()  # fails here, naming torchdata, when it is missing
    state = PartialState()
    if num_processes is None:
        num_processes = state.num_processes
    if process_index is None:
        process_index = state.process_index
    if torch_device_mesh is not None:
        num_processes, process_index = _mesh_layout(torch_device_mesh, state, num_processes, process_index)

    if split_batches:
        size = dataloader.batch_size
        if size is None:
            size = getattr(dataloader.batch_sampler, "batch_size", None)
        if size is None:
            raise ValueError(
                "In order to use `split_batches==True` you must have a `batch_size` attribute either in the passed "
                "`dataloader` or `dataloader.batch_sampler` objects, and it has to return a natural number. Your "
                f"`dataloader.batch_size` is None and `dataloader.batch_sampler` ({type(dataloader.batch_sampler)}) "
                "does not have the `batch_size` attribute set."
            )
        if size > 1 and size % num_processes != 0:
            raise ValueError(
                f"To use a `DataLoader` in `split_batches` mode, the batch size ({size}) "
                f"needs to be a round multiple of the number of processes ({num_processes})."
            )

    dataset = dataloader.dataset
    is_iterable = isinstance(dataset, IterableDataset)
    new_batch_sampler = None if is_iterable else dataloader.batch_sampler
    sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
    synchronized_generator = None

    sampler = get_sampler(dataloader)
    if use_seedable_sampler and isinstance(sampler, RandomSampler):
        sampler = SeedableRandomSampler(
            data_source=sampler.data_source,
            replacement=sampler.replacement,
            num_samples=sampler._num_samples,
            generator=sampler.generator,
            data_seed=data_seed,
        )

    if (num_processes != 1 or state.distributed_type == DistributedType.MEGATRON_LM) and not dispatch_batches:
        if is_iterable and not split_batches and _hf_iterable_shards(dataset, num_processes):
            dataset = dataset.shard(num_shards=num_processes, index=process_index)
        elif is_iterable:
            if getattr(dataset, "generator", None) is not None:
                synchronized_generator = dataset.generator
            dataset = IterableDatasetShard(
                dataset,
                batch_size=dataloader.batch_size,
                drop_last=dataloader.drop_last,
                num_processes=num_processes,
                process_index=process_index,
                split_batches=split_batches,
            )
        else:
            if not use_seedable_sampler and hasattr(sampler, "generator"):
                if sampler.generator is None:
                    # a fresh seed from the global RNG; the main process's generator state is then
                    # copied to every process at each iteration (rng_types "generator")
                    sampler.generator = _default_generator()
                    sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
                synchronized_generator = sampler.generator
            new_batch_sampler = BatchSamplerShard(
                dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler,
                num_processes=num_processes,
                process_index=process_index,
                split_batches=split_batches,
                even_batches=even_batches,
            )

    if rng_types is not None:
        # a copy: the caller's list (often the Accelerator's) must not lose "generator" for later loaders
        rng_types = [r for r in rng_types if synchronized_generator is not None or r != RNGType.GENERATOR]

    kwargs = _copied_loader_kwargs(dataloader)
    if new_batch_sampler is None:
        kwargs["drop_last"] = dataloader.drop_last
        kwargs["batch_size"] = (
            dataloader.batch_size // num_processes if split_batches and not dispatch_batches else dataloader.batch_size
        )
    target = device if put_on_device and state.distributed_type != DistributedType.XLA else None
    if dispatch_batches:
        kwargs.pop("generator", None)
        if sampler_is_batch_sampler and not is_iterable:
            kwargs["sampler"] = dataloader.sampler  # a batch sampler passed as `sampler` stays one
        prepared: DataLoader = DataLoaderDispatcher(
            dataset,
            split_batches=split_batches,
            batch_sampler=new_batch_sampler,
            _drop_last=dataloader.drop_last,
            _non_blocking=non_blocking,
            slice_fn=slice_fn_for_dispatch,
            torch_device_mesh=torch_device_mesh,
            use_stateful_dataloader=use_stateful_dataloader,
            **kwargs,
        )
    elif sampler_is_batch_sampler:
        prepared = DataLoaderShard(
            dataset,
            device=target,
            sampler=new_batch_sampler,
            batch_size=dataloader.batch_size,
            rng_types=rng_types,
            synchronized_generator=synchronized_generator,
            _drop_last=dataloader.drop_last,
            _non_blocking=non_blocking,
            torch_device_mesh=torch_device_mesh,
            use_stateful_dataloader=use_stateful_dataloader,
            **kwargs,
        )
    else:
        prepared = DataLoaderShard(
            dataset,
            device=target,
            batch_sampler=new_batch_sampler,
            rng_types=rng_types,
            synchronized_generator=synchronized_generator,
            _drop_last=dataloader.drop_last,
            _non_blocking=non_blocking,
            torch_device_mesh=torch_device_mesh,
            use_stateful_dataloader=use_stateful_dataloader,
            **kwargs,
        )
    if use_seedable_sampler and isinstance(sampler, SeedableRandomSampler):
        prepared.set_sampler(sampler)
    return prepared


def _hf_iterable_shards(dataset: Any, num_processes: int) -> bool:
    """Whether ``dataset`` is a Hugging Face ``datasets.IterableDataset`` with a file shard per process."""
    if not type(dataset).__module__.startswith("datasets"):
        return False  # avoid importing `datasets` (slow) for every other dataset
    try:
        from datasets import IterableDataset as HFIterableDataset
    except ImportError:
        return False
    return isinstance(dataset, HFIterableDataset) and dataset.n_shards >= num_processes


def _owned_by(owner: Any, loader: Any) -> Any:
    loader._epoch_owner = owner._epoch_owner or owner
    return loader


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader like ``dataloader`` that starts after its first ``num_batches`` batches (resume mid-epoch).

    Works on ``DataLoaderShard``, ``DataLoaderDispatcher`` and plain ``DataLoader``; samplers are skipped
    at the index level, so skipped batches are never loaded.
    """
    dataset = dataloader.dataset
    sampler_is_batch_sampler = False
    if isinstance(dataset, IterableDataset):
        new_batch_sampler = None
    else:
        sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
        inner = dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler
        skip = num_batches
        if isinstance(dataloader, DataLoaderDispatcher) and not (dataloader.split_batches or dataloader._replicate):
            # a dispatcher step reads one batch per process: skip whole steps (Accelerate skips num_batches
            # underlying batches here, which resumes mid-step with shifted slices)
            skip = num_batches * dataloader.state.num_processes
        new_batch_sampler = SkipBatchSampler(inner, skip_batches=skip)

    kwargs = _copied_loader_kwargs(dataloader)
    if new_batch_sampler is None:
        kwargs["drop_last"] = dataloader.drop_last
        kwargs["batch_size"] = dataloader.batch_size
    elif sampler_is_batch_sampler:
        kwargs["sampler"] = new_batch_sampler
        kwargs["batch_size"] = dataloader.batch_size
    else:
        kwargs["batch_sampler"] = new_batch_sampler

    if isinstance(dataloader, DataLoaderDispatcher):
        if new_batch_sampler is None:
            kwargs["skip_batches"] = num_batches
        kwargs.pop("generator", None)
        return _owned_by(dataloader, DataLoaderDispatcher(
            dataset,
            split_batches=dataloader.split_batches,
            _drop_last=dataloader._drop_last,
            _non_blocking=dataloader._non_blocking,
            slice_fn=dataloader.slice_fn,
            torch_device_mesh=dataloader.torch_device_mesh,
            iteration=dataloader.iteration,
            use_stateful_dataloader=getattr(dataloader, "use_stateful_dataloader", False),
            **kwargs,
        ))
    if isinstance(dataloader, DataLoaderShard):
        if new_batch_sampler is None:
            kwargs["skip_batches"] = num_batches
        return _owned_by(dataloader, DataLoaderShard(
            dataset,
            device=dataloader.device,
            rng_types=dataloader.rng_types,
            synchronized_generator=dataloader.synchronized_generator,
            _drop_last=dataloader._drop_last,
            _non_blocking=dataloader._non_blocking,
            torch_device_mesh=dataloader.torch_device_mesh,
            iteration=dataloader.iteration,
            use_stateful_dataloader=getattr(dataloader, "use_stateful_dataloader", False),
            **kwargs,
        ))
    if new_batch_sampler is None:
        return SkipDataLoader(dataset, skip_batches=num_batches,
                              use_stateful_dataloader=getattr(dataloader, "use_stateful_dataloader", False), **kwargs)
    return DataLoader(dataset, **kwargs)
