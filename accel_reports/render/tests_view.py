"""The report's test views (part of :mod:`accel_reports.render.report`): the summary matrix, the per-test
grid and failure details, pass-rate tables, the baseline diff, upstream suites, the title, the verdict
line and the per-area table. Each function turns a :class:`~accel_reports.analyse.analysis.Report` into plain
rows for the templates."""

from __future__ import annotations

from typing import Any

import pandas as pd

from accel.facts.reasons import UNSPECIFIED

from . import charts
from . import text as _text
from ..analyse.analysis import FAILING, Report, cell_label, cell_positions
from .text import (GLYPHS, SKIP_LETTERS, _joined, _pct, _plural, _records, _version_sort_key, safe_url)

#: failure details (distinct test + signature) rendered with tracebacks in the HTML
MAX_DETAILS = 400
#: characters of each traceback shown in the HTML
TRACEBACK_CHARS = 4000


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
            "expired_issue": first["expired_issue"] if isinstance(first["expired_issue"], str) else None,
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
    from .evidence_view import flaky_keys

    measured: dict[str, set[int]] = {}  # failures whose re-runs or history call them flaky
    for (backend, torch_version, accel_version, test_id) in flaky_keys(report):
        if (backend, torch_version, accel_version) in report.cells:
            measured.setdefault(test_id, set()).add(report.cells.index((backend, torch_version, accel_version)))
    rows, all_passing = [], []
    for test_id, outcomes, flaky in zip(grid.index, values, flaky_col):
        if test_id in measured:
            flaky = sorted(set(flaky or ()) | measured[test_id])
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
                css, glyph = "s", SKIP_LETTERS.get(skip_codes.get((test_id, position), UNSPECIFIED), "s")
            if flaky and position in flaky:
                css = (css + " fl").strip()
            cells.append((css, glyph, link))
        rows.append({"id": test_id, "cells": cells, "failing": failing, "flaky": bool(flaky)})
    return rows, all_passing


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
                points = trends.get((backend, torch_version, accel_version), [])[-_text.TREND_POINTS:]
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


def _diff_view(report: Report) -> dict[str, Any] | None:
    diff = report.diff
    if diff is None:
        return None
    new = _records(diff.new_failures)
    for row in new:
        row["cell"] = cell_label(row["backend"], row["torch_version"], row["accel_version"])
    from .evidence_view import flaky_keys, flaky_text

    flaky = flaky_keys(report)
    for row in new:
        key = (row["backend"], row["torch_version"], row["accel_version"], row["test_id"])
        row["flaky"] = flaky_text(flaky[key]) if key in flaky else ""
    untracked = [r for r in new if not r["known_issue"] and not r["flaky"]]
    tracked = [r for r in new if r["known_issue"] and not r["flaky"]]
    flaky_rows = [r for r in new if r["flaky"]]
    fixed = _records(diff.fixed)
    disappeared = _records(diff.disappeared)
    for row in fixed + disappeared:
        row["cell"] = cell_label(row["backend"], row["torch_version"], row["accel_version"])
    collection = _records(diff.collection)
    for row in collection:
        row["cell"] = cell_label(row["backend"], row["torch_version"], row["accel_version"])
        row["drop_text"] = (f"{row['cell']}: {row['baseline']} → {row['current']} ({row['delta']:+d}, "
                            f"{row['drop_share']:.1%} of the baseline's tests)") if row["dropped"] else ""
    return {
        "files": report.baseline_files,
        "new_untracked": untracked, "new_tracked": tracked, "new_flaky": flaky_rows, "fixed": fixed,
        "collection_threshold": report.collection_threshold,
        "still_failing": len(diff.still_failing), "disappeared": disappeared, "new_tests": len(diff.new_tests),
        "collection": collection, "drops": [r for r in collection if r["dropped"]],
        "unmatched": diff.unmatched_cells,
    }


