"""Handing measured rounds to pytest-benchmark: the virtual device clock it reads as its timer and
:func:`record`, which replays the samples through it (part of :mod:`timing`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Mapping

from timing_measure import Measurement


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
