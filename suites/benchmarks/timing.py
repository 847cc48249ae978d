"""Timing for accel's benchmark suites: synchronized device timing, raw samples, pytest-benchmark records.

How a benchmark is timed
------------------------
:func:`measure` runs a callable on a backend in four phases:

1. one untimed call (first-touch allocation, kernel selection, lazy initialisation);
2. calibration: batches of 1, 2, 4, ... back-to-back calls, timed, until one batch lasts a quarter
   of ``Settings.round_time_s``; that gives the time per call and so ``iterations``, the number of
   calls in one round of about ``round_time_s`` (short operations are then not drowned in timer
   resolution or launch jitter). The calibration calls are never samples;
3. ``Settings.warmup_rounds`` timed rounds that are **kept apart** (``Measurement.warmup_samples``)
   and never reach the statistics;
4. the measured rounds: as many as fit in ``Settings.budget_s``, clamped to
   ``[min_rounds, max_rounds]``. Each sample is the duration of one round (``iterations`` calls).

Every round is timed with ``backend.timer()`` (:class:`accel.backends.Timer`): device events where
the backend supports them (``backend.use_host_timers`` is False), otherwise a host clock read only
after ``backend.synchronize()``, both before the round starts and before it ends. So queued
asynchronous work is never half counted: with host timers, work queued before the round is
finished before the start clock is read and the round's own work is finished before the end clock
is read; with events, the start event sits behind earlier work on the stream and the end event is
synchronized before ``elapsed_time`` is read. An optional ``setup`` runs before each round outside
the timed region.

How samples reach pytest-benchmark
----------------------------------
:func:`record` hands the measured samples to pytest-benchmark through ``benchmark.pedantic`` with
pytest-benchmark's *timer* option set to :data:`DEVICE_CLOCK` (the suites' ``conftest.py`` puts
``@pytest.mark.benchmark(timer=DEVICE_CLOCK)`` on every benchmark test). That clock is a virtual
clock: during :func:`record` it only advances by the device-synchronized duration of each round, so
every round pytest-benchmark sees is exactly one sample measured by :func:`measure`, no more and no
less: ``stats.data`` in the JSON are the raw per-round seconds (pytest-benchmark always writes
``stats.data`` into ``--benchmark-json``; ``--benchmark-save-data`` does the same for
``--benchmark-save``, and ``accel bench`` passes both). Warm-up rounds are not replayed.

Multi-process benchmarks cannot use the ``benchmark`` fixture inside the ranks (it does not pickle).
They run their rank function in the harness's pooled process group with :func:`run_in_ranks`; each
rank times its rounds itself with :func:`measure` (``reduce_max`` makes the ranks agree on the
calibration and turns each round into the *slowest* rank's time, because a collective ends when its
last rank does) and writes its samples to a file; the pytest process then records them with
:func:`record`, exactly like a single-process measurement.

``extra_info`` schema (what the report generator reads)
--------------------------------------------------------
Written by :func:`extra_info` into every benchmark entry:

====================  ========================================================================
``backend``           backend name (``cpu``, ``cuda``, ...)
``device``            device model (``backend.device_properties(0).name``)
``dtype``             ``"float32"``, ``"bfloat16"``, ... (``None`` where meaningless)
``metric``            what is measured: ``matmul``, ``device_copy``, ``h2d_pageable``,
                      ``all_reduce_busbw``, ``train_step_mlp``, ``data_loader_shard``, ...
``unit``              unit of ``throughput``: ``TFLOP/s``, ``GB/s``, ``MB/s``, ``steps/s``,
                      ``samples/s``
``throughput``        ``work_per_round / median(stats.data)``: derived from the MEDIAN round
``higher_is_better``  ``True`` (all of these are throughputs)
``world_size``        ranks taking part (1 for single-process benchmarks)
``work_per_round``    work done by one round, in ``work_unit``
``work_unit``         the numerator of ``unit`` (``TFLOP``, ``GB``, ``MB``, ``steps``,
                      ``samples``), so ``throughput == work_per_round / median``
``work_size``         same value as ``work_per_round`` (the name ``accel_reports.benchmarks`` reads)
``sizes``             dict of problem sizes (matrix side, bytes, batch, ...)
``iterations``        calls per round; ``rounds`` / ``warmup_rounds`` as measured
``median_s``          median round time in seconds (equal to ``stats.median``)
``timing``            ``"device events"`` or ``"host timers"``
``quick``             True for ``--quick`` / ``ACCEL_BENCH_QUICK=1`` runs (smaller sizes)
``torch_threads``     torch threads of the process that ran the work (per rank for multi-rank ones)
``loadavg_1m``        the host's 1-minute load average when the benchmark finished: other work on
                      the machine shows up as noise, this says how much there was
``host_bound``        ``"compute"`` or ``"memory"`` when the work runs on the host CPU and that
                      resource limits it (``None`` otherwise: device work, disk, latency-bound)
``host_reference``    the host probe before and after the benchmark (added by the suites'
                      ``conftest.py``; see ``host_reference.py``)
``torch_version``, ``accel_version``
====================  ========================================================================

Benchmarks add their own keys (e.g. ``overhead_ratio`` and ``baseline_throughput`` for accel vs a
hand-written loop, ``algbw`` for collectives).
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

__all__ = [
    "DEVICE_CLOCK",
    "FULL",
    "QUICK",
    "QUICK_ENV",
    "SET_ENV",
    "STANDARD",
    "SMOKE",
    "DeviceClock",
    "Measurement",
    "Settings",
    "all_gather_busbw_bytes",
    "all_reduce_busbw_bytes",
    "device_model",
    "extra_info",
    "measure",
    "measure_interleaved",
    "on_host",
    "pinned_to_core",
    "quick_requested",
    "core_set_requested",
    "rank_max",
    "record",
    "run_in_ranks",
    "settings_for",
]

#: set to 1 (or true/yes/on) for smoke-sized benchmarks: fewer rounds, smaller problems
QUICK_ENV = "ACCEL_BENCH_QUICK"
#: ``core`` for the standard set (``accel bench --set core``): full-size problems, fewer rounds
SET_ENV = "ACCEL_BENCH_SET"
#: no round is ever made of more calls than this (keeps a broken, near-zero timer from looping)
MAX_ITERATIONS = 100_000

TFLOP = 1e12
GB = 1e9
MB = 1e6


# ---------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Settings:
    """How long and how often to measure (see the module docstring)."""

    warmup_rounds: int
    min_rounds: int
    max_rounds: int
    round_time_s: float  # target duration of one round; sets ``iterations``
    budget_s: float  # measured time per benchmark, spent on as many rounds as fit
    quick: bool = False
    smoke: bool = False  # pytest-benchmark is disabled: run once to see that it works, time nothing

    def rounds_for(self, round_s: float) -> int:
        if round_s <= 0:
            return self.max_rounds
        fit = int(self.budget_s / round_s)
        return max(self.min_rounds, min(self.max_rounds, fit))


FULL = Settings(warmup_rounds=3, min_rounds=10, max_rounds=50, round_time_s=0.05, budget_s=4.0)
QUICK = Settings(warmup_rounds=1, min_rounds=5, max_rounds=10, round_time_s=0.01, budget_s=0.3, quick=True)
#: the standard set's rounds: the full run's problem and round sizes (so the medians compare), half its rounds
STANDARD = Settings(warmup_rounds=3, min_rounds=10, max_rounds=25, round_time_s=0.05, budget_s=2.0)
SMOKE = Settings(warmup_rounds=0, min_rounds=1, max_rounds=1, round_time_s=0.0, budget_s=0.0, smoke=True)


def quick_requested(environ: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get(QUICK_ENV, "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


def core_set_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the run is of the standard set (``ACCEL_BENCH_SET=core``)."""
    return (os.environ if environ is None else environ).get(SET_ENV, "").strip().lower() == "core"


