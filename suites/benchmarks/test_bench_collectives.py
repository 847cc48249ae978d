"""All-reduce and all-gather bus bandwidth per world size (GB/s, 1 GB = 1e9 bytes).

The ranks are the harness's pooled process group for the backend (gloo over loopback on CPU,
one thread per rank). Each rank times its rounds with the backend's timer; every round starts
after a barrier, and its time is the **slowest** rank's (a collective is done when its last rank
is). The raw torch.distributed primitives are timed (``all_reduce`` in place,
``all_gather_into_tensor`` into a preallocated output), so this is the backend's collective
bandwidth; accel's own wrappers are compared with them by ``collectives_bandwidth.py``.

Bus bandwidth, as nccl-tests define it, makes figures comparable across world sizes ``n``:

* all-reduce of an ``S``-byte buffer:           ``busbw = S * 2 (n-1) / n / t``
* all-gather with an ``S``-byte gathered output: ``busbw = S * (n-1) / n / t``

``algbw = S / t`` is recorded too (``extra_info["algbw"]``).

Methodology against run-to-run noise: where the host has at least as many allowed cores as ranks,
each rank pins itself to its own core while it measures (:func:`timing.pinned_to_core`; recorded
per rank in ``extra_info["cpu_pinning"]``), so ranks neither migrate nor stack up on one core;
rounds last at least :data:`ROUND_TIME_S` (many collectives per round, so one late rank or
scheduler hiccup is a small part of a round).

No ``host_bound`` is declared: over loopback gloo a collective is bounded by the kernel's network
path and by how fast the host wakes the ranks' CPUs, which neither host probe describes (the
measurements behind this: docs/benchmarks.md, "Why the benchmarks are built this way").
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch

import timing

#: bytes per rank's input: (full, quick) for the host CPU and for accelerators
MESSAGE_BYTES = {
    "cpu": {"small": (64 * 2**10, 64 * 2**10), "large": (16 * 2**20, 4 * 2**20)},
    "device": {"small": (1 * 2**20, 1 * 2**20), "large": (256 * 2**20, 64 * 2**20)},
}


#: shortest round (seconds) on full-size runs
ROUND_TIME_S = 0.2


def message_bytes(backend, size: str, settings: timing.Settings) -> int:
    full, quick = MESSAGE_BYTES["cpu" if backend.device_type == "cpu" else "device"][size]
    return quick if settings.quick or settings.smoke else full


def _all_gather(dist):
    fused = getattr(dist, "all_gather_into_tensor", None)

    def gather(out: torch.Tensor, tensor: torch.Tensor) -> None:
        if fused is not None:
            fused(out, tensor)
        else:  # old torch: gather into views of the output
            dist.all_gather(list(out.chunk(dist.get_world_size())), tensor)

    return gather


def collective_rank(backend, rank: int, world_size: int, op: str, nbytes: int, settings: timing.Settings) -> dict:
    """Inside each rank: time ``op`` on an ``nbytes`` float32 input; every rank returns the same maxima."""
    import torch.distributed as dist

    from accel.state import PartialState

    device = PartialState().device
    numel = nbytes // 4
    tensor = torch.full((numel,), float(rank + 1), device=device)
    if op == "all_reduce":
        def call():
            dist.all_reduce(tensor)
    elif op == "all_gather":
        out = torch.empty(numel * world_size, device=device)
        gather = _all_gather(dist)

        def call():
            gather(out, tensor)
    else:
        raise ValueError(f"unknown op {op!r}")
    if not (settings.smoke or settings.quick):
        settings = replace(settings, round_time_s=max(settings.round_time_s, ROUND_TIME_S))
    pin = backend.device_type == "cpu"
    with (timing.pinned_to_core(rank, world_size) if pin else contextlib.nullcontext({"pinned": False})) as pinning:
        m = timing.measure(backend, call, settings, setup=dist.barrier,
                           reduce_max=lambda values: timing.rank_max(values, device))
    if op == "all_gather":
        expected = torch.arange(1, world_size + 1, dtype=torch.float32).repeat_interleave(numel)
        assert torch.equal(out.cpu(), expected), "all_gather gave wrong values"
    return {"measurement": m, "comm_backend": dist.get_backend(), "torch_threads": torch.get_num_threads(),
            "cpu_pinning": pinning, "round_time_s": settings.round_time_s}


@pytest.mark.parametrize("nranks", [2, 4], ids=["ranks2", "ranks4"])
@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
def test_collective(benchmark, backend, bench_settings, request, op, size, nranks):
    nbytes = message_bytes(backend, size, bench_settings)
    results = timing.run_in_ranks(request.config, backend, nranks, collective_rank,
                                  op=op, nbytes=nbytes, settings=bench_settings)
    m: timing.Measurement = results[0]["measurement"]
    if op == "all_reduce":
        message = nbytes
        bus = timing.all_reduce_busbw_bytes(message, nranks)
        formula = "S * 2 (n-1) / n / t, S = buffer bytes"
    else:
        message = nbytes * nranks
        bus = timing.all_gather_busbw_bytes(message, nranks)
        formula = "S * (n-1) / n / t, S = gathered output bytes"
    info = timing.extra_info(
        backend, m, metric=f"{op}_busbw", unit="GB/s", work_per_round=bus * m.iterations / timing.GB,
        work_unit="GB", dtype="float32", world_size=nranks, settings=bench_settings,
        sizes={"bytes_per_rank": nbytes, "message_bytes": message, "elements_per_rank": nbytes // 4},
        algbw=message * m.iterations / m.median / timing.GB, busbw_formula=formula,
        comm_backend=results[0]["comm_backend"], round_time="slowest rank, after a barrier",
        torch_threads=results[0]["torch_threads"], round_time_s=results[0]["round_time_s"],
        cpu_pinning=[r["cpu_pinning"] for r in results],
    )
    timing.record(benchmark, m, info)
