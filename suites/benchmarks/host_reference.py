"""Host reference probe: how fast this machine's CPU and memory were around each benchmark.

Why: on a shared host (a cloud VM, a CI runner) the same code measures differently from one
minute to the next, because neighbours compete for the host's cores, caches and memory bandwidth
(how much: docs/benchmarks.md, "Why the benchmarks are built this way"). A benchmark cannot remove
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

A bracket is seconds away from the middle of a benchmark, and a shared host's memory bandwidth
moves on a scale of a tenth of a second. So memory-bound benchmarks run a short memory probe round (10 ms) after each of their
measured rounds (:class:`InterleavedMemoryProbe`, through ``timing.measure(after_round=...)``),
calibrated apart from the benchmark so the benchmark's own rounds are unchanged; that figure
replaces the bracket's ``memory_gbs`` (``memory_source`` says which it is). Every probe runs on
one torch thread. ``ACCEL_BENCH_HOST_PROBE=0`` turns all of it off.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable, Mapping

import torch

__all__ = ["ENABLED_ENV", "KINDS", "PAIRED_KEY", "VALUE_KEYS", "InterleavedMemoryProbe", "bracket", "enabled",
           "env_flag", "interleave_with_memory_probe", "measure_with_memory_probe", "memory_probe_call", "paired",
           "probe"]

#: the probe kinds a benchmark can declare as its ``host_bound``
KINDS = ("compute", "memory")

COMPUTE_SIDE = 256
COPY_BYTES = 64 * 2**20
#: value keys in ``extra_info["host_reference"]`` per kind (``accel_reports.analyse.benchmarks.HOST_REFERENCE_KEYS`` reads the same)
VALUE_KEYS = {"compute": "compute_gflops", "memory": "memory_gbs"}
#: ``extra_info`` key of a memory probe timed interleaved with the benchmark (see :func:`paired`)
PAIRED_KEY = "host_reference_paired"
#: ``ACCEL_BENCH_HOST_PROBE=0`` turns every host probe off (bracket and interleaved)
ENABLED_ENV = "ACCEL_BENCH_HOST_PROBE"
#: length of one interleaved memory probe round (seconds): short next to a benchmark round
INTERLEAVED_ROUND_S = 0.01


def _rounds(fn: Callable[[], Any], work_per_call: float, rounds: int, round_s: float) -> list[float]:
    """Throughputs (work per second) of ``rounds`` rounds of back-to-back calls lasting about ``round_s`` each."""
    fn()
    calls = 4 * _calls_for(fn, round_s / 4)  # calls per round, from a quarter round
    return [_timed_round(fn, calls, work_per_call) for _ in range(rounds)]


def _timed_round(fn: Callable[[], Any], calls: int, work_per_call: float) -> float:
    """Work per second of ``calls`` back-to-back calls of ``fn`` (host clock: the probes run on the CPU)."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return work_per_call * calls / (time.perf_counter() - start)


def _calls_for(fn: Callable[[], Any], round_s: float) -> int:
    """Calls of ``fn`` that fill about ``round_s`` seconds (at least one)."""
    start = time.perf_counter()
    calls = 0
    while time.perf_counter() - start < round_s:
        fn()
        calls += 1
    return max(1, calls)


