"""Host reference probe: how fast this machine's CPU and memory were around each benchmark.

Why: on a shared host (a cloud VM, a CI runner) the same code measures differently from one
minute to the next, because neighbours compete for the host's cores, caches and memory bandwidth.
On the 2-core development VM a fixed single-thread matmul drifted by about 3 % and a fixed 64 MiB
copy by about 30 % within a few minutes while the VM itself was idle. A benchmark cannot remove
that drift, but it can measure it: every benchmark is bracketed by this probe (before and after,
in the pytest process), and the result lands in ``extra_info["host_reference"]``. A benchmark
whose figure moved together with the probe of its kind (``extra_info["host_bound"]``) moved with
the machine, not with the software: ``accel bench --repeat`` shows the spread both raw and
relative to the probe, and ``accel report`` calls such a change "host drift", not a regression.

The probe is deliberately tiny and fixed, so its own result depends only on the host:

* ``compute``: ``a @ b`` of two 256 x 256 float32 matrices (fits in any L2), one torch thread;
  GFLOP/s = ``2 * 256**3`` per call.
* ``memory``: ``dst.copy_(src)`` of a 64 MiB float32 buffer (beyond most per-die last-level caches),
  counted read + write; GB/s.

Each is timed in ``rounds`` rounds of about ``round_s`` seconds; the figure is the median round.

A bracket is minutes away from the middle of a long benchmark, and a shared host's memory bandwidth
moves on a scale of a tenth of a second (the probe's own rounds ranged from 27 to 44 GB/s within
one run). So memory-bound benchmarks time the memory probe **interleaved** with their own rounds
(:func:`memory_probe_call` in ``timing.measure_interleaved``) and record it with :func:`paired`;
that figure then replaces the bracket's ``memory_gbs`` (``memory_source`` says which it is).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

__all__ = ["KINDS", "PAIRED_KEY", "VALUE_KEYS", "bracket", "interleave_with_memory_probe", "measure_with_memory_probe",
           "memory_probe_call", "paired", "probe"]

#: the probe kinds a benchmark can declare as its ``host_bound``
KINDS = ("compute", "memory")

COMPUTE_SIDE = 256
COPY_BYTES = 64 * 2**20
#: value keys in ``extra_info["host_reference"]`` per kind (``reports.benchmarks.HOST_REFERENCE_KEYS`` reads the same)
VALUE_KEYS = {"compute": "compute_gflops", "memory": "memory_gbs"}


def _rounds(fn: Callable[[], Any], work_per_call: float, rounds: int, round_s: float) -> list[float]:
    """Throughputs (work per second) of ``rounds`` rounds of back-to-back calls lasting about ``round_s`` each."""
    fn()
    start = time.perf_counter()
    calls = 0
    while time.perf_counter() - start < round_s / 4:  # rough calls per round from a quarter round
        fn()
        calls += 1
    per_round = max(1, int(4 * calls))
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(per_round):
            fn()
        out.append(work_per_call * per_round / (time.perf_counter() - t0))
    return out


#: ``extra_info`` key of a memory probe timed interleaved with the benchmark (see :func:`paired`)
PAIRED_KEY = "host_reference_paired"


def memory_probe_call() -> tuple[Callable[[], Any], float]:
    """The memory probe as one call (a 64 MiB copy) and the GB it moves.

    Timed interleaved with a benchmark it runs with the benchmark's torch threads (the bracket's
    probe uses one), so compare interleaved figures only between runs with the same ``--threads``.
    """
    src = torch.ones(COPY_BYTES // 4)
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2.0 * COPY_BYTES / 1e9


def paired(measurement: Any, gb_per_call: float) -> dict[str, Any]:
    """The ``extra_info[PAIRED_KEY]`` record of memory probe rounds timed interleaved with a benchmark."""
    work = gb_per_call * measurement.iterations
    samples = [work / t for t in measurement.samples]
    return {"memory_gbs": statistics.median(samples), "memory_samples": samples,
            "rounds": len(samples), "calls_per_round": measurement.iterations}


def measure_with_memory_probe(benchmark: Any, backend: Any, call: Callable[[], Any], settings: Any) -> Any:
    """``timing.measure`` of ``call``; on the host CPU, with the memory probe timed in interleaved rounds.

    The probe's rounds go to ``benchmark.extra_info[PAIRED_KEY]`` (the suites' conftest folds them
    into ``host_reference``); the benchmark's own measurement is returned.
    """
    return interleave_with_memory_probe(benchmark, backend, {"benchmark": call}, settings)["benchmark"]


def interleave_with_memory_probe(benchmark: Any, backend: Any, fns: dict[str, Callable[[], Any]], settings: Any) -> dict[str, Any]:
    """``timing.measure_interleaved`` of ``fns``, with the memory probe as one more variant on the host CPU."""
    import timing

    if backend.device_type != "cpu" or settings.smoke:
        if len(fns) == 1:
            name, call = next(iter(fns.items()))
            return {name: timing.measure(backend, call, settings)}
        return timing.measure_interleaved(backend, fns, settings)
    if "host" in fns:
        raise ValueError("'host' is the memory probe's name; give the benchmark's variants other names")
    probe_call, probe_gb = memory_probe_call()
    results = timing.measure_interleaved(backend, {**fns, "host": probe_call}, settings)
    benchmark.extra_info[PAIRED_KEY] = paired(results.pop("host"), probe_gb)
    return results


def probe(rounds: int = 5, round_s: float = 0.02) -> dict[str, Any]:
    """Measure the host's compute and memory reference figures now (about ``2 * rounds * round_s`` s)."""
    if rounds < 1 or round_s <= 0:
        raise ValueError(f"probe needs rounds >= 1 and round_s > 0 (got {rounds}, {round_s})")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.ones(COMPUTE_SIDE, COMPUTE_SIDE)
        b = torch.ones(COMPUTE_SIDE, COMPUTE_SIDE)
        out = torch.empty(COMPUTE_SIDE, COMPUTE_SIDE)
        compute = _rounds(lambda: torch.matmul(a, b, out=out), 2.0 * COMPUTE_SIDE ** 3 / 1e9, rounds, round_s)
        copy, copy_gb = memory_probe_call()
        memory = _rounds(copy, copy_gb, rounds, round_s)
    finally:
        torch.set_num_threads(threads)
    return {"compute_gflops": statistics.median(compute), "memory_gbs": statistics.median(memory),
            "compute_samples": compute, "memory_samples": memory, "time": time.time()}


def bracket(before: dict[str, Any], after: dict[str, Any], interleaved: dict[str, Any] | None = None) -> dict[str, Any]:
    """One benchmark's ``host_reference``: the probes before and after it, and the median of all their rounds.

    ``interleaved`` (a :func:`paired` record) supplies ``memory_gbs`` instead of the bracket.
    """
    record: dict[str, Any] = {"before": before, "after": after,
                              "probe": {"compute": f"{COMPUTE_SIDE}x{COMPUTE_SIDE} float32 matmul, 1 thread",
                                        "memory": f"{COPY_BYTES // 2**20} MiB float32 copy, read + write"}}
    for kind, key in VALUE_KEYS.items():
        samples = list(before[f"{kind}_samples"]) + list(after[f"{kind}_samples"])
        record[key] = statistics.median(samples)
    record["memory_source"] = "bracket"
    if interleaved is not None:
        record["memory_gbs_bracket"] = record["memory_gbs"]
        record["memory_gbs"] = interleaved["memory_gbs"]
        record["memory_samples"] = interleaved["memory_samples"]
        record["memory_source"] = "interleaved with the benchmark's rounds"
    return record

