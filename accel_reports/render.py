"""Render a :class:`accel_reports.analysis.Report` as one self-contained HTML file and as Markdown.

HTML (``templates/report.html.j2``): inline CSS, one small inline script (sorting, filtering,
opening a failure's details from the grid), inline SVG charts; no network request is needed to
open it. Jinja2 autoescaping escapes every value; the page's Content-Security-Policy only allows
its own script (by SHA-256 hash), so even markup that slipped through could not run code.
The per-test grid lists only the tests that did not pass everywhere, one letter per cell, and each
distinct failure (test and signature) once, with its traceback in a ``<details>`` element.

Markdown (``templates/report.md.j2``, GitHub-flavoured, for pull requests, issues and CI job
summaries): text is escaped for table cells (``\\ | ` * _ [ ] $`` get a backslash, ``& < >``
become entities, newlines spaces) and only http(s) URLs become links. Long lists are cut
(see ``MD_ROWS``), pointing to the HTML report.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
import re
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from . import charts
from .analysis import FAILING, Report, cell_label, cell_positions
from .noise import NOISY_SPREAD, is_too_noisy, relative_iqr  # the one noise measure (console, gate and report)

__all__ = ["GLYPHS", "MD_ROWS", "SKIP_LETTERS", "md_escape", "render_html", "render_markdown", "safe_url", "write_report"]

TEMPLATES = Path(__file__).with_name("templates")
#: rows per Markdown table before "... and N more"
MD_ROWS = 25
#: failure details (distinct test + signature) rendered with tracebacks in the HTML
MAX_DETAILS = 400
#: characters of each traceback shown in the HTML
TRACEBACK_CHARS = 4000
#: rows of the Markdown throughput table before "... and N more"
MD_BENCH_ROWS = 200
#: runs drawn in a benchmark's trend line (the newest ones), so a long history keeps the page small
TREND_POINTS = 30

GLYPHS = {"passed": ("", ""), "failed": ("f", "F"), "error": ("e", "E"), "xfailed": ("x", "x"),
          "xpassed": ("xp", "X"), None: ("n", "")}
#: skip reason code -> the letter shown in the grid
SKIP_LETTERS = {
    "needs-devices": "d", "needs-package": "p", "needs-multiprocess": "m", "torch-version": "v",
    "unsupported-dtype": "t", "known-limitation": "l", "opt-in": "o", "backend-unavailable": "b",
    "backend-not-selected": "c", "not-on-backend": "n", "unspecified": "s",
}


# ---------------------------------------------------------------------------- escaping helpers
_MD_SPECIAL = re.compile(r"([\\|`*_\[\]$])")


def md_escape(value: Any) -> str:
    """``value`` as inert text for a GitHub Markdown table cell or list item."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = str(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return re.sub(r"\s*[\r\n]+\s*", " ", text).strip()


def safe_url(value: Any) -> str | None:
    """``value`` when it is an http(s) URL without spaces or quotes, else None (never a link)."""
    if not isinstance(value, str):
        return None
    url = value.strip()
    if not re.match(r"\Ahttps?://[^\s\"'<>`]+\Z", url, re.IGNORECASE):
        return None
    return url


def _md_link(text: Any, url: Any) -> str:
    safe = safe_url(url)
    label = md_escape(text)
    if not safe:
        return label
    return f"[{label}](<{safe.replace('(', '%28').replace(')', '%29')}>)"


def _fmt_number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    value = float(value)
    if value == 0:
        return "0"
    prefixes = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n")]
    for scale, prefix in prefixes:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}".rstrip()
    return f"{value:.{digits}g}"


_BASE_UNITS = ("s", "B/s", "B", "FLOP/s", "1/s", "samples/s", "steps/s", "tokens/s", "items/s", "it/s")


def _quantity(value: Any, unit: str) -> str:
    """``5.03 k samples/s``, ``1.2 GB/s`` (from B/s), ``12.5 ms`` (from s); a unit that already
    has a prefix (``TFLOP/s``, ``GB/s``) keeps the number as it is: ``0.00244 TFLOP/s``."""
    if unit not in _BASE_UNITS:
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return "–"
        return f"{float(value):.3g} {unit}".strip()
    text = _fmt_number(value)
    if text == "–":
        return text
    if unit in ("s", "B/s", "B") and " " in text:  # an SI prefix joins these units
        number, prefix = text.split(" ")
        return f"{number} {prefix}{unit}"
    return f"{text} {unit}".strip()


def _pct(value: Any, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def _clean(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in row.items()} for row in frame.to_dict("records")] if not frame.empty else []


# ---------------------------------------------------------------------------- view model
def _matrix_rows(report: Report) -> list[dict[str, Any]]:
    rows = []
    for row in _records(report.matrix):
        row["pass_rate_text"] = _pct(row["pass_rate"])
        row["pass_width"] = round(100 * (row["pass_rate"] or 0))
        rows.append(row)
    return rows


