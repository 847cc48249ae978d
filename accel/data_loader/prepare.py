"""``prepare_data_loader`` and ``skip_first_batches``: build the loader that fits the run from a user's ``DataLoader``."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from ..state import PartialState
from ..utils.dataclasses import DistributedType, RNGType
from .adapter import _stateful_dataloader_class
from .dispatch import DataLoaderDispatcher
from .layout import data_parallel_layout, tensor_parallel_layout
from .samplers import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    _default_generator,
    get_sampler,
)
from .shard import DataLoaderShard, SkipDataLoader

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
    state = PartialState()
    if num_processes is None:
        num_processes = state.num_processes
    if process_index is None:
        process_index = state.process_index
    if torch_device_mesh is not None:
        # called directly, Accelerate's rule for the process state's type; the Accelerator asks its strategy
        rule = tensor_parallel_layout if state.distributed_type == DistributedType.DEEPSPEED else data_parallel_layout
        num_processes, process_index = rule(torch_device_mesh, num_processes, process_index)
    return shard_data_loader(
        dataloader, device, num_processes, process_index, split_batches=split_batches, put_on_device=put_on_device,
        rng_types=rng_types, dispatch_batches=dispatch_batches, even_batches=even_batches,
        slice_fn_for_dispatch=slice_fn_for_dispatch, use_seedable_sampler=use_seedable_sampler, data_seed=data_seed,
        non_blocking=non_blocking, use_stateful_dataloader=use_stateful_dataloader, torch_device_mesh=torch_device_mesh,
    )


def shard_data_loader(
    dataloader: DataLoader,
    device: torch.device | None,
    num_processes: int,
    process_index: int,
    *,
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
    """``prepare_data_loader`` for a layout already decided: ``num_processes`` shards, this rank reading shard
    ``process_index`` (the mesh, if any, only goes on to the wrappers)."""
    if dispatch_batches is None:
        dispatch_batches = put_on_device and isinstance(dataloader.dataset, IterableDataset)
    if dispatch_batches and not put_on_device:
        raise ValueError("Using `dispatch_batches=True` requires `put_on_device=True`.")
    if use_stateful_dataloader:
        _stateful_dataloader_class()  # fails here, naming torchdata, when it is missing
    state = PartialState()

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
    # what both wrappers take
    common = {"_drop_last": dataloader.drop_last, "_non_blocking": non_blocking, "torch_device_mesh": torch_device_mesh,
              "use_stateful_dataloader": use_stateful_dataloader}
    if dispatch_batches:
        kwargs.pop("generator", None)
        if sampler_is_batch_sampler and not is_iterable:
            kwargs["sampler"] = dataloader.sampler  # a batch sampler passed as `sampler` stays one
        prepared: DataLoader = DataLoaderDispatcher(dataset, split_batches=split_batches, batch_sampler=new_batch_sampler,
                                                    slice_fn=slice_fn_for_dispatch, **common, **kwargs)
    else:
        # a batch sampler passed as `sampler` stays one
        batches = ({"sampler": new_batch_sampler, "batch_size": dataloader.batch_size} if sampler_is_batch_sampler
                   else {"batch_sampler": new_batch_sampler})
        target = device if put_on_device and state.distributed_type != DistributedType.XLA else None
        prepared = DataLoaderShard(dataset, device=target, rng_types=rng_types, synchronized_generator=synchronized_generator,
                                   **batches, **common, **kwargs)
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


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader like ``dataloader`` that starts after its first ``num_batches`` batches (resume mid-epoch).

    Works on ``DataLoaderShard``, ``DataLoaderDispatcher`` and plain ``DataLoader``; samplers are skipped
    at the index level, so skipped batches are never loaded. The copy of an accel loader counts the
    epochs it finishes in the original too (``epoch_owner``), so the original's next epoch reshuffles.
    """
    dataset = dataloader.dataset
    sampler_is_batch_sampler = False
    if isinstance(dataset, IterableDataset):
        new_batch_sampler = None
    else:
        sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
        inner = dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler
        # a dispatcher step reads batches_per_step batches: skip whole steps (Accelerate skips num_batches
        # underlying batches here, which resumes mid-step with shifted slices)
        per_step = dataloader.batches_per_step if isinstance(dataloader, DataLoaderDispatcher) else 1
        new_batch_sampler = SkipBatchSampler(inner, skip_batches=num_batches * per_step)

    kwargs = _copied_loader_kwargs(dataloader)
    if new_batch_sampler is None:
        kwargs["drop_last"] = dataloader.drop_last
        kwargs["batch_size"] = dataloader.batch_size
    elif sampler_is_batch_sampler:
        kwargs["sampler"] = new_batch_sampler
        kwargs["batch_size"] = dataloader.batch_size
    else:
        kwargs["batch_sampler"] = new_batch_sampler

    if isinstance(dataloader, (DataLoaderDispatcher, DataLoaderShard)):
        dispatching = isinstance(dataloader, DataLoaderDispatcher)
        if new_batch_sampler is None:
            kwargs["skip_batches"] = num_batches
        if dispatching:
            kwargs.pop("generator", None)
        loader_class = DataLoaderDispatcher if dispatching else DataLoaderShard
        resumed = loader_class(dataset, **dataloader.wrapper_kwargs(), **kwargs)
        resumed.epoch_owner = dataloader.epoch_owner or dataloader
        return resumed
    if new_batch_sampler is None:
        return SkipDataLoader(dataset, skip_batches=num_batches,
                              use_stateful_dataloader=getattr(dataloader, "use_stateful_dataloader", False), **kwargs)
    return DataLoader(dataset, **kwargs)
