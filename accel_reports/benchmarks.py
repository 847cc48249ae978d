"""Benchmark tables and the noise-aware regression rule.

What is read from pytest-benchmark JSON
---------------------------------------
Each entry of ``benchmarks`` gives ``name``, ``fullname``, ``group``, ``params``, ``stats``
(``median``, ``mean``, ``stddev``, ``rounds``, and ``data``: the raw per-round times in seconds,
kept with ``--benchmark-save-data`` or ``--benchmark-json``) and ``extra_info``. A benchmark
written for accel puts these keys in ``extra_info`` (all optional; each has a fallback):

==================  ==========================================================================
``backend``         backend name (``cuda``, ``xpu``, ...); else the id found in the test's
                    parameters, else ``"unknown"``
``device``          device model, e.g. ``"NVIDIA H100 80GB HBM3"``
``dtype``           ``"bf16"``, ``"fp32"``, ...
``world_size``      number of ranks
``metric``          what ``value`` means: ``"throughput"``, ``"bandwidth"``, ``"time"``,
                    ``"latency"``, ...; default ``"time"``
``unit``            unit of the metric: ``"samples/s"``, ``"GB/s"``, ``"s"``, ``"ms"``, ...
``throughput``      the derived figure (work per second) for the median round
``work_size``       units of work per round (samples, bytes, tokens...), so that each raw time
                    sample ``t`` gives a throughput sample ``work_size / t``
``higher_is_better``  explicit direction; otherwise derived from ``metric``/``unit``:
                    throughput-like (``throughput``, ``bandwidth``, a unit ending in ``/s``,
                    ``flops``) is higher-is-better, time-like is lower-is-better
``samples``         raw samples in the metric's unit, when the benchmark measures something other
                    than the round time itself (they replace ``stats.data``)
``torch_version``, ``accel_version``  versions (else ``machine_info`` ``torch_version`` /
                    ``accel_version``, which a ``pytest_benchmark_update_machine_info`` hook may add)
``host_bound``      ``"compute"`` or ``"memory"``: which host resource limits the benchmark (set
                    for work that runs on the host CPU); absent or null when neither does
``host_reference``  the host probe bracketing the benchmark (``suites/benchmarks/host_reference.py``):
                    ``compute_gflops`` and ``memory_gbs`` of a fixed matmul and copy
``quick``           True for a ``--quick`` run (else the machine info's ``bench_quick``; else False)
==================  ==========================================================================

The samples compared are ``extra_info.samples`` if given, else the raw times converted to the
metric (``work_size / t`` for a throughput metric; ``work_size`` defaults to
``throughput * median time``), else the times themselves. Without raw data there is one sample (the
median): such a benchmark can be listed and compared but never called a regression on its own.

Quick runs
----------
A run made with ``accel bench --quick`` (``extra_info["quick"]``, else the machine info's
``bench_quick``) measures smaller problems with fewer rounds: its figures are another quantity.
Every row carries ``quick``; a quick run is compared only with quick runs and a full run only with
full runs. A quick run whose only reference is full gets the status ``quick: not compared``.

The regression rule with a history (``compare_benchmarks(..., history=frame)``)
--------------------------------------------------------------------------------
``history`` is every stored run of every benchmark (:meth:`accel_reports.history.History.benchmarks_frame`).
For each benchmark of the latest current run, the **reference** is the same benchmark (same
backend, torch version, device-neutral id and, when both name one, device model) in the last
``window`` (default 10) earlier runs **of the same kind** (full or quick), never the run itself.

* The **noise band** comes from those runs' own medians, not from one pair of runs: in log space,
  ``centre = median(log m_i)`` and ``half = max(log(1 + threshold), BAND_K * sigma)`` with
  ``sigma`` the largest of: ``1.4826 * MAD(log m_i)`` (the scatter between runs); with fewer than
  ``ROBUST_RUNS`` (5) runs, their plain standard deviation (the MAD of three values is ~0 whenever
  two of them happen to agree); and the standard error of a median from the runs' own rounds
  (the median within-run scatter, the IQR of each run's samples as a log-space sigma, times
  ``MEDIAN_ERROR / sqrt(rounds)``: a median of 10 rounds that spread 15 % moves ~4 % by its rounds
  alone, so a benchmark whose runs agree is not given a band as wide as its rounds; one whose
  rounds spread 100 % still cannot have ±10 %). The band is ``[exp(centre - half), exp(centre + half)]``.
  (The first version floored by the round spread itself; on three series of 6 identical runs on
  the loaded VM both versions gave 0 regressions, and the standard-error floor caught a planted
  20 % slowdown as suspect or worse in 9 of 12 benchmarks instead of 3.)
  Why this band: on a shared machine the run-to-run scatter of a benchmark is its own (on the
  2-core development VM under load, a transfer moved ±40 % and a small train step 20x between
  identical runs, a 512² fp16 matmul 3x), so one threshold for all is wrong both ways; a median
  and the median absolute deviation ignore a single wild run (the issue's "-95.7 %" bf16 matmul)
  once there are five runs, where a min/max envelope or a standard deviation would let it widen
  the band for the next ten runs; ``1.4826 * MAD`` estimates the standard deviation of normal
  scatter, and ``BAND_K = 3`` sigmas keeps identical code inside; log space makes "2x slower" and
  "2x faster" equally far. The floor ``threshold`` (10 %) keeps a benchmark with a very tight
  history from flagging changes nobody cares about.
* Host probe: when the benchmark has a ``host_bound`` kind, it and every run its judgement reads
  carry the host probe of that kind, **and** the figure relative to the probe scatters less over
  the earlier runs than the raw figure (at least 3 of them), the figure judged is the value
  relative to the probe (throughput / probe, time x probe); the band is shown in the metric's units
  at the current probe. The history decides per benchmark whether the probe earns its place: on a
  calm host a bf16 matmul's medians agreed within 3 % while the compute probe moved 20 %, and
  judging it relative to the probe had given it a ±30 % band. Measured on the 2-core development VM under load (6 identical ``accel bench`` runs,
  standard deviation of the log medians, raw -> relative to the probe): device copy 0.32 -> 0.13,
  h2d transfer 0.37 -> 0.09, d2h 0.46 -> 0.31, fp16 matmul 0.47 -> 0.28, fp32 0.77 -> 0.57;
  checkpoint load and bf16 matmul unchanged; the two MLP train steps worse (0.57 -> 0.74,
  1.38 -> 1.53), so the probe earns its place for copies and transfers, not for train steps (whose
  ``host_bound`` the suites could drop). The older ``host drift`` relabelling is not used under
  this rule: the probe is part of the figure, not an excuse after the fact.
* A run outside its band is only **suspect** (it never fails a report). It is a **regression**
  (or an **improvement**) when it is **confirmed**: the previous run of the same kind was also
  outside its own band, on the same side. A change that persists is therefore caught at its second
  run; a one-off excursion (a neighbour hogging the CPU for a minute) never gates. ``accel bench
  --repeat 2`` gets the confirmation in one session.
* With fewer than ``MIN_HISTORY`` (3) earlier runs the band is shown but a run outside it stays
  suspect: two or three medians cannot say how much a benchmark scatters.
* ``spread`` is the relative interquartile range of the latest run's own samples; above
  ``NOISY_SPREAD`` (25 %) an unconfirmed excursion is labelled ``too noisy`` instead of suspect.
* Statuses: ``regression``, ``improvement`` (both confirmed), ``suspect``, ``too noisy``,
  ``unchanged`` (inside the band), ``quick: not compared``, ``no reference``. Only ``regression``
  fails a report.

The rule against a baseline file (no history)
---------------------------------------------
For each benchmark (same backend, torch version and device-neutral id) the latest run is compared
with a reference: the ``--baseline`` results when given (same torch version if present there,
otherwise the same backend's newest), else the oldest run (of the same kind) passed in.

* ``change`` = median(new samples) / median(reference samples) - 1, in the metric's own terms
  (+20 % time is a slowdown, -20 % throughput is a slowdown); ``worse`` is the change in the bad
  direction.
* A benchmark **regresses** when ``worse > threshold`` (default 10 %) **and** the change is larger
  than the noise: with at least ``min_samples`` (default 5) raw samples on both sides, a one-sided
  Mann-Whitney U test (exact for small untied samples, normal approximation with tie correction
  otherwise) must give ``p < alpha`` (default 0.01). With fewer samples a single comparison proves
  nothing: the regression is confirmed only when the previous run of the history also exceeded
  the threshold against the same reference (repeated violation); otherwise it is "unconfirmed".
  (The samples of one run share that run's machine state, so on a shared machine this test is
  only as good as the machine is quiet: prefer a history.)
* Host drift: when both runs carry a ``host_reference`` of the benchmark's ``host_bound`` kind, the
  change is also taken relative to the host (``adjusted_change`` = change of value / host
  reference). A change over the threshold, with the host probe moving the same way by at least
  half of it (and half the threshold) and the host-relative change not beyond the threshold in
  that direction, gets the status ``host drift``: the machine got slower or
  faster, not the software. It never fails a report.
* Statuses: ``regression`` (confirmed), ``unconfirmed`` (over the threshold, too few samples, not
  repeated), ``within noise`` (over the threshold but not significant), ``host drift``,
  ``unchanged``, ``improvement`` (the same rule in the good direction), ``quick: not compared``,
  ``no reference``.

Both rules: ``speedup`` = how much faster the new run is (new/ref for higher-is-better, ref/new
otherwise); each table's summary is the geometric mean of the speedups (1.00x = unchanged).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from accel_harness.records import device_neutral_id

from .noise import NOISY_SPREAD, relative_iqr, row_spread  # the one noise measure, shared with the console

__all__ = [
    "BAND_K",
    "DEFAULT_ALPHA",
    "DEFAULT_MIN_SAMPLES",
    "DEFAULT_THRESHOLD",
    "DEFAULT_WINDOW",
    "HOST_REFERENCE_KEYS",
    "MIN_HISTORY",
    "NOISY_SPREAD",
    "QUICK_NOT_COMPARED",
    "Band",
    "benchmark_row",
    "judge_against_history",
    "judge_series",
    "noise_band",
    "relative_iqr",
    "compare_benchmarks",
    "compare_samples",
    "geometric_mean",
    "higher_is_better",
    "host_drift",
    "host_reference_value",
    "mann_whitney_greater",
    "summarise_benchmarks",
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

_HIGHER_METRICS = ("throughput", "bandwidth", "flops", "tflops", "samples_per_second", "tokens_per_second",
                   "items_per_second", "ops", "speedup", "mfu", "utilization")
_LOWER_METRICS = ("time", "latency", "duration", "step_time", "seconds", "memory", "overhead")
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_KNOWN_BACKENDS = ("cpu", "cuda", "xpu", "hpu", "mps")
#: ``extra_info["host_bound"]`` -> the figure of ``extra_info["host_reference"]`` it is compared with
HOST_REFERENCE_KEYS = {"compute": "compute_gflops", "memory": "memory_gbs"}


def host_reference_value(extra: Mapping[str, Any]) -> float | None:
    """The host probe figure of the benchmark's ``host_bound`` kind (None when it has none)."""
    key = HOST_REFERENCE_KEYS.get(str(extra.get("host_bound")))
    reference = extra.get("host_reference")
    if key is None or not isinstance(reference, Mapping):
        return None
    value = _number(reference.get(key))
    return value if value is not None and value > 0 else None