def _failure_details(report: Report) -> tuple[list[dict[str, Any]], dict[tuple[str, int], int], int]:
    """Distinct failures (test id + signature), newest record first; and (test id, cell) -> detail."""
    tests = report.tests
    failing = tests[tests["outcome"].isin(FAILING)]
    if failing.empty:
        return [], {}, 0
    failing = failing.assign(_c=cell_positions(failing, report.cells), _sig=failing["signature"].fillna("(no error text)"))
    failing = failing.sort_values("start_time", ascending=False, kind="mergesort", na_position="last")
    details: list[dict[str, Any]] = []
    anchors: dict[tuple[str, int], int] = {}
    groups = failing.groupby(["test_id", "_sig"], sort=False)
    total = groups.ngroups
    # largest groups first, so the details kept under MAX_DETAILS are the most common failures
    sizes = groups.size().sort_values(ascending=False, kind="mergesort")
    for (test_id, signature) in sizes.index[:MAX_DETAILS]:
        group = groups.get_group((test_id, signature))
        first = group.iloc[0]
        index = len(details)
        traceback = first["traceback"] if isinstance(first["traceback"], str) else ""
        cut = len(traceback) > TRACEBACK_CHARS
        issue = first["known_issue"] if isinstance(first["known_issue"], str) else None
        known = report.known.get(issue) if (issue and report.known is not None) else None
        details.append({
            "id": f"f{index}",
            "test_id": test_id,
            "signature": signature,
            "message": first["message"] if isinstance(first["message"], str) else "",
            "issue": issue,
            "issue_url": safe_url(known.url) if known else None,
            "count": len(group),
            "cells": [cell_label(*report.cells[int(c)]) for c in sorted(set(group["_c"]))],
            "traceback": (traceback[:TRACEBACK_CHARS] + f"\n... [{len(traceback) - TRACEBACK_CHARS} more characters in the results file]") if cut else traceback,
            "nodeid": first["nodeid"],
            "source": first["source"],
        })
        for position in group["_c"]:
            anchors.setdefault((test_id, int(position)), index)
    return details, anchors, total


#: flaky tests listed in the report (flakiest first; the history holds the rest)
MAX_FLAKY = 50


def _history_view(report: Report) -> dict[str, Any]:
    """Flaky tests and, per failing test, where its current failing streak began (from a run history)."""
    flaky = report.flakiness[report.flakiness["flaky"]] if not report.flakiness.empty else report.flakiness
    first = {}
    for row in _records(report.first_failed):
        text = (f"{cell_label(row['backend'], row['torch_version'], row['accel_version'])}: first failed in run "
                f"{row['first_failed_run']}" + (f" ({row['first_failed_time']})" if row.get("first_failed_time") else "")
                + f", {row['streak']} run{'s' if row['streak'] != 1 else ''} in a row; "
                + (f"last passed in run {row['last_passed_run']}" if row.get("last_passed_run") else "never passed in the history"))
        first.setdefault(row["test_id"], []).append(text)
    flaky_rows = [{**row, "cell": cell_label(row["backend"], row["torch_version"], row["accel_version"])}
                  for row in _records(flaky.head(MAX_FLAKY))]
    return {"active": not report.flakiness.empty or not report.first_failed.empty, "flaky": flaky_rows,
            "flaky_total": len(flaky), "first_failed": first, "first_failed_count": len(report.first_failed)}


def _grid_rows(report: Report, anchors: dict[tuple[str, int], int]) -> tuple[list[dict[str, Any]], list[str]]:
    grid = report.grid
    if grid.empty:
        return [], []
    columns = list(range(len(report.cells)))
    values = grid[columns].to_numpy()
    flaky_col = grid["flaky"].tolist()
    # known-issue failures: (test id, cell) pairs whose latest record carries an issue
    tests = report.tests
    tracked = tests[tests["outcome"].isin(FAILING) & tests["known_issue"].notna()]
    tracked_pairs = set(zip(tracked["test_id"], cell_positions(tracked, report.cells))) if not tracked.empty else set()
    skip_codes = _skip_codes(report)
    rows, all_passing = [], []
    for test_id, outcomes, flaky in zip(grid.index, values, flaky_col):
        ran = [o for o in outcomes if isinstance(o, str)]
        if all(o == "passed" for o in ran) and not flaky:
            all_passing.append(test_id)
            continue
        cells = []
        failing = False
        for position, outcome in enumerate(outcomes):
            outcome = outcome if isinstance(outcome, str) else None
            css, glyph = GLYPHS.get(outcome, ("n", "?"))
            link = None
            if outcome in FAILING:
                failing = True
                if (test_id, position) in tracked_pairs:
                    css, glyph = "k", "K" if outcome == "failed" else "E"
                if (test_id, position) in anchors:
                    link = f"f{anchors[(test_id, position)]}"
            elif outcome == "skipped":
                css, glyph = "s", SKIP_LETTERS.get(skip_codes.get((test_id, position), "unspecified"), "s")
            if flaky and position in flaky:
                css = (css + " fl").strip()
            cells.append((css, glyph, link))
        rows.append({"id": test_id, "cells": cells, "failing": failing, "flaky": bool(flaky)})
    return rows, all_passing


def _version_sort_key(text: Any) -> tuple:
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(str(text)), "")
    except InvalidVersion:
        return (1, Version("0"), str(text))


def _slug(text: Any) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")


