"""The one noise measure of a benchmark: how widely its rounds spread, and when that is too wide to judge.

Computed once where a benchmark is measured (stored as ``extra_info["spread"]``) and read by the
console (``accel bench``), the gate and the report, so the three never give different figures for
the same run. Pure Python, so the benchmark suites and the CLI can use it without pandas.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

__all__ = ["NOISY_SPREAD", "is_too_noisy", "relative_iqr", "spread_of"]

#: a benchmark whose rounds spread more than this (IQR over median) is too noisy to judge on its own
NOISY_SPREAD = 0.25


def relative_iqr(samples: Sequence[Any]) -> float | None:
    """Interquartile range of ``samples`` over their median (linear quartiles); None with fewer than 4
    finite numbers or a zero median."""
    values = [float(v) for v in samples
              if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if len(values) < 4:
        return None
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / abs(median) if median else None


def spread_of(record: dict[str, Any]) -> float | None:
    """The spread of one pytest-benchmark record: the stored ``extra_info["spread"]``, else computed
    the same way from its rounds (``stats.data``)."""
    stored = (record.get("extra_info") or {}).get("spread")
    if isinstance(stored, (int, float)) and not isinstance(stored, bool) and math.isfinite(stored):
        return float(stored)
    data = (record.get("stats") or {}).get("data")
    return relative_iqr(data) if isinstance(data, (list, tuple)) else None


def is_too_noisy(spread: float | None) -> bool:
    """Whether a spread is past :data:`NOISY_SPREAD` (None, unknown, is not)."""
    return spread is not None and spread > NOISY_SPREAD
