"""How long the benchmark suites measure: the FULL, QUICK, STANDARD and SMOKE settings and the
environment variables that choose them (part of :mod:`timing`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping


#: set to 1 (or true/yes/on) for smoke-sized benchmarks: fewer rounds, smaller problems
QUICK_ENV = "ACCEL_BENCH_QUICK"
#: ``core`` for the standard set (``accel bench --set core``): full-size problems, fewer rounds
SET_ENV = "ACCEL_BENCH_SET"


@dataclass(frozen=True)
class Settings:
    """How long and how often to measure (see :mod:`timing`)."""

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
