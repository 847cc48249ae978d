"""Data loaders that shard or dispatch batches across processes, with Accelerate's names and semantics.

Sharding (``DataLoaderShard``): every process reads its own share of the indices or of the stream.
Dispatching (``DataLoaderDispatcher``): the main process reads and broadcasts, every process keeps its
slice. Both look one batch ahead so ``end_of_dataloader`` is already true during the last batch.
"""

from __future__ import annotations

from .adapter import DataLoaderAdapter
from .dispatch import DataLoaderDispatcher
from .prepare import prepare_data_loader, skip_first_batches
from .progress import DataLoaderStateMixin
from .samplers import BatchSamplerShard, IterableDatasetShard, SeedableRandomSampler, SkipBatchSampler, get_sampler
from .shard import DataLoaderShard, SkipDataLoader

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