def env_flag(name: str, default: str = "1", environ: Mapping[str, str] | None = None) -> bool:
    """An on/off environment variable (1/0, true/false, yes/no, on/off); any other value is a ValueError."""
    value = (os.environ if environ is None else environ).get(name, default).strip().lower()
    if value not in {"0", "1", "false", "true", "no", "yes", "off", "on", ""}:
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value not in {"0", "false", "no", "off"}


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the host probe runs (``ACCEL_BENCH_HOST_PROBE``, default on); a bad value is a ValueError."""
    return env_flag(ENABLED_ENV, environ=environ)


def memory_probe_call() -> tuple[Callable[[], Any], float]:
    """The memory probe as one call (a 64 MiB copy) and the GB it moves."""
    src = torch.ones(COPY_BYTES // 4)
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2.0 * COPY_BYTES / 1e9


class InterleavedMemoryProbe:
    """One short, self-timed memory probe round per call, run between a benchmark's rounds.

    It is calibrated on its own (the benchmark's calibration and round budget never see it) and
    always runs on one torch thread, like the bracket's probe, so its figures compare with the
    bracket's and between runs with different ``--threads``.
    """

    def __init__(self, round_s: float = INTERLEAVED_ROUND_S):
        self.copy, self.gb_per_call = memory_probe_call()
        self.samples: list[float] = []
        with _one_thread():
            self.copy()  # first touch of the buffers
            self.calls = _calls_for(self.copy, round_s)

    def __call__(self) -> None:
        with _one_thread():
            self.samples.append(_timed_round(self.copy, self.calls, self.gb_per_call))

    def record(self) -> dict[str, Any]:
        """The ``extra_info[PAIRED_KEY]`` record of the rounds so far."""
        return paired(self.samples, self.calls)


def paired(samples: list[float], calls_per_round: int) -> dict[str, Any]:
    """The ``extra_info[PAIRED_KEY]`` record of memory probe rounds (GB/s) taken between a benchmark's rounds."""
    if not samples:
        raise ValueError("no interleaved probe rounds to record")
    return {"memory_gbs": statistics.median(samples), "memory_samples": list(samples),
            "rounds": len(samples), "calls_per_round": calls_per_round}


def measure_with_memory_probe(benchmark: Any, backend: Any, call: Callable[[], Any], settings: Any) -> Any:
    """``timing.measure`` of ``call``; on the host CPU, with a memory probe round after each measured round.

    The probe's rounds go to ``benchmark.extra_info[PAIRED_KEY]`` (the suites' conftest folds them
    into ``host_reference``); the benchmark's own measurement is returned.
    """
    return interleave_with_memory_probe(benchmark, backend, {"benchmark": call}, settings)["benchmark"]


def interleave_with_memory_probe(benchmark: Any, backend: Any, fns: dict[str, Callable[[], Any]], settings: Any) -> dict[str, Any]:
    """``timing.measure`` (one variant) or ``timing.measure_interleaved`` of ``fns``, probing host memory between rounds."""
    import timing

    probe = None
    if backend.device_type == "cpu" and not settings.smoke and enabled():
        probe = InterleavedMemoryProbe()
    if len(fns) == 1:
        name, call = next(iter(fns.items()))
        results = {name: timing.measure(backend, call, settings, after_round=probe)}
    else:
        results = timing.measure_interleaved(backend, fns, settings, after_round=probe)
    if probe is not None:
        benchmark.extra_info[PAIRED_KEY] = probe.record()
    return results


class _one_thread:
    """Run a block with one torch thread (restored afterwards)."""

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        if self.threads != 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc: Any) -> None:
        if self.threads != 1:
            torch.set_num_threads(self.threads)


def probe(rounds: int = 5, round_s: float = 0.02) -> dict[str, Any]:
    """Measure the host's compute and memory reference figures now (about ``2 * rounds * round_s`` s)."""
    if rounds < 1 or round_s <= 0:
        raise ValueError(f"probe needs rounds >= 1 and round_s > 0 (got {rounds}, {round_s})")
    with _one_thread():
        a = torch.ones(COMPUTE_SIDE, COMPUTE_SIDE)
        b = torch.ones(COMPUTE_SIDE, COMPUTE_SIDE)
        out = torch.empty(COMPUTE_SIDE, COMPUTE_SIDE)
        compute = _rounds(lambda: torch.matmul(a, b, out=out), 2.0 * COMPUTE_SIDE ** 3 / 1e9, rounds, round_s)
        copy, copy_gb = memory_probe_call()
        memory = _rounds(copy, copy_gb, rounds, round_s)
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