def _upstream_view(report: Report) -> dict[str, Any] | None:
    """The vendor table and compatibility comparisons of upstream suites (None without any)."""
    from ..analyse.vendor import vendor_lines

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


def _verdict(report: Report, bench_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The one line at the top, verdict first: "qualified on B" (green) when no test failed and nothing
    stopped the run from being judged, "not qualified on B" (red) with failures or regressions, "not
    concluded on B" (orange) with flaky failures, expired known issues, an unfair baseline, input
    problems, runs cut short or no test results. Then per backend how many tests passed, failed and
    were skipped (the latest result of each test), the failures not covered by a known issue, and the
    benchmarks: how many, how many too noisy to judge, and what the comparison found, with "no
    baseline" when nothing was there to compare with (never "no regressions"; not a failure)."""
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
        parts.append(f"{untracked} {'new ' if report.diff is not None else ''}failure{'' if untracked == 1 else 's'} "
                     "not covered by a known issue")
    elif report.diff is not None and per_backend:
        parts.append("no new failures against the baseline")
    if not report.flaky.empty:
        parts.append(f"{len(report.flaky)} flaky (not counted as new failures)")
        unjudged = True
    expired = report.expired
    if not expired.empty:
        parts.append(f"{_plural(len(expired), 'expired known issue')} ({'its' if len(expired) == 1 else 'their'} "
                     "failures count as not covered)")
        unjudged = True
    unfair = [n for n in report.comparison if not n["fair"]]
    if unfair:
        parts.append("comparison with the baseline not like for like ("
                     + "; ".join(dict.fromkeys(f"{n['backend']}: {n['what']}" for n in unfair)) + ")")
        unjudged = True
    if bench_rows:
        noisy = sum(1 for r in bench_rows if r["noisy"])
        text = _plural(len(bench_rows), "benchmark") + (f", {noisy} too noisy to judge" if noisy else "")
        compared = [r for r in bench_rows if r["status"] not in _NOT_COMPARED]
        regressions = sum(1 for r in bench_rows if r["status"] == "regression")
        if not compared:
            text += "; no baseline"
        elif regressions:
            text += "; " + _plural(regressions, "regression")
            bad = True
        else:
            text += "; no regressions" + (f" ({len(compared)} of {len(bench_rows)} compared)" if len(compared) < len(bench_rows) else "")
        parts.append(text)
    problems = [p for p in report.problems if getattr(p, "kind", "invalid") != "note"]
    if problems:
        parts.append(_plural(len(problems), "input problem"))
        unjudged = True
    runs = report.loaded.runs
    cut = int(runs["interrupted"].fillna(False).astype(bool).sum()) if "interrupted" in runs and not runs.empty else 0
    if cut:
        parts.append(f"{_plural(cut, 'run')} cut short")
        unjudged = True
    if not per_backend:
        parts.append("no test results")
        unjudged = True
    # the verdict first, in words: nothing failed -> qualified (a first run without a benchmark baseline,
    # or benchmarks too noisy to judge, are said in the line but fail nothing)
    named = list(per_backend) or list(dict.fromkeys(str(r["backend"]) for r in bench_rows))
    on = f" on {', '.join(named)}" if named else ""
    verdict = f"not qualified{on}" if bad else (f"not concluded{on}" if unjudged else f"qualified{on}")
    return {"text": f"{verdict} — " + "; ".join(parts), "css": "bad" if bad else ("warn" if unjudged else "ok"),
            "qualified": not bad and not unjudged, "verdict": verdict,
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
            codes[(test_id, int(position))] = code if isinstance(code, str) and code else UNSPECIFIED
    return codes


def _area_view(report: Report, skip_codes: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    """Per feature area (:mod:`accel_reports.analyse.areas`): the latest outcome of each test in each cell,
    counted, with the most common skip reasons (code and count)."""
    from ..analyse.areas import AREA_ORDER, area_of

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
                code = skip_codes.get((test_id, position), UNSPECIFIED)
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
