"""The report's benchmark view (part of :mod:`accel_reports.render.report`): one table per backend and torch
version with problem sizes, spreads, references, noise bands and trend lines, the summary per cell,
and the charts that compare backends."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import pandas as pd

from . import charts
from . import text as _text
from ..analyse.analysis import Report
from ..analyse.claims import claimed_ratio, slow_kernel_note
from ..analyse.noise import is_too_noisy, row_spread, spread_text  # the one noise measure (console, gate and report)
from .text import _fmt_number, _pct, _present, _quantity, _records, _slug


# ---------------------------------------------------------------------------- benchmarks
#: items of a list-valued size shown before "… (N in all)"
SIZE_ITEMS = 4


def _size_value(key: Any, value: Any) -> str:
    """``4096``, ``350M``, ``64 MiB`` (a key naming bytes): a problem size as a person writes it. A list
    is written out, never as a Python repr: ``4 × 1 MiB`` when its items are equal, else ``[a, b, …]``."""
    if isinstance(value, (list, tuple)):
        items = [_size_value(key, v) for v in value]
        if not items:
            return "none"
        if len(items) > 1 and len(set(items)) == 1:
            return f"{len(items)} × {items[0]}"
        shown = ", ".join(items[:SIZE_ITEMS])
        return f"[{shown}, … ({len(items)} in all)]" if len(items) > SIZE_ITEMS else f"[{shown}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_size_value(k, v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return str(value)
    if "byte" in str(key).lower() and value >= 1024:
        for scale, prefix in ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki")):
            if value >= scale:
                return f"{value / scale:.3g} {prefix}B"
    if float(value).is_integer() and abs(value) < 100_000:
        return f"{int(value)}"
    return _fmt_number(value).replace(" ", "")


def _problem_size(name: Any, backend: Any, dtype: Any, extra: dict[str, Any], work: Any, unit: Any) -> str:
    """What one round works on, from what the benchmark recorded: ``extra_info.sizes``, else the
    parameters in its id (backend, dtype and rank count removed), plus the work per round."""
    parts = []
    sizes = extra.get("sizes")
    if isinstance(sizes, dict) and sizes:
        parts.append(", ".join(f"{k}={_size_value(k, v)}" for k, v in sizes.items()))
        return "; ".join(parts)  # the sizes say it; the work per round would repeat them
    params = _id_params(name, backend, dtype)
    if params:
        parts.append("-".join(params))
    work_unit = extra.get("work_unit") or (str(unit).split("/")[0] if unit and "/" in str(unit) else None)
    if isinstance(work, (int, float)) and math.isfinite(work) and work > 0 and work_unit:
        parts.append(f"{_quantity(work, work_unit)}/round" if work_unit in ("B",) else f"{_fmt_number(work)} {work_unit}/round")
    return "; ".join(parts)


def _id_params(name: Any, backend: Any, dtype: Any) -> list[str]:
    """The parameters in a benchmark's id (``[cpu-mlp-torch]``) without the backend, the dtype and the
    rank count, which have their own columns: ``["mlp", "torch"]``."""
    match = re.search(r"\[(.*)\]\s*\Z", str(name or ""))
    if not match:
        return []
    drop = {str(backend).lower(), str(dtype).lower()}
    return [p for p in match.group(1).split("-") if p and p.lower() not in drop and not re.fullmatch(r"(?:ws|ranks)\d+", p)]


def _hardware_notes(rows: list[dict[str, Any]]) -> None:
    """Check each note that claims a dtype has no fast kernels (:func:`accel_reports.analyse.claims.claimed_ratio`)
    against the figures the table shows: the row's own spread and that of the float32 row of the same
    benchmark; a claim they do not support becomes "too noisy to conclude" with both spreads."""
    # the float32 figure of each benchmark in this table (the same run and cell)
    float32 = {r["short_name"]: r["spread"] for r in rows if r.get("dtype") == "float32"}
    for row in rows:
        ratio = claimed_ratio(row.get("note"))
        if ratio is None:
            continue
        checked = slow_kernel_note(str(row.get("dtype") or ""), ratio, row["spread"], float32.get(row["short_name"]))
        if claimed_ratio(checked) is None:  # the figures do not support it: say so (a supported claim stays as written)
            row["note"] = checked or ""


def _bench_history(benchmarks: pd.DataFrame) -> tuple[dict[tuple, list[tuple[str, float]]], dict[tuple, dict[str, Any]]]:
    """Per (backend, torch version, bench id): per-run medians oldest first, and the latest row."""
    if benchmarks.empty:
        return {}, {}
    ordered = benchmarks.assign(_when=benchmarks["datetime"].fillna("")).sort_values("_when", kind="mergesort")
    series: dict[tuple, list[tuple[str, float]]] = {}
    latest: dict[tuple, dict[str, Any]] = {}
    columns = ["backend", "torch_version", "bench_id", "datetime", "value", "samples", "source", "fullname", "name",
               "time_median", "throughput"] + [c for c in ("quick", "sizes", "work_unit", "work_size", "note", "higher_is_better") if c in ordered.columns]
    for row in ordered[columns].to_dict("records"):
        key = (row["backend"], row["torch_version"], row["bench_id"])
        value = row["value"]
        if isinstance(value, (int, float)) and math.isfinite(value):
            series.setdefault(key, []).append((str(row["datetime"] or ""), float(value)))
        latest[key] = row
    return series, latest


def _number_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _benchmark_view(report: Report) -> dict[str, Any]:
    table = report.bench_table
    empty = {"tables": [], "summary": [], "charts": [], "regressions": [], "host_drift": [], "rows": [], "quick": False,
             "suspect": [], "cols": _bench_columns([])}
    if table.empty:
        return empty
    # a run history (accel report --history) holds every stored run: the trend lines come from it
    series, latest = _bench_history(report.loaded.benchmarks)
    if not report.history_benchmarks.empty:
        series = _bench_history(report.history_benchmarks)[0]
    has = set(table.columns)
    tables, all_rows = [], []
    for (backend, torch_version), group in table.groupby(["backend", "torch_version"], sort=True):
        rows = []
        for row in _records(group):
            key = (row["backend"], row["torch_version"], row["bench_id"])
            last = latest.get(key, {})
            # what the benchmark recorded of its problem size, kept in its row (no file is read here)
            extra = {k: last[k] for k in ("sizes", "work_unit", "work_size") if last.get(k) is not None}
            if not isinstance(extra.get("sizes"), dict):
                extra.pop("sizes", None)
            unit = row["unit"]
            fmt = functools.partial(_quantity, unit=unit)
            ref_n = row.get("ref_n")
            spread = _number_or_none(row.get("spread")) if "spread" in has else None
            if spread is None:
                spread = row_spread(last)
            quick = row.get("quick") if "quick" in has else None
            if quick is None:
                quick = last.get("quick")
            quick = bool(quick)
            band = (_number_or_none(row.get("band_low")), _number_or_none(row.get("band_high")))
            work = extra.get("work_size")
            if work is None and _number_or_none(last.get("throughput")) and _number_or_none(last.get("time_median")):
                work = last["throughput"] * last["time_median"]
            value, ref = _number_or_none(row["value"]), _number_or_none(row["ref_value"])
            peak = max([v for v in (value, ref, band[1]) if v is not None], default=1.0) * 1.08
            status = row["status"] or ""
            points = series.get(key, [])[-_text.TREND_POINTS:]
            rows.append({**row, "ref_n": int(ref_n) if ref_n is not None else None,
                         "value_text": fmt(row["value"]), "ref_text": fmt(row["ref_value"]),
                         "change_text": _pct(row["change"], signed=True), "speedup_text": f"{row['speedup']:.3f}×" if row["speedup"] else "–",
                         "p_text": f"{row['p_value']:.2g}" if row["p_value"] is not None else "–",
                         "host_text": _pct(row.get("host_change"), signed=True),
                         "vs_host_text": _pct(row.get("adjusted_change"), signed=True),
                         "direction": "higher is better" if row["higher_is_better"] else "lower is better",
                         "short_name": re.sub(r"\[[^\[\]]*\]\s*\Z", "", str(row["name"])) or str(row["name"]),
                         "size": _problem_size(row["name"], row["backend"], row["dtype"], extra, work, unit),
                         "dtype": row.get("dtype") or "", "world_size": row.get("world_size"),
                         "spread": spread, "spread_text": spread_text(spread), "noisy": is_too_noisy(spread),
                         "variant": " · ".join(_id_params(row["name"], row["backend"], row["dtype"])),
                         "note": last.get("note") if isinstance(last.get("note"), str) else "",
                         "quick": quick, "band_text": f"{fmt(band[0])} – {fmt(band[1])}" if band[0] is not None and band[1] is not None else "",
                         "history_runs": row.get("history_runs") if "history_runs" in has else len(points),
                         "status_css": _slug(status),
                         "bar": charts.value_bar(value, ref, peak, status=status, band=band, fmt=fmt),
                         "trend": charts.trend(points, band=band, ref=ref, status=status, fmt=fmt, width=120) if len(points) > 1 else ""})
        _hardware_notes(rows)
        tables.append({"backend": backend, "torch_version": torch_version, "rows": rows,
                       "has_host": any(r["host_text"] != "–" for r in rows), "has_p": any(r["p_text"] != "–" for r in rows),
                       "quick": any(r["quick"] for r in rows), "cols": _bench_columns(rows)})
        all_rows.extend(rows)
    summary = []
    for row in _records(report.bench_summary):
        row["geomean_text"] = f"{row['geomean_speedup']:.3f}×" if row["geomean_speedup"] else "–"
        mine = [r for r in all_rows if (r["backend"], r["torch_version"]) == (row["backend"], row["torch_version"])]
        row["suspect"] = sum(1 for r in mine if r["status"] == "suspect")
        row["quick"] = any(r["quick"] for r in mine)
        summary.append(row)
    charts_out = []
    if table["backend"].nunique() > 1:  # the same benchmark across backends
        by_bench: dict[tuple, list[dict[str, Any]]] = {}
        for row in all_rows:
            by_bench.setdefault((row["bench_id"], row["unit"]), []).append(row)
        for (bench_id, unit), rows in sorted(by_bench.items(), key=lambda kv: str(kv[0])):
            if len({r["backend"] for r in rows}) < 2:
                continue
            name = str(bench_id).rsplit("::", 1)[-1]
            title = f"{name} ({unit}, {'higher' if rows[0]['higher_is_better'] else 'lower'} is better)"
            items = [{"label": f"{r['backend']} · torch {r['torch_version']}", "value": _number_or_none(r["value"]),
                      "ref": _number_or_none(r["ref_value"]), "status": r["status"]} for r in rows]
            charts_out.append({"title": title, "svg": charts.grouped_bars(items, functools.partial(_quantity, unit=unit), title=title)})
    regressions = [r for r in all_rows if r["status"] == "regression"]
    drift = [r for r in all_rows if r["status"] == "host drift"]
    suspect = [r for r in all_rows if r["status"] == "suspect"]
    return {"tables": tables, "summary": summary, "charts": charts_out, "regressions": regressions, "host_drift": drift,
            "suspect": suspect, "rows": all_rows, "quick": any(r["quick"] for r in all_rows), "cols": _bench_columns(all_rows)}


def _bench_columns(rows: list[dict[str, Any]]) -> dict[str, bool]:
    """Which of the benchmark table's optional columns have a value in some row (the others are left out)."""
    return {
        "size": _present(rows, "size"), "dtype": _present(rows, "dtype"), "ranks": _present(rows, "world_size"),
        "spread": _present(rows, "spread"), "ref": _present(rows, "ref_text"), "change": _present(rows, "change_text"),
        "trend": _present(rows, "trend"), "speedup": _present(rows, "speedup_text"), "evidence": _present(rows, "evidence"),
        "note": _present(rows, "note"),
    }