# ---------------------------------------------------------------------------- pass rates (vendor table)
_OUTCOME_GROUPS = (("passed", ("passed",), "ok"), ("failed", ("failed", "error"), "bad"),
                   ("skipped", ("skipped",), "skip"), ("xfail/xpass", ("xfailed", "xpassed"), "xf"))


def _cell_counts(report: Report) -> list[dict[str, Any]]:
    """Per cell: the latest outcome of each test there (the grid), counted by outcome."""
    grid = report.grid
    out = []
    for position, cell in enumerate(report.cells):
        counts = grid[position].value_counts() if position in grid.columns else pd.Series(dtype=int)
        row = {o: int(counts.get(o, 0)) for o in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")}
        executed = row["passed"] + row["failed"] + row["error"]
        row.update(backend=cell[0], torch_version=cell[1], accel_version=cell[2], label=cell_label(*cell),
                   executed=executed, tests=sum(row[o] for o in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")),
                   pass_rate=row["passed"] / executed if executed else None)
        out.append(row)
    return out


def _rate_class(rate: Any) -> str:
    if rate is None:
        return "r-none"
    return "r-ok" if rate >= 0.999 else ("r-warn" if rate >= 0.95 else "r-bad")


def _pass_rate_series(tests: pd.DataFrame) -> dict[tuple, list[tuple[str, float]]]:
    """Per cell (backend, torch, accel version): each run's pass rate, oldest first (the cell's trend)."""
    if tests.empty:
        return {}
    executed = tests[tests["outcome"].isin(("passed", "failed", "error"))]
    if executed.empty:
        return {}
    frame = executed.assign(_passed=executed["outcome"].eq("passed"), _when=executed["start_time"].fillna("").astype(str))
    per_run = frame.groupby(["backend", "torch_version", "accel_version", "run_id", "_when"], sort=False)["_passed"].mean()
    series: dict[tuple, list[tuple[str, float]]] = {}
    for (backend, torch_version, accel_version, run_id, when), rate in sorted(per_run.items(), key=lambda kv: kv[0][4]):
        series.setdefault((backend, torch_version, accel_version), []).append((f"{when} {run_id}", float(rate)))
    return series


def _pass_rate_view(report: Report) -> dict[str, Any]:
    """The backend × torch-version pass-rate tables vendors publish (one per accel version or
    upstream subject, newest first) and the pass/fail chart, from the latest result of each test."""
    cells = _cell_counts(report)
    if not cells:
        return {"tables": [], "chart": None}
    tables = []
    trends = _pass_rate_series(report.tests)
    # accel's own versions newest first, then upstream subjects ("accelerate 1.15.0 tests → accel 0.1.0") by name
    found = {c["accel_version"] for c in cells}
    own = sorted((v for v in found if _version_sort_key(v)[0] == 0), key=_version_sort_key, reverse=True)
    versions = own + sorted((v for v in found if _version_sort_key(v)[0] != 0), key=str)
    for accel_version in versions:
        mine = [c for c in cells if c["accel_version"] == accel_version]
        torches = sorted({c["torch_version"] for c in mine}, key=_version_sort_key)
        backends = sorted({c["backend"] for c in mine}, key=str)
        by_key = {(c["backend"], c["torch_version"]): c for c in mine}
        rows = []
        for backend in backends:
            entries = []
            for torch_version in torches:
                cell = by_key.get((backend, torch_version))
                if cell is None:
                    entries.append(None)
                    continue
                points = trends.get((backend, torch_version, accel_version), [])[-TREND_POINTS:]
                entries.append({**cell, "rate_text": _pct(cell["pass_rate"]), "cls": _rate_class(cell["pass_rate"]),
                                "failing": cell["failed"] + cell["error"], "runs": len(points),
                                "trend": charts.trend(points, fmt=_pct, width=110, height=24, what="pass rate")
                                if len(points) > 1 else ""})
            rows.append({"backend": backend, "cells": entries})
        label = str(accel_version) if " " in str(accel_version) else f"accel {accel_version}"
        tables.append({"accel_version": accel_version, "label": label, "torch_versions": torches, "rows": rows})
    chart_rows = [(c["label"], [sum(c[o] for o in outcomes) for _, outcomes, _ in _OUTCOME_GROUPS]) for c in cells]
    chart = charts.stacked_bars(chart_rows, [(name, css) for name, _, css in _OUTCOME_GROUPS],
                                title="latest outcome of each test per cell")
    return {"tables": tables, "chart": chart}


# ---------------------------------------------------------------------------- environment block
def _join_map(value: Any) -> str:
    """``{"cuda": "550.54"}`` -> ``550.54``; with several backends ``cuda: 550.54; xpu: 1.3``."""
    if isinstance(value, dict):
        items = [(k, v) for k, v in value.items() if v not in (None, "", [], {})]
        if len(value) == 1 and items:
            return str(items[0][1])
        return "; ".join(f"{k}: {v}" for k, v in items)
    return "" if value is None else str(value)


#: environment columns: (key, heading); the runs frame's column when it has one, else the header's
_ENV_FIELDS = (("host", "host"), ("os", "OS"), ("kernel", "kernel"), ("python", "Python"), ("backends", "backends"),
               ("devices", "devices"), ("driver_versions", "driver"), ("runtime_versions", "runtime"),
               ("torch", "torch"), ("accel_version", "accel"), ("git_commit", "git commit"))


def _benchmark_environments(benchmarks: pd.DataFrame) -> list[dict[str, Any]]:
    """Environment rows from the machine and commit each pytest-benchmark file recorded (kept in
    the rows by the loader), for a report of benchmarks only: harness runs carry a fuller header."""
    rows = []
    for _, group in benchmarks.groupby("source", sort=True, dropna=False):
        env = next((e for e in group["environment"] if isinstance(e, dict)), {}) if "environment" in group else {}

        def text(key: str) -> str:
            value = env.get(key)
            return value if isinstance(value, str) else ""

        devices = sorted({f"{b}: {d}" for b, d in zip(group["backend"], group["device"]) if d})
        torch = sorted({str(t) for t in group["torch_version"] if t})
        accel = sorted({str(a) for a in group["accel_version"] if a})
        when = next((str(w) for w in group["datetime"] if isinstance(w, str) and w), None)
        rows.append({
            "host": text("host"), "os": text("os"), "kernel": text("kernel"), "python": text("python"),
            "backends": ", ".join(sorted({str(b) for b in group["backend"]})),
            "devices": "; ".join(devices) or text("cpu"), "driver_versions": "", "runtime_versions": "",
            "torch": ", ".join(torch), "accel_version": ", ".join(accel), "git_commit": text("git_commit"),
            "start_time": when,
        })
    return rows


def _environment_view(report: Report) -> list[dict[str, Any]]:
    """Distinct machine and software environments of the runs (OS, kernel, driver and runtime
    versions, git commit), each with its run count and time span, from what the loader kept of
    each run's header (no file is read here: a report from a run history has only the history);
    a report of benchmarks only uses the benchmark files' machine and commit information."""
    runs = report.loaded.runs
    if runs.empty:
        bench = report.loaded.benchmarks
        if bench.empty:
            return []
        return _collapse_environments(_benchmark_environments(bench))
    rows = []
    for run in _records(runs):
        def pick(key: str) -> str:
            value = run.get(key)
            return value if isinstance(value, str) else ""

        commit = pick("git_commit")
        rows.append({
            "host": pick("host"), "os": pick("os"), "kernel": pick("kernel"), "python": pick("python"),
            "backends": pick("backends"), "devices": pick("devices") or pick("device_models"),
            "driver_versions": _join_map(run.get("driver_versions")),
            "runtime_versions": _join_map(run.get("runtime_versions")),
            "torch": " ".join(v for v in (pick("torch_version"), pick("torch_build")) if v),
            "accel_version": pick("accel_version"), "git_commit": commit,
            "start_time": run.get("start_time"),
        })
    return _collapse_environments(rows)


def _collapse_environments(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per distinct environment, with its run count and first and last start time. The
    commit is not part of what makes an environment distinct (a nightly history has one per night):
    a row shows its latest run's commit and how many distinct commits its runs had."""
    envs: dict[tuple, dict[str, Any]] = {}
    for row in found:
        key = tuple(row[k] for k, _ in _ENV_FIELDS if k != "git_commit")
        start = str(row.pop("start_time", None) or "")
        entry = envs.setdefault(key, {**row, "runs": 0, "first": None, "last": None, "commits": set(), "_latest": None})
        entry["runs"] += 1
        if row["git_commit"]:
            entry["commits"].add(row["git_commit"])
            if entry["_latest"] is None or start >= entry["_latest"]:
                entry["_latest"], entry["git_commit"] = start, row["git_commit"]
        if start:
            entry["first"] = min(filter(None, (entry["first"], start)))
            entry["last"] = max(filter(None, (entry["last"], start)))
    rows = sorted(envs.values(), key=lambda r: (r["host"], r["backends"], _version_sort_key(r["torch"].split(" ")[0]), r["accel_version"]))
    for row in rows:
        row["commit_short"] = row["git_commit"][:12] if row["git_commit"] else "not recorded"
        row["commit_count"] = len(row.pop("commits"))
        row.pop("_latest")
        if row["commit_count"] > 1:
            row["commit_short"] += f" (latest of {row['commit_count']})"
        row["first_text"], row["last_text"] = _short_time(row["first"]), _short_time(row["last"])
    return rows


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


def _short_time(value: Any) -> str:
    """``2025-06-01 00:24`` from an ISO-8601 time (the text itself when it is not one)."""
    text = str(value or "")
    match = re.match(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2})", text)
    return f"{match.group(1)} {match.group(2)}" if match else text


def _problem_size(name: Any, backend: Any, dtype: Any, extra: dict[str, Any], work: Any, unit: Any) -> str:
    """What one round works on, from what the benchmark recorded: ``extra_info.sizes``, else the
    parameters in its id (backend, dtype and rank count removed), plus the work per round."""
    parts = []
    sizes = extra.get("sizes")
    if isinstance(sizes, dict) and sizes:
        parts.append(", ".join(f"{k}={_size_value(k, v)}" for k, v in sizes.items()))
        return "; ".join(parts)  # the sizes say it; the work per round would repeat them
    else:
        match = re.search(r"\[(.*)\]\s*\Z", str(name or ""))
        if match:
            drop = {str(backend).lower(), str(dtype).lower()}
            params = [p for p in match.group(1).split("-") if p and p.lower() not in drop and not re.fullmatch(r"(?:ws|ranks)\d+", p)]
            if params:
                parts.append("-".join(params))
    work_unit = extra.get("work_unit") or (str(unit).split("/")[0] if unit and "/" in str(unit) else None)
    if isinstance(work, (int, float)) and math.isfinite(work) and work > 0 and work_unit:
        parts.append(f"{_quantity(work, work_unit)}/round" if work_unit in ("B",) else f"{_fmt_number(work)} {work_unit}/round")
    return "; ".join(parts)


def _bench_history(benchmarks: pd.DataFrame) -> tuple[dict[tuple, list[tuple[str, float]]], dict[tuple, dict[str, Any]]]:
    """Per (backend, torch version, bench id): per-run medians oldest first, and the latest row."""
    if benchmarks.empty:
        return {}, {}
    ordered = benchmarks.assign(_when=benchmarks["datetime"].fillna("")).sort_values("_when", kind="mergesort")
    series: dict[tuple, list[tuple[str, float]]] = {}
    latest: dict[tuple, dict[str, Any]] = {}
    columns = ["backend", "torch_version", "bench_id", "datetime", "value", "samples", "source", "fullname", "name",
               "time_median", "throughput"] + [c for c in ("quick", "sizes", "work_unit", "work_size", "note") if c in ordered.columns]
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
                spread = relative_iqr(last.get("samples") or ())
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
            points = series.get(key, [])[-TREND_POINTS:]
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
                         "spread": spread, "spread_text": _pct(spread), "noisy": is_too_noisy(spread),
                         "note": last.get("note") if isinstance(last.get("note"), str) else "",
                         "quick": quick, "band_text": f"{fmt(band[0])} – {fmt(band[1])}" if band[0] is not None and band[1] is not None else "",
                         "history_runs": row.get("history_runs") if "history_runs" in has else len(points),
                         "status_css": _slug(status),
                         "bar": charts.value_bar(value, ref, peak, status=status, band=band, fmt=fmt),
                         "trend": charts.trend(points, band=band, ref=ref, status=status, fmt=fmt, width=120) if len(points) > 1 else ""})
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