def host_drift(value: float, host: float, ref_value: float, ref_host: float, higher_better: bool,
               threshold: float = DEFAULT_THRESHOLD) -> dict[str, Any]:
    """Split a change into the host's part and the benchmark's own.

    ``host_change`` is how much the host probe (a throughput) moved: negative = the host got
    slower. ``adjusted_change`` is how much the benchmark moved relative to it, signed like the
    benchmark's own change (a throughput is divided by the host figure, a time multiplied).
    ``explained`` is True when the benchmark's change is over ``threshold`` and the host moved the
    same way by a real share of it (at least half the change and at least half the threshold),
    and relative to the host the benchmark did not move that way by more than ``threshold`` (a
    host that slowed down more than the benchmark explains the whole slowdown).
    """
    change = value / ref_value - 1.0
    host_change = host / ref_host - 1.0
    # a throughput follows the host's speed; a time follows its inverse
    relative = (value / host) / (ref_value / ref_host) if higher_better else (value * host) / (ref_value * ref_host)
    adjusted_change = relative - 1.0
    worse = -change if higher_better else change  # > 0: the benchmark got slower
    host_slower = -host_change  # > 0: the host got slower
    adjusted_worse = -adjusted_change if higher_better else adjusted_change
    same_way = (worse > 0) == (host_slower > 0)
    real_share = abs(host_slower) >= max(threshold / 2, abs(worse) / 2)
    within = (adjusted_worse if worse > 0 else -adjusted_worse) <= threshold
    explained = abs(worse) > threshold and same_way and real_share and within
    return {"host_change": host_change, "adjusted_change": adjusted_change, "explained": explained}