def settings_for(benchmark: Any = None, environ: Mapping[str, str] | None = None) -> Settings:
    """:data:`SMOKE` when pytest-benchmark is disabled, :data:`QUICK` with ``ACCEL_BENCH_QUICK=1``,
    :data:`STANDARD` with ``ACCEL_BENCH_SET=core``, else :data:`FULL`."""
    if benchmark is not None and getattr(benchmark, "disabled", False):
        return replace(SMOKE, quick=quick_requested(environ))
    if quick_requested(environ):
        return QUICK
    return STANDARD if core_set_requested(environ) else FULL


# ---------------------------------------------------------------------------- measuring
@dataclass
class Measurement:
    """Raw round times (seconds) of one benchmark; warm-up rounds kept apart."""

    samples: list[float]
    iterations: int = 1
    warmup_samples: list[float] = field(default_factory=list)
    calibration_s: float | None = None  # seconds per call estimated by the calibration
    timing: str = "host timers"

    @property
    def rounds(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def throughput(self, work_per_round: float) -> float:
        return work_per_round / self.median

    def relative_iqr(self) -> float:
        """Interquartile range of the round times over their median (0 with fewer than 4 rounds): the
        report's and the console's one noise measure (:mod:`accel_reports.noise`)."""
        from accel_reports.noise import relative_iqr

        return relative_iqr(self.samples) or 0.0


def _timing_kind(backend: Any) -> str:
    return "host timers" if backend.use_host_timers else "device events"


def _timed(backend: Any, fn: Callable[[], Any], iterations: int) -> float:
    with backend.timer() as timer:
        for _ in range(iterations):
            fn()
    if timer.elapsed is None:
        raise RuntimeError(f"{backend.name}: the timer reported no elapsed time")
    return float(timer.elapsed)


def _calibrate(backend: Any, fn: Callable[[], Any], round_time_s: float,
               agree: Callable[[list[float]], list[float]] | None = None,
               setup: Callable[[], Any] | None = None) -> float:
    """Seconds per call, from back-to-back batches of 1, 2, 4, ... calls until one lasts a quarter round.

    The figure is the per-call time of that last, longest batch: short batches are dominated by
    whichever scheduler state they happen to hit (on a VM a latency-bound call varies tenfold from
    one moment to the next), and taking the fastest of them made rounds several times longer than
    ``round_time_s`` and their length differ from run to run.
    ``agree`` makes every rank use the same (slowest) figure, so all ranks take the same decisions.
    """
    agree = agree or (lambda values: values)
    calls = 1
    while True:
        if setup is not None:
            setup()
        elapsed = agree([_timed(backend, fn, calls)])[0]
        if elapsed >= round_time_s / 4 or calls >= MAX_ITERATIONS:
            return elapsed / calls
        calls *= 2


def _iterations_for(round_time_s: float, per_call: float) -> int:
    wanted = round_time_s / per_call if per_call > 0 else MAX_ITERATIONS
    return max(1, min(MAX_ITERATIONS, math.ceil(wanted)))


def measure(
    backend: Any,
    fn: Callable[[], Any],
    settings: Settings | None = None,
    *,
    iterations: int | None = None,
    rounds: int | None = None,
    warmup_rounds: int | None = None,
    setup: Callable[[], Any] | None = None,
    reduce_max: Callable[[list[float]], list[float]] | None = None,
    after_round: Callable[[], Any] | None = None,
) -> Measurement:
    """Time ``fn`` on ``backend``: warm-up, calibration, then rounds of ``iterations`` calls.

    ``iterations``/``rounds``/``warmup_rounds`` override what ``settings`` would choose.
    ``setup`` runs before every timed round (warm-up included), outside the timed region.
    ``after_round`` runs after every measured round, outside the timed region and apart from the
    calibration (the host probe uses it to sample the machine between a benchmark's rounds).
    ``reduce_max`` (multi-process) maps a list of per-rank values to their maximum over ranks; it
    is called identically on every rank: for the calibration time and for the final samples.
    """
    settings = settings or FULL
    agree = reduce_max or (lambda values: values)
    if settings.smoke:
        iterations, rounds, warmup_rounds = 1, 1, 0
    fn()  # first touch: allocation, kernel choice, lazy init; never timed
    per_call = None
    if iterations is None or rounds is None:
        per_call = _calibrate(backend, fn, settings.round_time_s, agree, setup)
    if iterations is None:
        iterations = _iterations_for(settings.round_time_s, per_call)
    if rounds is None:
        rounds = settings.rounds_for(per_call * iterations)
    if warmup_rounds is None:
        warmup_rounds = settings.warmup_rounds
    if iterations < 1 or rounds < 1 or warmup_rounds < 0:
        raise ValueError(f"need iterations >= 1, rounds >= 1, warmup_rounds >= 0 (got {iterations}, {rounds}, {warmup_rounds})")

    def one_round() -> float:
        if setup is not None:
            setup()
        return _timed(backend, fn, iterations)

    warmup = [one_round() for _ in range(warmup_rounds)]
    samples = []
    for _ in range(rounds):
        samples.append(one_round())
        if after_round is not None:
            after_round()
    if reduce_max is not None:
        samples = reduce_max(samples)
        warmup = reduce_max(warmup) if warmup else warmup
    return Measurement(samples=samples, iterations=iterations, warmup_samples=warmup,
                       calibration_s=per_call, timing=_timing_kind(backend))


def measure_interleaved(
    backend: Any,
    fns: Mapping[str, Callable[[], Any]],
    settings: Settings | None = None,
    *,
    iterations: int | None = None,
    rounds: int | None = None,
    warmup_rounds: int | None = None,
    setup: Callable[[], Any] | None = None,
    reduce_max: Callable[[list[float]], list[float]] | None = None,
    after_round: Callable[[], Any] | None = None,
) -> dict[str, Measurement]:
    """Time several variants of the same work round by round, in rotating order.

    Drift on the machine (another process, thermal state) then hits every variant alike, which is
    what makes a ratio between them trustworthy. All variants get the same ``iterations``
    (calibrated on the slowest) and the same number of rounds. ``setup``, ``reduce_max`` and
    ``after_round`` (once per measured round of all variants) as in :func:`measure`.
    """
    settings = settings or FULL
    agree = reduce_max or (lambda values: values)
    names = list(fns)
    if not names:
        raise ValueError("measure_interleaved needs at least one callable")
    if settings.smoke:
        iterations, rounds, warmup_rounds = 1, 1, 0
    for name in names:
        fns[name]()
    per_call = None
    if iterations is None or rounds is None:
        per_call = max(_calibrate(backend, fns[name], settings.round_time_s, agree, setup) for name in names)
    if iterations is None:
        iterations = _iterations_for(settings.round_time_s, per_call)
    if rounds is None:
        rounds = settings.rounds_for(per_call * iterations * len(names))
    if warmup_rounds is None:
        warmup_rounds = settings.warmup_rounds
    if iterations < 1 or rounds < 1 or warmup_rounds < 0:
        raise ValueError(f"need iterations >= 1, rounds >= 1, warmup_rounds >= 0 (got {iterations}, {rounds}, {warmup_rounds})")
    results = {name: Measurement([], iterations, [], per_call, _timing_kind(backend)) for name in names}
    for r in range(warmup_rounds + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if setup is not None:
                setup()
            elapsed = _timed(backend, fns[name], iterations)
            (results[name].warmup_samples if r < warmup_rounds else results[name].samples).append(elapsed)
        if after_round is not None and r >= warmup_rounds:
            after_round()
    if reduce_max is not None:
        for result in results.values():
            result.samples = reduce_max(result.samples)
            if result.warmup_samples:
                result.warmup_samples = reduce_max(result.warmup_samples)
    return results


# ---------------------------------------------------------------------------- CPU pinning
def _allowed_cores() -> list[int] | None:
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None:
        return None
    try:
        return sorted(getter(0))
    except OSError:
        return None


@contextlib.contextmanager
def pinned_to_core(slot: int = 0, slots: int = 1) -> Iterator[dict[str, Any]]:
    """Pin this process to one core of its allowed set while measuring; restore the mask afterwards.

    ``slot`` of ``slots`` (a rank of a world size, or 0 of 1 for a single process) gets core
    ``allowed[slot]``, counted from the *last* allowed core down, so slot 0 of a single process
    keeps off core 0 (where the kernel tends to take interrupts) when it can. With fewer allowed
    cores than ``slots`` nothing is pinned: ranks would share cores anyway and a pin would only
    serialise them. Yields what went into ``extra_info["cpu_pinning"]``.
    """
    allowed = _allowed_cores()
    if allowed is None:
        yield {"pinned": False, "reason": "os.sched_setaffinity unavailable"}
        return
    if len(allowed) < slots:
        yield {"pinned": False, "reason": f"{len(allowed)} allowed cores < {slots} processes",
               "allowed_cores": allowed}
        return
    core = allowed[len(allowed) - 1 - slot] if slots == 1 else allowed[slot]
    try:
        os.sched_setaffinity(0, {core})
    except OSError as exc:
        yield {"pinned": False, "reason": f"sched_setaffinity failed: {exc}", "allowed_cores": allowed}
        return
    try:
        yield {"pinned": True, "core": core, "allowed_cores": allowed, "processes": slots}
    finally:
        try:
            os.sched_setaffinity(0, set(allowed))
        except OSError:
            pass


# ---------------------------------------------------------------------------- pytest-benchmark
class DeviceClock:
    """The timer pytest-benchmark reads while :func:`record` replays measured rounds.

    Outside :meth:`replaying` it is ``time.perf_counter`` (so a plain ``benchmark(fn)`` in a test
    that carries it still works); inside, it is a virtual clock that moves only by :meth:`advance`.
    """

    __name__ = "accel_device_timer"  # what pytest-benchmark writes as options.timer

    def __init__(self) -> None:
        self._now = 0.0
        self._replaying = False

    def __call__(self) -> float:
        return self._now if self._replaying else time.perf_counter()

    def advance(self, seconds: float) -> None:
        if not self._replaying:
            raise RuntimeError("DeviceClock.advance() outside replaying()")
        self._now += float(seconds)

    @contextlib.contextmanager
    def replaying(self) -> Iterator["DeviceClock"]:
        if self._replaying:
            raise RuntimeError("DeviceClock is already replaying (one benchmark at a time per process)")
        self._replaying, self._now = True, 0.0
        try:
            yield self
        finally:
            self._replaying = False

    def __repr__(self) -> str:
        return "<accel DeviceClock: device-synchronized round times>"


#: the one clock the suites' conftest gives pytest-benchmark as its timer
DEVICE_CLOCK = DeviceClock()


def record(benchmark: Any, measurement: Measurement, info: Mapping[str, Any], clock: DeviceClock = DEVICE_CLOCK) -> None:
    """Put ``measurement`` (and ``info`` into ``extra_info``) into pytest-benchmark's results.

    With benchmarks disabled (``--benchmark-disable``) only ``extra_info`` is set and nothing is timed.
    """
    benchmark.extra_info.update(info)
    # the one noise measure, computed once here; console, gate and report read this value
    benchmark.extra_info["spread"] = measurement.relative_iqr() if len(measurement.samples) >= 4 else None
    if getattr(benchmark, "disabled", False):
        benchmark.pedantic(lambda: None, rounds=1)  # marks the fixture as used; disabled: runs once, records nothing
        return
    timer = getattr(benchmark, "_timer", clock)  # defensive check only; the marker is what sets it
    if timer is not clock:
        raise RuntimeError(
            "this benchmark's pytest-benchmark timer is not the accel device clock: run the benchmark "
            "suites with their conftest (suites/benchmarks/conftest.py), which sets "
            "@pytest.mark.benchmark(timer=timing.DEVICE_CLOCK)")
    samples = list(measurement.samples)
    if not samples:
        raise ValueError("no samples to record")
    pending = iter(samples)

    def replay_round() -> None:
        clock.advance(next(pending))

    with clock.replaying():
        benchmark.pedantic(replay_round, rounds=len(samples), warmup_rounds=0, iterations=1)


# ---------------------------------------------------------------------------- extra_info
def on_host(backend: Any, kind: str) -> str | None:
    """``kind`` when ``backend`` computes on the host CPU (so the host probe applies), else None."""
    return kind if backend.device_type == "cpu" else None


def device_model(backend: Any) -> str:
    try:
        return str(backend.device_properties(0).name)
    except Exception as exc:  # a description must not fail the benchmark
        return f"unknown ({type(exc).__name__})"


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on every platform
        return None


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _versions() -> dict[str, str]:
    import torch

    try:
        import accel

        accel_version = accel.__version__
    except Exception:
        accel_version = "unknown"
    return {"torch_version": torch.__version__, "accel_version": accel_version}


def extra_info(
    backend: Any,
    measurement: Measurement,
    *,
    metric: str,
    unit: str,
    work_per_round: float,
    work_unit: str,
    dtype: str | None = None,
    world_size: int = 1,
    sizes: Mapping[str, Any] | None = None,
    settings: Settings | None = None,
    host_bound: str | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The ``extra_info`` record of one benchmark (schema in the module docstring)."""
    if not unit.startswith(work_unit + "/"):
        raise ValueError(f"work_unit {work_unit!r} must be the numerator of unit {unit!r}")
    if host_bound not in (None, "compute", "memory"):
        raise ValueError(f"host_bound must be 'compute', 'memory' or None, got {host_bound!r}")
    median = measurement.median
    info: dict[str, Any] = {
        "backend": backend.name,
        "device": device_model(backend),
        "dtype": dtype,
        "metric": metric,
        "unit": unit,
        "throughput": work_per_round / median,
        "higher_is_better": True,
        "world_size": world_size,
        "work_per_round": float(work_per_round),
        "work_unit": work_unit,
        "work_size": float(work_per_round),
        "sizes": dict(sizes or {}),
        "iterations": measurement.iterations,
        "rounds": measurement.rounds,
        "warmup_rounds": len(measurement.warmup_samples),
        "median_s": median,
        "timing": measurement.timing,
        "quick": bool(settings.quick) if settings is not None else quick_requested(),
        "torch_threads": _threads(),
        "loadavg_1m": _loadavg(),
        "host_bound": host_bound,
        **_versions(),
    }
    info.update(more)
    return info


# ---------------------------------------------------------------------------- bus bandwidth
def all_reduce_busbw_bytes(message_bytes: int, world_size: int) -> float:
    """Bytes one all-reduce of a ``message_bytes`` buffer moves per rank: ``S * 2 (n-1) / n``.

    The nccl-tests convention: a ring all-reduce sends and receives ``2 (n-1)/n`` of the buffer per
    rank, so the bus bandwidth is comparable with the link's bandwidth whatever the world size.
    """
    return message_bytes * 2.0 * (world_size - 1) / world_size


def all_gather_busbw_bytes(output_bytes: int, world_size: int) -> float:
    """Bytes one all-gather moves per rank: ``S * (n-1) / n`` with ``S`` the gathered output size."""
    return output_bytes * (world_size - 1) / world_size


# ---------------------------------------------------------------------------- ranks
def rank_max(values: Sequence[float], device: Any = None) -> list[float]:
    """Element-wise maximum of ``values`` over all ranks of the default process group."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [float(v) for v in tensor.cpu().tolist()]


def run_in_ranks(config: Any, backend: Any, world_size: int, fn: Callable[..., Any], **kwargs: Any) -> list[Any]:
    """Run ``fn`` in ``world_size`` ranks of the harness's pooled process group; return each rank's result.

    ``fn`` is a module-level function taking ``backend``, ``rank``, ``world_size`` and ``out`` (the
    ranks' own values are filled in) plus ``kwargs`` (picklable). What it returns is pickled to
    ``out`` by the rank and read back here. Skips (with the harness's reason codes) when the
    backend cannot run ``world_size`` processes.
    """
    import inspect
    import pickle
    import tempfile

    import pytest

    from accel_harness import markers
    from accel_harness.distributed import Task
    from accel_harness.plugin import _context, _visible_devices_env

    reason = markers.evaluate([], backend, world_size=world_size)
    if reason is not None:
        pytest.skip(markers.format_skip(reason))
    ctx = _context(config)
    with tempfile.TemporaryDirectory(prefix="accel-bench-ranks-") as out:
        payload = pickle.dumps({"backend": None, "rank": None, "world_size": None,
                                "out": out, "_target": (fn.__module__, fn.__qualname__, inspect.getfile(fn)), **kwargs})
        task = Task(__name__, inspect.getfile(run_in_ranks), _rank_entry.__qualname__, payload)
        pool = ctx.pool_manager().get(backend.name, world_size, backend.start_method,
                                      env=_visible_devices_env(backend, world_size))
        result = pool.run(task)
        if result.status == "skipped":
            pytest.skip(result.message)
        if result.status != "passed":
            detail = ""
            if result.status == "failed":
                failing = next((o for o in result.outcomes if o.rank == result.rank), None)
                detail = "\n\n" + (failing.traceback if failing else "")
            elif result.stacks:
                detail = "\n" + "\n".join(f"--- rank {r} ---\n{text}" for r, text in sorted(result.stacks.items()))
            pytest.fail(f"{result.status} in {world_size} {backend.name} ranks: {result.message}{detail}", pytrace=False)
        values = []
        for rank in range(world_size):
            with open(os.path.join(out, f"rank{rank}.pkl"), "rb") as fh:
                values.append(pickle.load(fh))
        return values


def _rank_entry(backend: Any, rank: int, world_size: int, out: str, _target: tuple[str, str, str], **kwargs: Any) -> None:
    """Runs inside each rank: resolve the benchmark's rank function, call it, pickle its result."""
    import importlib
    import importlib.util
    import pickle
    import sys

    module_name, qualname, path = _target
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part)
    value = target(backend=backend, rank=rank, world_size=world_size, **kwargs)
    tmp = os.path.join(out, f".rank{rank}.pkl.tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(value, fh)
    os.replace(tmp, os.path.join(out, f"rank{rank}.pkl"))