def _diff_view(report: Report) -> dict[str, Any] | None:
    diff = report.diff
    if diff is None:
        return None
    new = _records(diff.new_failures)
    for row in new:
        row["cell"] = cell_label(row["backend"], row["torch_version"], row["accel_version"])
    untracked = [r for r in new if not r["known_issue"]]
    tracked = [r for r in new if r["known_issue"]]
    fixed = _records(diff.fixed)
    disappeared = _records(diff.disappeared)
    for row in fixed + disappeared:
        row["cell"] = cell_label(row["backend"], row["torch_version"], row["accel_version"])
    collection = _records(diff.collection)
    for row in collection:
        row["cell"] = cell_label(row["backend"], row["torch_version"], row["accel_version"])
        row["drop_text"] = f"{row['cell']}: {row['baseline']} → {row['current']} ({row['delta']:+d})" if row["dropped"] else ""
    return {
        "files": report.baseline_files,
        "new_untracked": untracked, "new_tracked": tracked, "fixed": fixed,
        "still_failing": len(diff.still_failing), "disappeared": disappeared, "new_tests": len(diff.new_tests),
        "collection": collection, "drops": [r for r in collection if r["dropped"]],
        "unmatched": diff.unmatched_cells,
    }


def _upstream_view(report: Report) -> dict[str, Any] | None:
    """The vendor table and compatibility comparisons of upstream suites (None without any)."""
    from .vendor import vendor_lines

    if report.vendor is None or report.vendor.empty:
        return None
    rows = _records(report.vendor)
    for row in rows:
        row["pass_rate_text"] = _pct(row["pass_rate"])
        for cluster in row["clusters"]:
            cluster["url"] = safe_url(cluster.get("url"))
    compat = _records(report.compat) if report.compat is not None else []
    for row in compat:
        row["share_text"] = _pct(row["share"])
    return {"rows": rows, "compat": compat, "lines": vendor_lines(report.vendor, report.compat if report.compat is not None else pd.DataFrame())}