def higher_is_better(extra: Mapping[str, Any]) -> bool:
    """Direction of a benchmark's metric, from ``extra_info`` (see the module docstring)."""
    explicit = extra.get("higher_is_better")
    if isinstance(explicit, bool):
        return explicit
    metric = str(extra.get("metric") or "").lower()
    unit = str(extra.get("unit") or "").lower()
    if any(m in metric for m in _LOWER_METRICS):
        return False
    if any(m in metric for m in _HIGHER_METRICS):
        return True
    if unit.endswith("/s") or unit.endswith("/sec") or "flop" in unit or unit in ("it/s", "hz"):
        return True
    return False


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _backend_from(fullname: str) -> str | None:
    if "[" not in fullname:
        return None
    tokens = fullname[fullname.rfind("[") + 1:].rstrip("]").split("-")
    return next((b for b in _KNOWN_BACKENDS if b in tokens), None)


def benchmark_row(bench: Mapping[str, Any], machine: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One pytest-benchmark entry as a frame row (raises ValueError when it has no usable stats)."""
    if not isinstance(bench, Mapping):
        raise ValueError("not a JSON object")
    machine = machine or {}
    stats = bench.get("stats")
    if not isinstance(stats, Mapping):
        raise ValueError("no stats")
    extra = bench.get("extra_info") if isinstance(bench.get("extra_info"), Mapping) else {}
    name = str(bench.get("name") or bench.get("fullname") or "")
    if not name:
        raise ValueError("no name")
    fullname = str(bench.get("fullname") or name)
    backend = extra.get("backend") or _backend_from(fullname) or "unknown"
    backend = str(backend)
    times = [t for t in (_number(v) for v in stats.get("data") or []) if t is not None and t > 0]
    time_median = _number(stats.get("median"))
    if time_median is None and times:
        time_median = float(np.median(times))
    up = higher_is_better(extra)
    metric = str(extra.get("metric") or ("throughput" if up else "time"))
    unit = str(extra.get("unit") or ("1/s" if up else "s"))
    throughput = _number(extra.get("throughput"))
    given = extra.get("samples")
    if isinstance(given, list) and given:
        samples = [s for s in (_number(v) for v in given) if s is not None]
    elif up:
        work = _number(extra.get("work_size"))
        if work is None and throughput is not None and time_median:
            work = throughput * time_median
        if work is None:
            raise ValueError(f"metric {metric!r} is higher-is-better but extra_info has neither work_size nor throughput")
        samples = [work / t for t in times] if times else [throughput if throughput is not None else work / time_median]
    else:
        scale = 1.0 / _TIME_UNITS.get(unit, 1.0)  # pytest-benchmark times are seconds
        samples = [t * scale for t in times] if times else ([time_median * scale] if time_median is not None else [])
    if not samples:
        raise ValueError("no samples and no median in stats")
    world = extra.get("world_size")
    quick = extra.get("quick")
    if not isinstance(quick, bool):
        quick = bool(machine.get("bench_quick")) if isinstance(machine.get("bench_quick"), bool) else False
    return {
        "name": name,
        "fullname": fullname,
        "group": bench.get("group"),
        "bench_id": device_neutral_id(fullname, backend),
        "backend": backend,
        "device": extra.get("device"),
        "dtype": extra.get("dtype"),
        "world_size": int(world) if isinstance(world, (int, float)) and not isinstance(world, bool) else None,
        "torch_version": extra.get("torch_version") or machine.get("torch_version"),
        "accel_version": extra.get("accel_version") or machine.get("accel_version"),
        "metric": metric,
        "unit": unit,
        "higher_is_better": up,
        "value": float(np.median(samples)),
        "samples": tuple(samples),
        "n_samples": len(samples),
        "rounds": stats.get("rounds"),
        "time_median": time_median,
        "throughput": throughput,
        "host_bound": extra.get("host_bound") if extra.get("host_bound") in HOST_REFERENCE_KEYS else None,
        "host_ref": host_reference_value(extra),
        "quick": quick,
        # the problem size as the benchmark states it (``extra_info.sizes``, e.g. {"m": 1024}) and its work unit
        "sizes": dict(extra["sizes"]) if isinstance(extra.get("sizes"), dict) else None,
        "work_unit": extra.get("work_unit") if isinstance(extra.get("work_unit"), str) else None,
        "work_size": _number(extra.get("work_size")),
        # why a figure is what it is, as the benchmark explains it (e.g. a dtype without fast kernels here)
        "note": extra["note"].strip() if isinstance(extra.get("note"), str) and extra["note"].strip() else None,
    }


# ---------------------------------------------------------------------------- statistics
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
    """Apply the regression rule to one benchmark (see the module docstring).

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
    of those runs' own samples); see the module docstring. None when there is no positive median."""
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
    benchmark's ``host_bound`` kind, the figure judged is the value relative to the probe (see the
    module docstring). Adds to :func:`judge_against_history`'s result ``band_low``/``band_high``/
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


