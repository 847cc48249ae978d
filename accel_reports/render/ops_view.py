"""The report's Operators section (part of :mod:`accel_reports.render.report`): the view of
:func:`accel_reports.analyse.operators.operator_cells` for the templates, the support list as CSV, and the
report without operator rows that the per-test tables are drawn from.

An operator sweep has thousands of rows: in the per-test grid, the failure details, the root-cause
and the skip tables they would bury everything else, so those tables show the other tests and the
Operators section summarises the rows (families x dtypes, failures grouped by reason and message).
The rows still count everywhere a count is made: the verdict, the areas (``operators``), the
summary matrix, the pass rates and the baseline diff (a row that passed in the baseline and fails
now is a new failure like any test's).
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from typing import Any

from ..analyse.analysis import Report
from ..analyse.groups import failure_clusters, skip_groups
from ..analyse.operators import operator_cells, split_tests
from .text import _pct, _plural, _slug

__all__ = ["GRADES", "MD_OPS_ROWS", "headline_with_operators", "operators_view", "support_csv", "without_operators"]

#: (lowest share, css class, Markdown marker, what it means): the colour of a family x dtype cell
GRADES = ((1.0, "q4", ":green_square:", "every operator passed"),
          (0.9, "q3", ":yellow_square:", "at least 90 % passed"),
          (0.5, "q2", ":orange_square:", "at least half passed"),
          (0.0, "q1", ":red_square:", "fewer than half passed"))
#: operators with limitations listed in the Markdown report (the CSV holds every operator)
MD_OPS_ROWS = 60
#: operators with limitations listed in the HTML report
HTML_OPS_ROWS = 500
#: operators named in a cell's tooltip
TITLE_OPERATORS = 10


def without_operators(report: Report) -> Report:
    """``report`` without operator rows in the tables drawn per test (grid, failure details, root
    causes, skips, headline); the same report when it has none."""
    from ..analyse.analysis import headline
    from ..load.ops_records import is_operator_id

    ops, rest = split_tests(report.tests)
    if ops.empty:
        return report
    grid = report.grid[[not is_operator_id(test_id) for test_id in report.grid.index]]
    clusters = failure_clusters(rest, report.known, by="root")
    return replace(report, tests=rest, grid=grid, clusters=clusters, headline=headline(clusters),
                   signature_clusters=failure_clusters(rest, report.known, by="signature"), skips=skip_groups(rest))


def _grade(share: float | None) -> tuple[str, str]:
    if share is None:
        return "q0", ""
    for lowest, css, marker, _ in GRADES:
        if share >= lowest:
            return css, marker
    return GRADES[-1][1], GRADES[-1][2]


def _rate_cell(rate: dict[str, Any] | None, where: str) -> dict[str, Any] | None:
    if not rate or not rate.get("compared"):
        return None
    share = rate["passed"] / rate["compared"]
    css, marker = _grade(share)
    failing = rate.get("failing") or []
    title = f"{where}: {rate['passed']} of {rate['compared']} operators passed"
    if failing:
        title += "; not passing: " + ", ".join(failing[:TITLE_OPERATORS]) + (
            f", … {len(failing) - TITLE_OPERATORS} more" if len(failing) > TITLE_OPERATORS else "")
    return {"text": f"{rate['passed']}/{rate['compared']}", "pct": _pct(share), "css": css, "marker": marker, "title": title}


def _csv_names(cells: list[dict[str, Any]]) -> list[str]:
    """One support-list file name per cell: ``operator-support-<backend>-torch-<version>.csv`` (the accel
    version added where two cells would share a name)."""
    bases = [_slug(f"{c['cell'][0]} torch {c['cell'][1]}") for c in cells]
    return [f"operator-support-{base}" + (f"-{_slug(c['cell'][2])}" if bases.count(base) > 1 else "") + ".csv"
            for base, c in zip(bases, cells)]


def _cell_view(cell: dict[str, Any], csv_name: str) -> dict[str, Any]:
    from accel_harness.ops.outcomes import OP_OUTCOMES

    dtypes = cell["dtypes"]
    families = [{"family": f["family"], "operators": f["operators"],
                 "cells": [_rate_cell(f["rates"].get(d), f"{f['family']} · {d}") for d in dtypes]} for f in cell["families"]]
    total = [_rate_cell(cell["total"].get(d), f"every OpInfo operator · {d}") for d in dtypes]
    census = cell["census"]
    if census:
        census = {**census, "kinds_sorted": sorted(census["kinds"].items(), key=lambda kv: (-kv[1], kv[0])),
                  "device_text": _pct(census["device_kernel_share"]), "host_text": _pct(census["host_kernel_share"])}
    support = cell["support"]
    limited = [s for s in support if s["limitations"]]
    for group in cell["failures"]:
        group["operators_text"] = ", ".join(group["operators"]) + (f", … {group['more']} more" if group["more"] else "")
    claims = [{"dtype": d, **c, "css": "r-bad" if c["verdict"] == "claim-contradicted" else "r-ok" if c["verdict"] == "supported"
               else "r-none"} for d, c in sorted(cell["claims"].items())]
    counts = cell["counts"]
    return {
        **{k: cell[k] for k in ("label", "run_id", "runs", "from_run", "lines", "rows", "dtypes", "skips", "fallbacks")},
        "counts_text": ", ".join(f"{counts[o]} {o}" for o in OP_OUTCOMES if counts.get(o)),
        "families": families, "total": total if any(total) else None,
        "failures": cell["failures"], "census": census, "claims": claims,
        "support": support, "supported": len(support) - len(limited), "limited": limited, "csv": csv_name,
    }


def operators_view(report: Report) -> dict[str, Any] | None:
    """The Operators section: one entry per cell with operator rows; None when the report has none."""
    cells = operator_cells(report.tests, report.loaded.runs)
    if not cells:
        return None
    views = [_cell_view(cell, name) for cell, name in zip(cells, _csv_names(cells))]
    failing = sum(c["counts"].get("failed", 0) + c["counts"].get("known", 0) for c in cells)
    untracked = sum(c["counts"].get("failed", 0) for c in cells)
    passing = sum(c["counts"].get("passed", 0) + c["counts"].get("xpassed", 0) for c in cells)
    return {"cells": views, "rows": sum(c["rows"] for c in cells), "failing": failing, "untracked": untracked,
            "passing": passing, "groups": sum(len(c["failures"]) for c in cells), "grades": GRADES,
            "md_rows": MD_OPS_ROWS, "html_rows": HTML_OPS_ROWS}


def headline_with_operators(headline: str | None, ops: dict[str, Any] | None) -> str | None:
    """The report's headline (from the tests outside the sweep) with the operator failures named beside it."""
    if not ops or not ops["failing"]:
        return headline
    note = (f"{_plural(ops['failing'], 'operator row')} failed ({ops['untracked']} not covered by a known issue), in "
            f"{_plural(ops['groups'], 'group')} by reason and message: see Operators")
    return f"{headline} (tests outside the operator sweep); {note}" if headline else note


def _spreadsheet_safe(text: str) -> str:
    """A CSV cell a spreadsheet shows as text: one starting like a formula gets a leading quote."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def support_csv(cell: dict[str, Any]) -> str:
    """A cell's support list as CSV, the columns of ``accel ops``'s ``support.csv``: op, the dtypes it
    passed in (space-separated), its limitations (``dtype: reason (variant, direction)``, ``; ``-separated)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)  # the dialect accel ops writes its support.csv in
    writer.writerow(("op", "supported_dtypes", "limitations"))
    for entry in cell["support"]:
        writer.writerow((_spreadsheet_safe(entry["op"]), _spreadsheet_safe(" ".join(entry["supported_dtypes"])),
                         _spreadsheet_safe("; ".join(entry["limitations"]))))
    return buffer.getvalue()
