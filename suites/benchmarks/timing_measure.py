"""Device-synchronized measuring of the benchmark suites: calibration, warm-up and measured rounds
(part of :mod:`timing`, whose docstring says how a benchmark is timed).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from timing_settings import FULL, Settings


#: no round is ever made of more calls than this (keeps a broken, near-zero timer from looping)
MAX_ITERATIONS = 100_000


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
        report's and the console's one noise measure (:mod:`accel_reports.analyse.noise`)."""
        from accel_reports.analyse.noise import relative_iqr

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
