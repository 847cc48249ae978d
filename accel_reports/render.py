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

from .analysis import FAILING, Report, cell_label, cell_positions

__all__ = ["GLYPHS", "MD_ROWS", "SKIP_LETTERS", "md_escape", "render_html", "render_markdown", "safe_url", "write_report"]

TEMPLATES = Path(__file__).with_name("templates")
#: rows per Markdown table before "... and N more"
MD_ROWS = 25
#: failure details (distinct test + signature) rendered with tracebacks in the HTML
MAX_DETAILS = 400
#: characters of each traceback shown in the HTML
TRACEBACK_CHARS = 4000

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
    skipped = tests[tests["outcome"] == "skipped"]
    skip_codes = {}
    if not skipped.empty:
        for test_id, position, code in zip(skipped["test_id"], cell_positions(skipped, report.cells), skipped["reason_code"]):
            skip_codes[(test_id, int(position))] = code or "unspecified"
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


def _svg_bars(title: str, items: list[tuple[str, float, str]], unit: str, highlight: Iterable[str] = ()) -> dict[str, Any]:
    """Geometry for a horizontal bar chart (the template writes the SVG elements)."""
    highlight = set(highlight)
    peak = max((v for _, v, _ in items if v is not None and math.isfinite(v)), default=0.0) or 1.0
    bar_h, gap, label_w, bar_w = 16, 4, 230, 420
    bars = []
    for i, (label, value, status) in enumerate(items):
        width = 0 if value is None or not math.isfinite(value) else max(1, round(bar_w * value / peak))
        bars.append({"y": i * (bar_h + gap), "label": label, "width": width, "x": label_w, "text": _quantity(value, unit),
                     "cls": "bad" if label in highlight or status == "regression" else ("good" if status == "improvement" else "")})
    return {"title": title, "bars": bars, "height": len(items) * (bar_h + gap) + 4, "width": label_w + bar_w + 120,
            "label_w": label_w, "bar_h": bar_h}


def _benchmark_view(report: Report) -> dict[str, Any]:
    table = report.bench_table
    if table.empty:
        return {"tables": [], "summary": [], "charts": [], "regressions": [], "host_drift": []}
    tables = []
    for (backend, torch_version), group in table.groupby(["backend", "torch_version"], sort=True):
        rows = []
        for row in _records(group):
            row["ref_n"] = int(row["ref_n"]) if row["ref_n"] is not None else None
            rows.append({**row, "value_text": _quantity(row["value"], row["unit"]), "ref_text": _quantity(row["ref_value"], row["unit"]),
                         "change_text": _pct(row["change"], signed=True), "speedup_text": f"{row['speedup']:.3f}×" if row["speedup"] else "–",
                         "p_text": f"{row['p_value']:.2g}" if row["p_value"] is not None else "–",
                         "host_text": _pct(row.get("host_change"), signed=True),
                         "vs_host_text": _pct(row.get("adjusted_change"), signed=True),
                         "direction": "higher is better" if row["higher_is_better"] else "lower is better"})
        tables.append({"backend": backend, "torch_version": torch_version, "rows": rows})
    summary = []
    for row in _records(report.bench_summary):
        row["geomean_text"] = f"{row['geomean_speedup']:.3f}×" if row["geomean_speedup"] else "–"
        summary.append(row)
    charts = []
    for (bench_id, unit), group in table.groupby(["bench_id", "unit"], sort=True):  # one chart compares backends
        items = [(f"{b} · torch {t}", v, s) for b, t, v, s in zip(group["backend"], group["torch_version"], group["value"], group["status"])]
        name = str(bench_id).rsplit("::", 1)[-1]
        charts.append(_svg_bars(f"{name} ({unit}, {'higher' if group['higher_is_better'].iloc[0] else 'lower'} is better)", items, unit))
    regressions = [r for t in tables for r in t["rows"] if r["status"] == "regression"]
    drift = [r for t in tables for r in t["rows"] if r["status"] == "host drift"]
    return {"tables": tables, "summary": summary, "charts": charts, "regressions": regressions, "host_drift": drift}


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


def _context(report: Report) -> dict[str, Any]:
    details, anchors, total_details = _failure_details(report)
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
    untracked = report.untracked_failures
    totals = {o: int(report.matrix[o].sum()) if not report.matrix.empty else 0 for o in ("tests", "passed", "failed", "error", "skipped", "xfailed", "xpassed")}
    executed = totals["passed"] + totals["failed"] + totals["error"]
    return {
        "title": report.title,
        "generated": report.generated,
        "runs": runs,
        "files": report.loaded.files,
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
        "diff": _diff_view(report),
        "bench": _benchmark_view(report),
        "threshold": report.threshold,
        "cells": [{"label": cell_label(*c), "short": f"{c[0]} {c[1]}" + ((f" {c[2]}" if " " in str(c[2]) else f" a{c[2]}") if c[2] not in ("unknown", None) else "")} for c in report.cells],
        "grid": grid_rows,
        "all_passing": all_passing,
        "details": details,
        "details_total": total_details,
        "problems": [{"path": p.path, "line": p.line, "message": p.message} for p in report.problems],
        "untracked_count": len(untracked),
        "untracked_examples": sorted(set(untracked["test_id"]))[:5] if len(untracked) else [],
        "regression_count": len(report.regressions),
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
    return env


def render_html(report: Report, context: dict[str, Any] | None = None) -> str:
    """The report as one self-contained HTML page (``context``: from a previous render, reused)."""
    from markupsafe import Markup

    script = _SCRIPT
    if "</" in script:
        raise RuntimeError("the report script must not contain '</'")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    template = _environment(html=True).get_template("report.html.j2")
    return template.render(**(context or _context(report)), script=Markup(script), script_hash=digest)


def render_markdown(report: Report, context: dict[str, Any] | None = None) -> str:
    """The report's summary as GitHub-flavoured Markdown."""
    template = _environment(html=False).get_template("report.md.j2")
    return template.render(**(context or _context(report)))


def write_report(report: Report, out_dir: str | Path, formats: Iterable[str] = ("html", "md")) -> dict[str, Path]:
    """Write ``report.html`` and/or ``report.md`` into ``out_dir``; returns format -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    formats = list(formats)
    unknown = [f for f in formats if f not in ("html", "md")]
    if unknown:
        raise ValueError(f"unknown report format {unknown[0]!r} (html, md)")
    context = _context(report)
    written = {}
    for fmt in formats:
        if fmt == "html":
            path = out / "report.html"
            path.write_text(render_html(report, context), encoding="utf-8")
        else:
            path = out / "report.md"
            path.write_text(render_markdown(report, context), encoding="utf-8")
        written[fmt] = path
    return written
