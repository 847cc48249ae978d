"""The one noise measure of a benchmark: how widely its rounds spread, and when that is too wide to judge.

Computed once where a benchmark is measured (stored as ``extra_info["spread"]``) and read by the
console (``accel bench``, ``accel qualify``'s tally), the gate and the report, so they never give
different figures for the same run: :func:`spread_of` reads it from a pytest-benchmark record,
:func:`row_spread` from a report row, :func:`noisy_benchmarks` counts the noisy ones and
:func:`spread_text` writes a spread the same way everywhere. Pure Python, so the benchmark suites
and the CLI can use it without pandas.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["NOISY_SPREAD", "is_too_noisy", "noisy_benchmarks", "relative_iqr", "row_spread", "spread_of", "spread_text"]

#: a benchmark whose rounds spread more than this (IQR over median) is too noisy to judge on its own,
#: and too noisy to support a claim about the hardware (:mod:`accel_reports.analyse.claims`)
NOISY_SPREAD = 0.25


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def relative_iqr(samples: Sequence[Any]) -> float | None:
    """Interquartile range of ``samples`` over their median (linear quartiles); None with fewer than 4
    finite numbers or a zero median."""
    values = [v for v in (_finite(s) for s in samples) if v is not None]
    if len(values) < 4:
        return None
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / abs(median) if median else None


def spread_of(record: Mapping[str, Any]) -> float | None:
    """The spread of one pytest-benchmark record: the stored ``extra_info["spread"]``, else computed
    the same way from its round times (``stats.data``)."""
    extra = record.get("extra_info")
    stored = _finite(extra.get("spread")) if isinstance(extra, Mapping) else None
    if stored is not None:
        return stored
    stats = record.get("stats")
    data = stats.get("data") if isinstance(stats, Mapping) else None
    return relative_iqr(data) if isinstance(data, (list, tuple)) else None


def row_spread(row: Mapping[str, Any]) -> float | None:
    """The spread of one report row (:func:`accel_reports.analyse.benchmarks.benchmark_row`, also as a history
    stores it): a ``spread`` it carries, else the same measure as :func:`spread_of` over the round
    times its ``samples`` stand for. A throughput sample is work over a round's time and the measure
    does not change with scale, so it is taken over the samples' inverses: the very figure the
    console shows, never the spread of the throughputs (which differs, widely for noisy rounds)."""
    stored = _finite(row.get("spread"))
    if stored is not None:
        return stored
    samples = row.get("samples")
    if not isinstance(samples, (list, tuple)):
        return None
    if row.get("higher_is_better"):
        samples = [1.0 / v for v in (_finite(s) for s in samples) if v]
    return relative_iqr(samples)


def is_too_noisy(spread: float | None) -> bool:
    """Whether a spread is past :data:`NOISY_SPREAD` (None, unknown, is not)."""
    return spread is not None and spread > NOISY_SPREAD


def noisy_benchmarks(records: Iterable[Mapping[str, Any]]) -> list[tuple[str, float]]:
    """``(name, spread)`` of the pytest-benchmark records too noisy to judge, noisiest first: the one
    count the console and the report give."""
    out = []
    for record in records:
        spread = spread_of(record)
        if spread is not None and is_too_noisy(spread):
            out.append((str(record.get("name") or record.get("fullname")), spread))
    return sorted(out, key=lambda item: -item[1])


def spread_text(spread: float | None) -> str:
    """``151%``: a spread as the console and the report both write it (``–`` when unknown)."""
    value = _finite(spread)
    return "–" if value is None else f"{value:.0%}"