# ---------------------------------------------------------------------------- title and verdict
def _joined(values: Iterable[Any], most: int = 3) -> str:
    """Distinct non-empty ``values`` in first-seen order, ``a, b, c +2 more`` past ``most``."""
    seen = list(dict.fromkeys(str(v) for v in values if v not in (None, "") and not (isinstance(v, float) and math.isnan(v))))
    return ", ".join(seen[:most]) + (f" +{len(seen) - most} more" if len(seen) > most else "")


def _device_models(runs: pd.DataFrame, benchmarks: pd.DataFrame) -> dict[str, list[str]]:
    """backend -> device models, from the run headers (``cpu: Intel Xeon …; cuda: H100``), else the benchmarks."""
    found: dict[str, list[str]] = {}
    for text in (runs["device_models"] if not runs.empty else ()):
        for part in str(text or "").split("; "):
            backend, sep, models = part.partition(": ")
            if sep and models:
                found.setdefault(backend, []).extend(m.strip() for m in models.split(", "))
    if not benchmarks.empty:
        for backend, device in zip(benchmarks["backend"], benchmarks["device"]):
            if isinstance(device, str) and device and str(backend) not in found:
                found.setdefault(str(backend), []).append(device)
    return found


def _report_title(report: Report) -> str:
    """The caller's title followed by what was qualified: backends with their device, torch and accel
    versions, from the run headers (the benchmark files when there are no runs)."""
    runs, bench = report.loaded.runs, report.loaded.benchmarks
    backends: list[str] = []
    for text in (runs["backends"] if not runs.empty else ()):
        backends.extend(b.strip() for b in str(text or "").split(",") if b.strip())
    if not report.tests.empty:
        backends.extend(str(b) for b in report.tests["backend"].dropna())
    if not bench.empty:
        backends.extend(str(b) for b in bench["backend"].dropna())
    models = _device_models(runs, bench)
    names = []
    for backend in dict.fromkeys(backends):
        device = _joined(models.get(backend, ()), most=2)
        names.append(f"{backend} ({device})" if device else backend)
    torch = _joined(list(runs["torch_version"]) if not runs.empty else list(bench["torch_version"]) if not bench.empty else [])
    accel = _joined(list(runs["accel_version"]) if not runs.empty else list(bench["accel_version"]) if not bench.empty else [])
    parts = [p for p in (_joined(names, most=4), f"torch {torch}" if torch else "", f"accel {accel}" if accel else "") if p]
    title = str(report.title or "").strip()
    if not parts:
        return title
    return f"{title} — {', '.join(parts)}" if title else ", ".join(parts)


