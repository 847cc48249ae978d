"""Benchmark tables and the noise-aware regression rule.

:func:`compare_benchmarks` judges each benchmark of the latest run against its own history (a
noise band from earlier runs' medians; only a confirmed excursion is a regression) or, without a
history, against a baseline (a threshold plus a significance test), because on a shared machine
one fixed threshold is wrong both ways. Reading entries lives in :mod:`accel_reports.load.benchmark_rows`,
the statistics in :mod:`accel_reports.analyse.benchmark_stats`; the rules, the ``extra_info`` keys read
and the measurements behind them are in docs/reports.md.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..load.benchmark_rows import HOST_REFERENCE_KEYS, _number, benchmark_row, higher_is_better, host_reference_value
from .benchmark_stats import (
    BAND_K,
    DEFAULT_ALPHA,
    DEFAULT_MIN_SAMPLES,
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW,
    MIN_HISTORY,
    QUICK_NOT_COMPARED,
    Band,
    compare_samples,
    geometric_mean,
    judge_against_history,
    judge_series,
    mann_whitney_greater,
    noise_band,
)
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

    With ``history`` (every stored run, :meth:`accel_reports.history.store.History.benchmarks_frame`) a
    benchmark that has earlier runs there is judged by the history rule; otherwise by the baseline
    rule. Both rules are described in docs/reports.md.
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
