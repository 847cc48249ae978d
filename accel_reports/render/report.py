"""Render a :class:`accel_reports.analyse.analysis.Report` as one self-contained HTML file and as Markdown.

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

The views are built in :mod:`accel_reports.render.tests_view` (tests, verdict, areas),
:mod:`accel_reports.render.bench_view` (benchmarks), :mod:`accel_reports.render.env_view` (environment and
paths), :mod:`accel_reports.render.evidence_view` (fingerprints, profile coverage, expired known issues,
flaky tests) and :mod:`accel_reports.render.ops_view` (operator sweeps: the Operators section, and the
per-test tables without their rows); this module puts them together and writes the files.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from pathlib import Path
from typing import Any, Iterable

from . import text as _text
from ..analyse.analysis import Report, cell_label
from ..analyse.noise import NOISY_SPREAD
from .bench_view import _benchmark_view
from .compile_view import compile_view
from .env_view import _ENV_FIELDS, _environment_view, _path_scrubber, _shown_path
from .evidence_view import evidence_context, flaky_keys, flaky_text
from .models_view import models_view
from .ops_view import headline_with_operators, operators_view, support_csv, without_operators
from .support_matrix import write_support_matrix
from .tests_view import (_area_view, _diff_view, _failure_details, _grid_rows, _history_view, _matrix_rows,
                         _pass_rate_view, _report_title, _skip_codes, _upstream_view, _verdict)
from .text import GLYPHS, SKIP_LETTERS, TREND_POINTS, _md_link, _pct, _present, _records, md_escape, safe_url

__all__ = ["GLYPHS", "MD_ROWS", "SKIP_LETTERS", "TREND_POINTS", "md_code", "md_escape", "render_html", "render_markdown", "safe_url",
           "write_report"]

TEMPLATES = Path(__file__).with_name("templates")
#: rows per Markdown table before "... and N more"
MD_ROWS = 25
#: rows of the Markdown throughput table before "... and N more"
MD_BENCH_ROWS = 200


def _context(report: Report, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Everything the templates show; file names are relative to ``out_dir`` (the report folder; the
    working folder when None) and local folders in free text are shortened (:func:`_path_scrubber`)."""
    import os

    base = Path(os.path.abspath(out_dir if out_dir is not None else os.getcwd()))
    scrub = _path_scrubber(base)
    ops = operators_view(report)
    generic = without_operators(report)  # the per-test tables: an operator sweep's rows are summarised apart
    details, anchors, total_details = _failure_details(generic)
    for detail in details:
        detail["source"] = _shown_path(detail["source"], base)
        for key in ("traceback", "message", "signature", "nodeid", "test_id"):
            detail[key] = scrub(detail[key])
    grid_rows, all_passing = _grid_rows(generic, anchors)
    clusters = _records(generic.clusters)
    for row in clusters:
        row["url"] = safe_url(row["url"])
        row["share_text"] = _pct(row["share"])
    sig_clusters = _records(generic.signature_clusters)
    for row in sig_clusters:
        row["share_text"] = _pct(row["share"])
    known_passing = _records(report.known_passing)
    for row in known_passing:
        row["url"] = safe_url(row["url"])
    skips = _records(generic.skips)
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
    evidence = evidence_context(report)
    for fact in evidence["run_facts"]["rows"]:  # a command line may name local folders
        fact["command_line"] = scrub(fact["command_line"])
    flaky = flaky_keys(report)
    for detail in details:  # a failure shown with its flake rate, or the expired issue that used to cover it
        rates = [flaky[(c[0], c[1], c[2], detail["test_id"])] for c in report.cells
                 if (c[0], c[1], c[2], detail["test_id"]) in flaky]
        detail["flaky"] = flaky_text(max(rates, key=lambda r: r or 0)) if rates else ""
    return {
        **evidence,
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
        "headline": headline_with_operators(generic.headline, ops),
        "ops": ops,
        "models": models_view(report.tests, report.model_regressions),
        "compiled": compile_view(report.tests),
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
        "trend_points": _text.TREND_POINTS,
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


def md_code(text: Any) -> str:
    """``text`` as one Markdown code span, exactly as written (a command line): fenced with one more
    backtick than its longest run of them, newlines as spaces."""
    value = " ".join(str(text).splitlines())
    fence = "`" * (max((len(run) for run in re.findall("`+", value)), default=0) + 1)
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


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
    env.filters["mdcode"] = md_code
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


def write_report(report: Report, out_dir: str | Path, formats: Iterable[str] = ("html", "md"),
                 support_matrix: bool = False) -> dict[str, Path]:
    """Write ``report.html`` and/or ``report.md`` into ``out_dir``, and beside them one operator support
    list (CSV) per cell with operator rows and, with ``support_matrix``, the support matrix
    (:mod:`accel_reports.render.support_matrix`); returns format (or file name) -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    formats = list(formats)
    unknown = [f for f in formats if f not in ("html", "md")]
    if unknown:
        raise ValueError(f"unknown report format {unknown[0]!r} (html, md)")
    context = _context(report, out)
    written = {}
    for cell in (context["ops"] or {}).get("cells", []):  # the support lists the reports link to
        written[cell["csv"]] = _write_atomic(out / cell["csv"], support_csv(cell))
    for fmt in formats:
        text = render_html(report, context) if fmt == "html" else render_markdown(report, context)
        written[fmt] = _write_atomic(out / ("report.html" if fmt == "html" else "report.md"), text)
    if support_matrix:
        written.update(write_support_matrix(report, context, out, _write_atomic, _environment(html=True)))
    return written


def _write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` beside ``path`` and rename it over ``path``: a crash leaves the previous file or
    none, never a half-written one (:func:`accel.io.files.atomic_write`)."""
    from accel.io.files import atomic_write

    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8", newline=""), keep_mode=0o644)
