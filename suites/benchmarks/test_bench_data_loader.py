"""Data-loader throughput through accel's prepared loaders (samples/s over all ranks).

A ``TensorDataset`` of host tensors (256 float32 features and an int64 label per sample) in a
shuffling ``DataLoader`` with batch 64 per process and no worker processes, prepared with
``Accelerator.prepare``; one round is one whole epoch, every batch delivered on the device.

* ``shard``: each rank reads its own share (``DataLoaderShard`` over ``BatchSamplerShard``), at
  1 rank (in the pytest process) and 2 ranks (the harness's pooled process group). The same epoch
  through a plain ``DataLoader`` (with a ``DistributedSampler`` when there are several ranks) and
  ``.to(device)`` is timed in alternating rounds: ``overhead_ratio`` = median over round pairs of
  accel / plain round time (``overhead_ratio_of_medians`` and ``baseline_throughput`` kept too).
* ``dispatch``: rank 0 reads every batch and broadcasts it, each rank keeps its slice
  (``DataLoaderDispatcher``, ``dispatch_batches=True``), at 2 ranks.

A round's time is the slowest rank's; throughput = dataset samples per epoch / median round time.

On the CPU backend the sharded loader is Python- and CPU-bound: its throughput follows the host's
compute probe (``host_correlation.py``), so it declares ``host_bound="compute"``. The dispatcher
broadcasts every batch, so it is bound by collective latency and declares none (the correlations
measured: docs/benchmarks.md, "Why the benchmarks are built this way").
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import timing

FEATURES = 256
BATCH = 64
#: samples per epoch: (full, quick)
SAMPLES = (8192, 2048)


def dataset_size(settings: timing.Settings) -> int:
    return SAMPLES[1] if settings.quick or settings.smoke else SAMPLES[0]


def make_dataset(n: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, FEATURES, generator=gen), torch.randint(0, 10, (n,), generator=gen))


def epoch_runner(loader: Any, device: torch.device | None = None) -> Callable[[], int]:
    """One epoch over ``loader``; with ``device``, each batch is moved there (the plain-torch way)."""
    def run() -> int:
        seen = 0
        for x, y in loader:
            if device is not None:
                x, y = x.to(device), y.to(device)
            seen += x.shape[0]
        return seen

    return run


def loader_benchmark(backend, rank: int, world_size: int, mode: str, n: int, settings: timing.Settings,
                     distributed: bool) -> dict[str, Any]:
    """Runs in the pytest process (1 rank) or inside each rank: returns the measurements."""
    from accel import Accelerator
    from accel.utils.dataclasses import DataLoaderConfiguration

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=(mode == "dispatch")))
    device = accelerator.device
    data = make_dataset(n)
    prepared = accelerator.prepare(DataLoader(data, batch_size=BATCH, shuffle=True,
                                              generator=torch.Generator().manual_seed(1)))
    setup = reduce_max = None
    if distributed:
        import torch.distributed as dist

        setup = dist.barrier
        reduce_max = lambda values: timing.rank_max(values, device)  # noqa: E731
    fns = {"accel": epoch_runner(prepared)}
    if mode == "shard":
        sampler = None
        if world_size > 1:
            sampler = torch.utils.data.distributed.DistributedSampler(data, num_replicas=world_size, rank=rank, seed=1)
        plain = DataLoader(data, batch_size=BATCH, sampler=sampler, shuffle=sampler is None,
                           generator=torch.Generator().manual_seed(1) if sampler is None else None)
        fns["torch"] = epoch_runner(plain, device)
    seen = fns["accel"]()
    results = timing.measure_interleaved(backend, fns, settings, setup=setup, reduce_max=reduce_max)
    return {"results": results, "seen_per_rank": seen, "device": str(device), "torch_threads": torch.get_num_threads()}


def _record(benchmark, backend, settings, mode: str, nranks: int, n: int, out: dict[str, Any]) -> None:
    host_bound = timing.on_host(backend, "compute") if mode == "shard" else None
    m: timing.Measurement = out["results"]["accel"]
    extra: dict[str, Any] = {}
    base = out["results"].get("torch")
    if base is not None:
        extra = {
            "overhead_ratio": statistics.median(a / b for a, b in zip(m.samples, base.samples)),
            "overhead_ratio_of_medians": m.median / base.median,
            "baseline_throughput": n * base.iterations / base.median,
            "baseline_samples_s": base.samples,
            "comparison": "accel prepared loader vs plain DataLoader + .to(device), rounds interleaved",
        }
    info = timing.extra_info(
        backend, m, metric=f"data_loader_{mode}", unit="samples/s", work_per_round=float(n * m.iterations),
        work_unit="samples", dtype="float32", world_size=nranks, settings=settings,
        sizes={"samples_per_epoch": n, "batch_per_process": BATCH, "features": FEATURES, "num_workers": 0},
        mode=mode, torch_threads=out["torch_threads"], host_bound=host_bound, **extra,
    )
    timing.record(benchmark, m, info)


@pytest.mark.parametrize("nranks", [1, 2], ids=["ranks1", "ranks2"])
def test_data_loader_shard(benchmark, backend, accel_on_backend, bench_settings, request, nranks):
    n = dataset_size(bench_settings)
    if nranks == 1:
        out = loader_benchmark(backend, 0, 1, "shard", n, bench_settings, distributed=False)
    else:
        out = timing.run_in_ranks(request.config, backend, nranks, loader_rank, mode="shard", n=n,
                                  settings=bench_settings)[0]
    assert out["seen_per_rank"] == n // nranks
    _record(benchmark, backend, bench_settings, "shard", nranks, n, out)


@pytest.mark.parametrize("nranks", [2], ids=["ranks2"])
def test_data_loader_dispatch(benchmark, backend, bench_settings, request, nranks):
    n = dataset_size(bench_settings)
    out = timing.run_in_ranks(request.config, backend, nranks, loader_rank, mode="dispatch", n=n, settings=bench_settings)[0]
    assert out["seen_per_rank"] == n // nranks
    _record(benchmark, backend, bench_settings, "dispatch", nranks, n, out)


def loader_rank(backend, rank: int, world_size: int, mode: str, n: int, settings: timing.Settings) -> dict[str, Any]:
    return loader_benchmark(backend, rank, world_size, mode, n, settings, distributed=True)
