"""The statistics of the regression rule: significance test, noise band and judgement of a series.

Apart from the tables (:mod:`accel_reports.analyse.benchmarks`) so that each can be read on its own; the rule
and why it is built this way are in docs/reports.md.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..load.benchmark_rows import _number
from .noise import NOISY_SPREAD, row_spread

__all__ = [
    "BAND_K", "DEFAULT_ALPHA", "DEFAULT_MIN_SAMPLES", "DEFAULT_THRESHOLD", "DEFAULT_WINDOW", "MIN_HISTORY",
    "QUICK_NOT_COMPARED", "Band", "compare_samples", "geometric_mean", "judge_against_history", "judge_series",
    "mann_whitney_greater", "noise_band",
]

DEFAULT_THRESHOLD = 0.10
DEFAULT_ALPHA = 0.01
DEFAULT_MIN_SAMPLES = 5
#: earlier runs of the same kind the noise band is taken from
DEFAULT_WINDOW = 10
#: fewer earlier runs than this: a run outside the band stays suspect
MIN_HISTORY = 3
#: half-width of the band in robust standard deviations of the per-run medians
BAND_K = 3.0
#: from this many earlier runs on, the band's scale is the median absolute deviation alone
ROBUST_RUNS = 5
#: standard error of a median over that of a mean, for normal samples (sqrt(pi / 2))
MEDIAN_ERROR = 1.2533
QUICK_NOT_COMPARED = "quick: not compared"


def _exact_upper_tail(u: float, m: int, n: int) -> float:
    """P(U >= u) for the Mann-Whitney U of ``m`` against ``n`` untied values under H0."""
    size = m * n + 1
    # counts[j] = number of arrangements of i x's and j y's per value of U (rows built for i = 0..m)
    prev = [np.zeros(size) for _ in range(n + 1)]
    for j in range(n + 1):
        prev[j][0] = 1.0
    for i in range(1, m + 1):
        cur = [np.zeros(size) for _ in range(n + 1)]
        cur[0][0] = 1.0
        for j in range(1, n + 1):
            # the largest value is an x (beats all j y's) or a y (beats nothing)
            shifted = np.zeros(size)
            shifted[j:] = prev[j][: size - j]
            cur[j] = shifted + cur[j - 1]
        prev = cur
    counts = prev[n]
    total = counts.sum()
    start = int(math.ceil(u - 1e-9))
    return float(counts[start:].sum() / total)


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided Mann-Whitney U p-value for "values in ``x`` tend to be larger than in ``y``"."""
    m, n = len(x), len(y)
    if not m or not n:
        return 1.0
    values = np.concatenate([np.asarray(x, dtype=float), np.asarray(y, dtype=float)])
    order = values.argsort(kind="mergesort")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    # average ranks for ties
    i = 0
    tie_term = 0.0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        t = j - i + 1
        tie_term += t ** 3 - t
        i = j + 1
    u = float(ranks[:m].sum() - m * (m + 1) / 2.0)
    if tie_term == 0 and m * n <= 400:
        return _exact_upper_tail(u, m, n)
    total = m + n
    variance = m * n / 12.0 * ((total + 1) - tie_term / (total * (total - 1)))
    if variance <= 0:
        return 1.0
    z = (u - m * n / 2.0 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def geometric_mean(values: Sequence[float]) -> float | None:
    clean = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not clean:
        return None
    return float(math.exp(sum(math.log(v) for v in clean) / len(clean)))


def compare_samples(
    reference: Sequence[float],
    new: Sequence[float],
    higher_better: bool,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    previous: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Apply the regression rule to one benchmark (docs/reports.md).

    ``previous`` are the samples of the run before ``new`` in the history (same reference), used
    to confirm a change that the samples alone cannot (repeated violation).
    Returns ``ref_median, new_median, change, worse, speedup, p_value, status, evidence``.
    """
    ref_median = float(np.median(reference))
    new_median = float(np.median(new))
    change = new_median / ref_median - 1.0 if ref_median else float("nan")
    worse = -change if higher_better else change
    speedup = (new_median / ref_median if higher_better else ref_median / new_median) if ref_median and new_median else float("nan")
    enough = len(reference) >= min_samples and len(new) >= min_samples
    out = {"ref_median": ref_median, "new_median": new_median, "change": change, "worse": worse,
           "speedup": speedup, "p_value": None, "status": "unchanged", "evidence": ""}
    if not math.isfinite(worse) or abs(worse) <= threshold:
        out["evidence"] = f"within ±{threshold:.0%}"
        return out
    bad = worse > 0
    kind = "regression" if bad else "improvement"
    if enough:
        # "worse" means larger values for lower-is-better metrics, smaller for higher-is-better
        larger, smaller = (new, reference) if bad != higher_better else (reference, new)
        p = mann_whitney_greater(larger, smaller)
        out["p_value"] = p
        if p < alpha:
            out["status"] = kind
            out["evidence"] = f"Mann-Whitney U p={p:.2g} < {alpha:g} ({len(new)} vs {len(reference)} samples)"
        else:
            out["status"] = "within noise"
            out["evidence"] = f"Mann-Whitney U p={p:.2g} ≥ {alpha:g}: not distinguishable from noise"
        return out
    if previous is not None and len(previous):
        prev_change = float(np.median(previous)) / ref_median - 1.0
        prev_worse = -prev_change if higher_better else prev_change
        if (prev_worse > threshold) if bad else (prev_worse < -threshold):
            out["status"] = kind
            out["evidence"] = f"repeated: the previous run was also {abs(prev_worse):.0%} {'worse' if bad else 'better'}"
            return out
    out["status"] = "unconfirmed"
    out["evidence"] = (f"only {min(len(new), len(reference))} sample(s) on one side (need {min_samples}) "
                       "and not repeated in the previous run")
    return out


# ---------------------------------------------------------------------------- the history rule
class Band(tuple):
    """``(low, centre, high, runs)``: the noise band of a benchmark from ``runs`` earlier medians."""

    __slots__ = ()

    def __new__(cls, low: float, centre: float, high: float, runs: int) -> "Band":
        return tuple.__new__(cls, (low, centre, high, runs))

    low = property(lambda self: self[0])
    centre = property(lambda self: self[1])
    high = property(lambda self: self[2])
    runs = property(lambda self: self[3])

    def side(self, value: float) -> int:
        """-1 below the band, +1 above it, 0 inside."""
        return -1 if value < self.low else (1 if value > self.high else 0)


def _log_sigma_of_spread(spread: float) -> float:
    """Standard deviation (log space) of samples whose IQR is ``spread`` times their median."""
    return 2.0 * math.log1p(spread / 2.0) / 1.349


def noise_band(medians: Sequence[float], *, threshold: float = DEFAULT_THRESHOLD, k: float = BAND_K,
               spreads: Sequence[float | None] | None = None, rounds: int = 1) -> Band | None:
    """The band of a benchmark from its earlier runs' medians (and, when given, the relative IQRs
    of those runs' own samples); see docs/reports.md. None when there is no positive median."""
    logs = np.log([m for m in (_number(v) for v in medians) if m is not None and m > 0])
    if not len(logs):
        return None
    centre = float(np.median(logs))
    sigma = 1.4826 * float(np.median(np.abs(logs - centre)))
    if 2 <= len(logs) < ROBUST_RUNS:  # a median absolute deviation of 2-4 values can be ~0 by chance
        sigma = max(sigma, float(np.std(logs, ddof=1)))
    within = [_log_sigma_of_spread(v) for v in (_number(x) for x in (spreads or ())) if v is not None and v >= 0]
    if within:  # floor: how far a run's median can move by its own rounds alone (its standard error)
        sigma = max(sigma, MEDIAN_ERROR * float(np.median(within)) / math.sqrt(max(rounds, 1)))
    half = max(math.log1p(threshold), k * sigma)
    return Band(math.exp(centre - half), math.exp(centre), math.exp(centre + half), len(logs))


def judge_against_history(
    value: float,
    earlier: Sequence[float],
    higher_better: bool,
    *,
    spreads: Sequence[float | None] | None = None,
    spread: float | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    window: int = DEFAULT_WINDOW,
    min_history: int = MIN_HISTORY,
    rounds: int = 1,
) -> dict[str, Any]:
    """The history rule for one benchmark run.

    ``value`` is the run's median (or its figure relative to the host probe); ``earlier`` the same
    figure of the earlier runs of the same kind, oldest first (the band uses the last ``window``;
    the last of them is the previous run, judged against the ``window`` before it for the
    confirmation); ``spreads`` the relative IQRs of those runs' samples (same order), ``spread``
    this run's; ``rounds`` how many samples each median comes from (the spreads floor the band by
    the median's standard error). Returns ``band`` (or None), ``status``, ``evidence``, ``change``
    (against the band's centre) and ``side`` (+1 worse, -1 better, 0 inside).
    """
    every = [float(v) for v in earlier]
    every_spreads = list(spreads) if spreads is not None else [None] * len(every)
    if len(every_spreads) != len(every):
        raise ValueError(f"{len(every)} earlier values but {len(every_spreads)} spreads")
    cut = max(0, len(every) - window) if window > 0 else len(every)
    band = noise_band(every[cut:], threshold=threshold, spreads=every_spreads[cut:], rounds=rounds)
    out: dict[str, Any] = {"band": band, "status": "no reference", "evidence": "", "change": None, "side": 0}
    if band is None:
        out["evidence"] = "no earlier run of this kind in the history"
        return out
    change = value / band.centre - 1.0
    out["change"] = change
    raw_side = band.side(value)
    worse_side = -raw_side if higher_better else raw_side  # +1: on the bad side
    out["side"] = worse_side
    width = f"band {band.low:.4g}–{band.high:.4g} from {band.runs} run(s)"
    if worse_side == 0:
        out["status"], out["evidence"] = "unchanged", f"inside the {width}"
        return out
    where = "below" if raw_side < 0 else "above"
    direction = "slower" if worse_side > 0 else "faster"
    if band.runs < min_history:
        out["status"] = "suspect"
        out["evidence"] = f"{where} the {width} ({direction}); fewer than {min_history} earlier runs: not judged"
        return out
    # confirmation: the previous run was outside its own band on the same side
    prev_value = every[-1]
    prev_cut = max(0, len(every) - 1 - window) if window > 0 else len(every) - 1
    prev_band = noise_band(every[prev_cut:-1], threshold=threshold, spreads=every_spreads[prev_cut:-1], rounds=rounds) \
        if len(every) > 1 else None
    prev_side = 0
    if prev_band is not None and prev_band.runs >= min_history - 1:
        prev_side = prev_band.side(prev_value)
        prev_side = -prev_side if higher_better else prev_side
    if prev_side == worse_side:
        out["status"] = "regression" if worse_side > 0 else "improvement"
        out["evidence"] = (f"{where} the {width} ({change:+.1%}), and the previous run was {where} its band too "
                           f"({prev_value / prev_band.centre - 1.0:+.1%}): confirmed")
        return out
    noisy = spread is not None and spread > NOISY_SPREAD
    out["status"] = "too noisy" if noisy else "suspect"
    out["evidence"] = (f"{where} the {width} ({change:+.1%}), not confirmed by the previous run"
                       + (f"; its own samples spread {spread:.0%} (IQR/median)" if noisy else "")
                       + "; a regression needs the next run (or accel bench --repeat 2) outside the band too")
    return out


def _log_scatter(values: Sequence[float]) -> float:
    """Standard deviation of log ``values`` (inf with fewer than 3: too few to tell)."""
    logs = [math.log(v) for v in values if v > 0]
    return float(np.std(logs, ddof=1)) if len(logs) >= 3 else math.inf


def judge_series(series: Sequence[Mapping[str, Any]], *, threshold: float = DEFAULT_THRESHOLD,
                 window: int = DEFAULT_WINDOW) -> dict[str, Any]:
    """Judge the last run of ``series`` (benchmark rows of one benchmark and kind, oldest first) against
    the runs before it. When it and the runs its judgement reads all carry the host probe of the
    benchmark's ``host_bound`` kind, the figure judged is the value relative to the probe (see
    docs/reports.md). Adds to :func:`judge_against_history`'s result ``band_low``/``band_high``/
    ``centre`` in the metric's own units, ``host`` (whether the probe was used), ``host_change``."""
    rows = list(series)[-(window + 2):] if window > 0 else list(series)[-1:]
    latest = rows[-1]
    up = bool(latest.get("higher_is_better"))
    hosts = [_number(r.get("host_ref")) for r in rows]
    kinds = {r.get("host_bound") for r in rows}
    use_host = len(rows) > 1 and len(kinds) == 1 and None not in kinds and all(h is not None and h > 0 for h in hosts)
    values = [float(r["value"]) for r in rows]
    if use_host:
        relative = [v / h if up else v * h for v, h in zip(values, hosts)]
        # the probe earns its place only where it steadies this benchmark's own history
        use_host = _log_scatter(relative[:-1]) < _log_scatter(values[:-1])
        if use_host:
            values = relative
    spreads = [row_spread(r) for r in rows]
    counts = [int(n) for n in (_number(r.get("n_samples")) for r in rows[:-1]) if n]
    result = judge_against_history(values[-1], values[:-1], up, spreads=spreads[:-1], spread=spreads[-1],
                                   threshold=threshold, window=window,
                                   rounds=int(np.median(counts)) if counts else 1)
    band = result["band"]
    result.update({"host": use_host, "host_change": None, "band_low": None, "band_high": None, "centre": None,
                   "spread": spreads[-1]})
    if band is not None:
        scale = (lambda x: x * hosts[-1] if up else x / hosts[-1]) if use_host else (lambda x: x)
        lo, hi = sorted((scale(band.low), scale(band.high)))
        result.update({"band_low": lo, "band_high": hi, "centre": scale(band.centre)})
        if use_host:
            result["host_change"] = hosts[-1] / float(np.median(hosts[:-1][-window:])) - 1.0
            result["evidence"] = (f"relative to the host's {latest.get('host_bound')} probe "
                                  f"(it moved {result['host_change']:+.0%}): " + result["evidence"])
    return result