#: benchmark statuses that mean no reference was there to compare with
_NOT_COMPARED = ("no reference", "quick: not compared")


def _plural(count: int, word: str, many: str | None = None) -> str:
    return f"{count} {word if count == 1 else (many or word + 's')}"


def _verdict(report: Report, bench_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The one line at the top: per backend how many tests passed, failed and were skipped (the latest
    result of each test), then the benchmarks: how many, how many too noisy to judge, and what the
    comparison found, with "no baseline" when nothing was there to compare with (never "no regressions")."""
    per_backend: dict[str, dict[str, int]] = {}
    for cell in _cell_counts(report):
        counts = per_backend.setdefault(str(cell["backend"]), dict.fromkeys(("tests", "passed", "failed", "error", "skipped", "xfailed", "xpassed"), 0))
        for key in counts:
            counts[key] += cell[key]
    parts, bad, unjudged = [], False, False
    for backend, c in per_backend.items():
        text = f"{backend}: {c['passed']}/{c['tests']} pass"
        failing = c["failed"] + c["error"]
        extras = [f"{failing} fail" if failing else "", f"{c['skipped']} skip" if c["skipped"] else "",
                  f"{c['xfailed']} xfail" if c["xfailed"] else "", f"{c['xpassed']} xpass" if c["xpassed"] else ""]
        parts.append(", ".join([text] + [e for e in extras if e]))
        bad = bad or failing > 0
    untracked = len(report.untracked_failures)
    if untracked:
        parts.append(f"{untracked} {'new ' if report.diff is not None else ''}untracked failure{'' if untracked == 1 else 's'}")
    elif report.diff is not None and per_backend:
        parts.append("no new failures against the baseline")
    if bench_rows:
        noisy = sum(1 for r in bench_rows if r["noisy"])
        text = _plural(len(bench_rows), "benchmark") + (f", {noisy} too noisy to judge" if noisy else "")
        compared = [r for r in bench_rows if r["status"] not in _NOT_COMPARED]
        regressions = sum(1 for r in bench_rows if r["status"] == "regression")
        if not compared:
            text += "; no baseline"
            unjudged = True
        elif regressions:
            text += "; " + _plural(regressions, "regression")
            bad = True
        else:
            text += "; no regressions" + (f" ({len(compared)} of {len(bench_rows)} compared)" if len(compared) < len(bench_rows) else "")
        parts.append(text)
    if not parts:
        parts.append("no results")
        unjudged = True
    return {"text": "; ".join(parts), "css": "bad" if bad else ("warn" if unjudged else "ok"),
            "bench_baseline": any(r["status"] not in _NOT_COMPARED for r in bench_rows)}


# ---------------------------------------------------------------------------- per-area summary
#: skip reasons listed per area (the most common first)
AREA_SKIP_REASONS = 3


def _skip_codes(report: Report) -> dict[tuple[str, int], str]:
    """(test id, cell position) -> the reason code of its latest skip."""
    tests = report.tests
    skipped = tests[tests["outcome"] == "skipped"] if not tests.empty else tests
    codes: dict[tuple[str, int], str] = {}
    if not skipped.empty:
        for test_id, position, code in zip(skipped["test_id"], cell_positions(skipped, report.cells), skipped["reason_code"]):
            codes[(test_id, int(position))] = code if isinstance(code, str) and code else "unspecified"
    return codes


def _area_view(report: Report, skip_codes: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    """Per feature area (:mod:`accel_reports.areas`): the latest outcome of each test in each cell,
    counted, with the most common skip reasons (code and count)."""
    from .areas import AREA_ORDER, area_of

    grid = report.grid
    if grid.empty:
        return []
    columns = list(range(len(report.cells)))
    areas: dict[str, dict[str, Any]] = {}
    for test_id, outcomes in zip(grid.index, grid[columns].to_numpy()):
        # "tests" counts results (a test in each cell), so the columns add up across backends
        area = areas.setdefault(area_of(test_id), {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "xfail": 0, "reasons": {}})
        for position, outcome in enumerate(outcomes):
            if not isinstance(outcome, str):
                continue
            area["tests"] += 1
            if outcome == "passed":
                area["passed"] += 1
            elif outcome in FAILING:
                area["failed"] += 1
            elif outcome == "skipped":
                area["skipped"] += 1
                code = skip_codes.get((test_id, position), "unspecified")
                area["reasons"][code] = area["reasons"].get(code, 0) + 1
            else:
                area["xfail"] += 1
    rows = []
    for name in sorted(areas, key=lambda a: (AREA_ORDER.index(a) if a in AREA_ORDER else len(AREA_ORDER), a)):
        area = areas[name]
        reasons = sorted(area.pop("reasons").items(), key=lambda kv: (-kv[1], kv[0]))
        executed = area["passed"] + area["failed"]
        rows.append({**area, "area": name, "tests": area["tests"],
                     "css": "r-bad" if area["failed"] else ("r-ok" if area["passed"] else "r-none"),
                     "pass_rate_text": _pct(area["passed"] / executed) if executed else "–",
                     "reasons": [{"code": c, "count": n, "letter": SKIP_LETTERS.get(c, "s")} for c, n in reasons[:AREA_SKIP_REASONS]],
                     "more_reasons": len(reasons) - AREA_SKIP_REASONS if len(reasons) > AREA_SKIP_REASONS else 0})
    return rows


# ---------------------------------------------------------------------------- paths
def _shown_path(path: Any, base: Path) -> str:
    """``path`` relative to the report folder ``base`` (``../results/run.jsonl``): a report that is
    moved with its inputs still names them, and no local absolute path is written into it."""
    text = str(path or "")
    if not text or "://" in text:
        return text
    import os

    try:
        return Path(os.path.relpath(os.path.abspath(text), base)).as_posix()
    except ValueError:  # another drive (Windows): the file name is all that can be shown
        return Path(text).name


def _path_scrubber(base: Path):
    """A function that replaces the absolute local folders found in free text (tracebacks, messages)
    with their place relative to the report folder ``base``, or ``<python>`` / ``~`` for the Python
    installation and the home folder."""
    import os
    import sys

    roots: list[tuple[str, str]] = []
    # the working folder (where the suites ran, as a rule) is left out: its files read as the suites name them
    for folder, label in ((os.getcwd(), ""), (str(base), "./"), (sys.prefix, "<python>/"), (sys.base_prefix, "<python>/"),
                          (os.path.expanduser("~"), "~/")):
        folder = os.path.abspath(folder)
        if len(folder) > 1:
            roots.append((folder.rstrip(os.sep) + os.sep, label))
    roots.sort(key=lambda r: -len(r[0]))  # the deepest folder first
    pattern = re.compile("|".join(re.escape(folder) for folder, _ in roots)) if roots else None
    replacement = dict(roots)

    def scrub(value: Any) -> Any:
        if not isinstance(value, str) or pattern is None:
            return value
        return pattern.sub(lambda m: replacement[m.group(0)], value)


    return scrub


def _present(rows: list[dict[str, Any]], key: str, empty: tuple = ("", "–", None)) -> bool:
    """Whether any row has a value for ``key`` (a column with none is left out of the table)."""
    return any(row.get(key) not in empty for row in rows)


def _context(report: Report, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Everything the templates show; file names are relative to ``out_dir`` (the report folder; the
    working folder when None) and local folders in free text are shortened (:func:`_path_scrubber`)."""
    import os

    base = Path(os.path.abspath(out_dir if out_dir is not None else os.getcwd()))
    scrub = _path_scrubber(base)
    details, anchors, total_details = _failure_details(report)
    for detail in details:
        detail["source"] = _shown_path(detail["source"], base)
        for key in ("traceback", "message", "signature", "nodeid", "test_id"):
            detail[key] = scrub(detail[key])
    grid_rows, all_passing = _grid_rows(report, anchors)
    clusters = _records(report.clusters)
    for row in clusters:
        row["url"] = safe_url(row["url"])
        row["share_text"] = _pct(row["share"])
    sig_clusters = _records(report.signature_clusters)
    for row in sig_clusters:
        row["share_text"] = _pct(row["share"])
    known_passing = _records(report.known_passing)
    for row in known_passing:
        row["url"] = safe_url(row["url"])
    skips = _records(report.skips)
    for row in skips:
        row["letter"] = SKIP_LETTERS.get(row["reason_code"], "s")
    runs = _records(report.loaded.runs)
    for run in runs:
        run["source"] = _shown_path(run["source"], base)
    for row in clusters + sig_clusters:
        for key in ("key", "message", "signature"):
            if key in row:
                row[key] = scrub(row[key])
    for row in skips:
        row["messages"] = [(scrub(m), n) for m, n in (row.get("messages") or [])]
    bench_view = _benchmark_view(report)
    history_view = _history_view(report)
    for detail in details:
        detail["first_failed"] = history_view["first_failed"].get(detail["test_id"], [])
    untracked = report.untracked_failures
    totals = {o: int(report.matrix[o].sum()) if not report.matrix.empty else 0 for o in ("tests", "passed", "failed", "error", "skipped", "xfailed", "xpassed")}
    executed = totals["passed"] + totals["failed"] + totals["error"]
    environment = _environment_view(report)
    diff_view = _diff_view(report)
    if diff_view is not None:
        diff_view["files"] = [_shown_path(f, base) for f in diff_view["files"]]
    return {
        "title": _report_title(report),
        "verdict": _verdict(report, bench_view["rows"]),
        "areas": _area_view(report, _skip_codes(report)),
        "generated": report.generated,
        "runs": runs,
        "run_cols": {k: _present(runs, k) for k in ("format", "torch_build", "host", "device_models", "start_time")},
        "files": [_shown_path(f, base) for f in report.loaded.files],
        "totals": totals,
        "total_pass_rate": _pct(totals["passed"] / executed) if executed else "–",
        "matrix": _matrix_rows(report),
        "headline": report.headline,
        "headline_url": clusters[0]["url"] if clusters and clusters[0]["kind"] == "known issue" else None,
        "clusters": clusters,
        "sig_clusters": sig_clusters,
        "skips": skips,
        "skip_letters": [(letter, code) for code, letter in SKIP_LETTERS.items()],
        "known_passing": known_passing,
        "diff": diff_view,
        "bench": bench_view,
        "pass_rates": _pass_rate_view(report),
        "environment": environment,
        # the environment table's columns that some row has a value for (the commit has its own column)
        "env_columns": [(k, h) for k, h in _ENV_FIELDS if k != "git_commit" and _present(environment, k)],
        "quick_run": bench_view["quick"],
        "threshold": report.threshold,
        "noisy_spread": NOISY_SPREAD,
        "trend_points": TREND_POINTS,
        "cells": [{"label": cell_label(*c), "short": f"{c[0]} {c[1]}" + ((f" {c[2]}" if " " in str(c[2]) else f" a{c[2]}") if c[2] not in ("unknown", None) else "")} for c in report.cells],
        "grid": grid_rows,
        "all_passing": all_passing,
        "details": details,
        "details_total": total_details,
        "history": history_view,
        "problems": [{"path": _shown_path(p.path, base), "line": p.line, "message": scrub(p.message), "kind": getattr(p, "kind", "invalid")}
                     for p in report.problems],
        "untracked_count": len(untracked),
        "untracked_examples": sorted(set(untracked["test_id"]))[:5] if len(untracked) else [],
        "regression_count": len(report.regressions),
        "suspect_count": len(bench_view["suspect"]),
        "has_baseline": report.diff is not None,
        "interrupted": [r["run_id"] for r in runs if r["interrupted"]],
        "upstream": _upstream_view(report),
    }


# ---------------------------------------------------------------------------- rendering
_SCRIPT = (TEMPLATES / "report.js").read_text(encoding="utf-8") if (TEMPLATES / "report.js").exists() else ""


@functools.lru_cache(maxsize=2)
def _environment(html: bool):
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=html,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["md"] = md_escape
    env.filters["mdlink"] = _md_link
    env.filters["pct"] = _pct
    env.globals["MD_ROWS"] = MD_ROWS
    env.globals["MD_BENCH_ROWS"] = MD_BENCH_ROWS
    return env


def render_html(report: Report, context: dict[str, Any] | None = None, out_dir: str | Path | None = None) -> str:
    """The report as one self-contained HTML page (``context``: from a previous render, reused;
    ``out_dir``: the folder it goes to, which file names are written relative to)."""
    from markupsafe import Markup

    script = _SCRIPT
    if "</" in script:
        raise RuntimeError("the report script must not contain '</'")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    template = _environment(html=True).get_template("report.html.j2")
    return template.render(**(context or _context(report, out_dir)), script=Markup(script), script_hash=digest)


def render_markdown(report: Report, context: dict[str, Any] | None = None, out_dir: str | Path | None = None) -> str:
    """The report's summary as GitHub-flavoured Markdown (``out_dir`` as for :func:`render_html`)."""
    template = _environment(html=False).get_template("report.md.j2")
    return template.render(**(context or _context(report, out_dir)))


def write_report(report: Report, out_dir: str | Path, formats: Iterable[str] = ("html", "md")) -> dict[str, Path]:
    """Write ``report.html`` and/or ``report.md`` into ``out_dir``; returns format -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    formats = list(formats)
    unknown = [f for f in formats if f not in ("html", "md")]
    if unknown:
        raise ValueError(f"unknown report format {unknown[0]!r} (html, md)")
    context = _context(report, out)
    written = {}
    for fmt in formats:
        text = render_html(report, context) if fmt == "html" else render_markdown(report, context)
        written[fmt] = _write_atomic(out / ("report.html" if fmt == "html" else "report.md"), text)
    return written


def _write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` beside ``path`` and rename it over ``path``: a crash leaves the previous file or
    none, never a half-written one (:func:`accel.utils.files.atomic_write`)."""
    from accel.utils.files import atomic_write

    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8", newline=""), keep_mode=0o644)