# ---------------------------------------------------------------------------- tables
def _order(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(_when=frame["datetime"].fillna("").astype(str)).sort_values(["_when", "source"], kind="mergesort")


def _is_quick(row: Mapping[str, Any]) -> bool:
    value = row.get("quick") if hasattr(row, "get") else None
    return bool(value) if isinstance(value, (bool, np.bool_)) else False


COLUMNS = ["backend", "torch_version", "accel_version", "bench_id", "name", "metric", "unit", "higher_is_better",
           "device", "dtype", "world_size", "value", "n_samples", "ref_value", "ref_n", "ref_source", "runs",
           "change", "speedup", "p_value", "status", "evidence", "host_change", "adjusted_change",
           "quick", "band_low", "band_high", "history_runs", "spread"]


def _same_device(frame: pd.DataFrame, device: Any) -> pd.Series:
    if device is None or (isinstance(device, float) and math.isnan(device)):
        return pd.Series(True, index=frame.index)
    return frame["device"].isna() | (frame["device"] == device)


def _history_pool(pool: pd.DataFrame, latest: Mapping[str, Any], backend: Any, torch_version: Any, bench_id: Any) -> pd.DataFrame:
    """Earlier runs of the latest's benchmark (any kind), oldest first, one row per run."""
    same = pool[(pool["backend"] == backend) & (pool["torch_version"] == torch_version) & (pool["bench_id"] == bench_id)]
    same = same[_same_device(same, latest.get("device")) & (same["run_id"] != latest.get("run_id"))]
    when = str(latest.get("datetime") or "")
    if when:
        same = same[same["datetime"].fillna("").astype(str) <= when]
    return _order(same).drop_duplicates("run_id", keep="last")


def compare_benchmarks(
    current: pd.DataFrame,
    baseline: pd.DataFrame | None = None,
    *,
    history: pd.DataFrame | None = None,
    window: int = DEFAULT_WINDOW,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    min_samples: int = DEFAULT_MIN_SAMPLES,
) -> pd.DataFrame:
    """One row per benchmark (backend, torch version, device-neutral id): latest value, reference,
    change, speedup, p-value, status and evidence, with ``quick``, the noise band (``band_low``,
    ``band_high``, ``history_runs``) and the latest run's ``spread``.

    With ``history`` (every stored run, :meth:`accel_reports.history.History.benchmarks_frame`) a
    benchmark that has earlier runs there is judged by the history rule; otherwise by the baseline
    rule. See the module docstring for both.
    """
    if current is None or current.empty:
        return pd.DataFrame(columns=COLUMNS)
    current = _order(current)
    base = _order(baseline) if baseline is not None and not baseline.empty else None
    pool = None
    if history is not None and not history.empty:
        pool = pd.concat([history, current], ignore_index=True) if not current.empty else history
    rows = []
    for (backend, torch_version, bench_id), group in current.groupby(["backend", "torch_version", "bench_id"], sort=True):
        latest = group.iloc[-1]
        quick = _is_quick(latest)
        row = {
            "backend": backend, "torch_version": torch_version, "accel_version": latest["accel_version"],
            "bench_id": bench_id, "name": latest["name"], "metric": latest["metric"], "unit": latest["unit"],
            "higher_is_better": bool(latest["higher_is_better"]), "device": latest["device"], "dtype": latest["dtype"],
            "world_size": latest["world_size"], "value": latest["value"], "n_samples": latest["n_samples"],
            "ref_value": None, "ref_n": None, "ref_source": "", "runs": len(group),
            "change": None, "speedup": None, "p_value": None, "status": "no reference", "evidence": "",
            "host_change": None, "adjusted_change": None,
            "quick": quick, "band_low": None, "band_high": None, "history_runs": 0,
            "spread": row_spread(latest),
        }
        earlier = _history_pool(pool, latest, backend, torch_version, bench_id) if pool is not None else None
        if earlier is not None and not earlier.empty:
            _judge_history(row, latest, earlier, quick, threshold, window)
        else:
            _judge_baseline(row, latest, group, base, quick, threshold, alpha, min_samples)
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _judge_history(row: dict[str, Any], latest: Mapping[str, Any], earlier: pd.DataFrame, quick: bool,
                   threshold: float, window: int) -> None:
    kinds = earlier["quick"].map(lambda q: bool(q) if isinstance(q, (bool, np.bool_)) else False) \
        if "quick" in earlier.columns else pd.Series(False, index=earlier.index)
    same = earlier[kinds == quick]
    row["runs"] = len(same) + 1
    if same.empty:
        other = len(earlier)
        if quick:
            row["status"] = QUICK_NOT_COMPARED
            row["evidence"] = (f"quick run: the history holds {other} full run(s) and no quick one; quick figures "
                               "(smaller problems, fewer rounds) are never compared with full ones")
        else:
            row["evidence"] = f"the history holds only quick runs ({other}); a full run is compared with full runs only"
        row["ref_source"] = "history"
        return
    series = [dict(r) for r in same.to_dict("records")] + [dict(latest)]
    result = judge_series(series, threshold=threshold, window=window)
    band = result["band"]
    kind = "quick" if quick else "full"
    row.update({"status": result["status"], "evidence": result["evidence"], "ref_source": "history"})
    if band is not None:
        row.update({"ref_value": result["centre"], "ref_n": band.runs, "band_low": result["band_low"],
                    "band_high": result["band_high"], "history_runs": band.runs, "change": result["change"],
                    "ref_source": f"history: last {band.runs} {kind} run(s)" + (" (relative to the host probe)" if result["host"] else ""),
                    "host_change": result["host_change"]})
        if result["host"]:
            row["adjusted_change"] = result["change"]
        centre = result["centre"]
        if row["value"] and centre:
            value = float(row["value"])
            row["speedup"] = value / centre if row["higher_is_better"] else centre / value
            if not result["host"]:
                row["change"] = value / centre - 1.0


def _judge_baseline(row: dict[str, Any], latest: Mapping[str, Any], group: pd.DataFrame, base: pd.DataFrame | None,
                    quick: bool, threshold: float, alpha: float, min_samples: int) -> None:
    reference = previous = None
    if base is not None:
        same = base[(base["backend"] == row["backend"]) & (base["bench_id"] == row["bench_id"])]
        exact = same[same["torch_version"] == row["torch_version"]]
        pick = exact if not exact.empty else same
        if not pick.empty:
            reference = pick.iloc[-1]
            row["ref_source"] = "baseline" + ("" if not exact.empty else f" (torch {reference['torch_version']})")
        kind = group[group.apply(_is_quick, axis=1) == quick] if len(group) >= 2 else group
        if len(kind) >= 2:
            previous = kind.iloc[-2]
    else:
        kind = group[group.apply(_is_quick, axis=1) == quick]
        if len(kind) >= 2:
            reference = kind.iloc[0]
            row["ref_source"] = f"first of {len(kind)} runs"
            if len(kind) >= 3:
                previous = kind.iloc[-2]
        elif len(group) > len(kind):
            reference = group[group.apply(_is_quick, axis=1) != quick].iloc[-1]
            row["ref_source"] = "another kind of run"
    if reference is None:
        return
    if _is_quick(reference) != quick:
        row["ref_value"], row["ref_n"] = reference["value"], reference["n_samples"]
        row["status"] = QUICK_NOT_COMPARED
        row["evidence"] = (f"{'quick' if quick else 'full'} run against a {'quick' if _is_quick(reference) else 'full'} "
                           "reference: quick runs (smaller problems, fewer rounds) are never compared with full ones")
        return
    result = compare_samples(
        reference["samples"], latest["samples"], bool(latest["higher_is_better"]),
        threshold=threshold, alpha=alpha, min_samples=min_samples,
        previous=previous["samples"] if previous is not None else None,
    )
    row.update({
        "ref_value": result["ref_median"], "ref_n": reference["n_samples"], "change": result["change"],
        "speedup": result["speedup"], "p_value": result["p_value"], "status": result["status"],
        "evidence": result["evidence"],
    })
    _apply_host_drift(row, latest, reference, threshold)


def _apply_host_drift(row: dict[str, Any], latest: Mapping[str, Any], reference: Mapping[str, Any], threshold: float,
                      relabel: bool = True) -> None:
    """Fill ``host_change``/``adjusted_change`` and (``relabel``: the baseline rule) relabel a change the
    host explains as ``host drift``."""
    host, ref_host = _number(latest.get("host_ref")), _number(reference.get("host_ref"))  # NaN when absent
    if host is None or ref_host is None or latest.get("host_bound") != reference.get("host_bound"):
        return
    if not row["value"] or not row["ref_value"]:
        return
    drift = host_drift(float(row["value"]), host, float(row["ref_value"]), ref_host, row["higher_is_better"], threshold)
    row["host_change"], row["adjusted_change"] = drift["host_change"], drift["adjusted_change"]
    if row["status"] == "unchanged" and abs(drift["adjusted_change"]) > threshold:
        # the raw figure held while the host moved: worth a look, though the probe is noisy
        row["evidence"] += (f"; relative to the host {drift['adjusted_change']:+.0%} "
                            f"(its {latest['host_bound']} reference moved {drift['host_change']:+.0%})")
    if relabel and drift["explained"] and row["status"] in ("regression", "improvement", "unconfirmed", "within noise"):
        row["evidence"] = (f"the host's {latest['host_bound']} reference moved {drift['host_change']:+.0%} with it; "
                           f"relative to the host the change is {drift['adjusted_change']:+.0%} "
                           f"(was: {row['status']}; {row['evidence']})")
        row["status"] = "host drift"


def summarise_benchmarks(table: pd.DataFrame) -> pd.DataFrame:
    """Per backend and torch version: benchmarks, geometric-mean speedup, regressions, improvements, host drift,
    suspect (outside the band, unconfirmed, or too noisy) and quick (benchmarks from quick runs)."""
    columns = ["backend", "torch_version", "benchmarks", "compared", "geomean_speedup", "regressions", "improvements",
               "host_drift", "suspect", "quick"]
    if table.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for (backend, torch_version), group in table.groupby(["backend", "torch_version"], sort=True):
        compared = group[group["speedup"].notna()]
        rows.append({
            "backend": backend, "torch_version": torch_version, "benchmarks": len(group), "compared": len(compared),
            "geomean_speedup": geometric_mean(compared["speedup"].astype(float).tolist()),
            "regressions": int((group["status"] == "regression").sum()),
            "improvements": int((group["status"] == "improvement").sum()),
            "host_drift": int((group["status"] == "host drift").sum()),
            "suspect": int(group["status"].isin(("suspect", "too noisy")).sum()),
            "quick": int(group["quick"].fillna(False).astype(bool).sum()) if "quick" in group.columns else 0,
        })
    return pd.DataFrame(rows, columns=columns)
