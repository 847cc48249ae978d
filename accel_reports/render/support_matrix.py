"""The support matrix: the one document a vendor hands on, built only from a report's evidence.

Per cell (backend · torch · accel): the software the runs recorded, each feature area's status from
the suites, operators × dtypes from the operator sweeps, and models × modes from the model suite.
Every entry says where its evidence is (a section of ``report.html`` and the runs); an entry with
nothing behind it says "not run". Written as Markdown, HTML and CSV (one row per entry) beside
the report by ``accel report --support-matrix``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from ..analyse.analysis import Report
from ..analyse.groups import cell_label

__all__ = ["FILES", "matrix_entries", "support_matrix_csv", "support_matrix_markdown", "write_support_matrix"]

#: format -> file name, beside report.html
FILES = {"md": "support-matrix.md", "html": "support-matrix.html", "csv": "support-matrix.csv"}
#: outcomes that count as a failure of a feature
_FAILING = ("failed", "error", "xpassed")


def _software(report: Report, cell: tuple) -> list[tuple[str, str]]:
    """What the cell's runs recorded about the software and the machine, first run first."""
    runs = report.loaded.runs
    backend = str(cell[0])
    mine = runs[runs["backends"].astype(str).str.split(",").apply(lambda names: backend in [n.strip() for n in names])]
    facts: dict[str, str] = {"torch": str(cell[1]), "accel": str(cell[2])}
    for _, run in mine.iterrows():
        fingerprint = run.get("fingerprint") if isinstance(run.get("fingerprint"), dict) else {}
        for name, version in sorted((fingerprint.get("plugins") or {}).items()):
            facts.setdefault(f"plug-in {name}", str(version))
        for key, label in (("torch_build", "torch build"), ("python", "python"), ("os", "os"),
                           ("device_models", "devices"), ("driver_versions", "driver"), ("runtime_versions", "runtime")):
            value = run.get(key)
            if isinstance(value, dict):  # per backend: this cell's only
                value = value.get(backend)
            elif key == "device_models" and isinstance(value, str):  # "cpu: X; emu: Y" for a run of several
                value = "; ".join(part for part in value.split("; ") if part.startswith(f"{backend}:")) or None
            if value not in (None, "") and str(value) != "nan":
                facts.setdefault(label, str(value))
    return list(facts.items())


def _features(report: Report, position: int) -> list[dict[str, str]]:
    """Each feature area's status in the cell at ``position`` of the per-test grid (operators apart)."""
    from ..analyse.areas import AREA_ORDER, area_of
    from .ops_view import without_operators

    grid = without_operators(report).grid
    counts: dict[str, dict[str, int]] = {}
    if position in grid.columns:
        for test_id, outcome in grid[position].items():
            if isinstance(outcome, str):
                per = counts.setdefault(area_of(test_id), {})
                per[outcome] = per.get(outcome, 0) + 1
    rows = []
    for area in sorted(counts, key=lambda a: (AREA_ORDER.index(a) if a in AREA_ORDER else len(AREA_ORDER), a)):
        per = counts[area]
        passed, failed = per.get("passed", 0), sum(per.get(o, 0) for o in _FAILING)
        ran = passed + failed
        if not ran:
            status, detail = "not run", f"{sum(per.values())} test(s), none ran"
        elif failed:
            status, detail = ("partly" if passed else "failing"), f"{failed} of {ran} failed"
        else:
            status, detail = "supported", f"{passed} of {ran} passed"
        rows.append({"item": area, "status": status, "detail": detail, "evidence": "report.html#areas"})
    return rows


def _operators(sweeps: list[dict[str, Any]], label: str) -> list[dict[str, str]]:
    """Operators passed in each dtype swept, from the cell's operator sweep (``sweeps``: the report's
    operator cells, in the order its Operators section numbers them)."""
    for n, cell in enumerate(sweeps):
        if cell["label"] != label:
            continue
        rows = []
        for dtype in cell["dtypes"]:
            total = (cell.get("total") or {}).get(dtype) or {}
            compared, passed = total.get("compared", 0), total.get("passed", 0)
            status = "not run" if not compared else "supported" if passed == compared else "partly"
            rows.append({"item": f"operators in {dtype}", "status": status, "detail": f"{passed} of {compared} operators passed",
                         "evidence": f"report.html#ops-{n}"})
        return rows
    return [{"item": "operators", "status": "not run", "detail": "no operator sweep in this cell", "evidence": ""}]


def _models(models: dict[str, Any] | None, label: str) -> list[dict[str, str]]:
    """Each model × mode of the cell's model suite."""
    for cell in (models or {}).get("cells", []):
        if cell["label"] != label:
            continue
        return [{"item": f"{row['model']} ({mode})", "status": entry["status"],
                 "detail": "" if entry["status"] == "passed" else entry["reason"], "evidence": "report.html#models"}
                for row in cell["rows"] for mode, entry in zip(cell["modes"], row["cells"])]
    return [{"item": "models", "status": "not run", "detail": "no model suite records in this cell", "evidence": ""}]


def matrix_entries(report: Report, context: dict[str, Any]) -> list[dict[str, Any]]:
    """Per cell: its label, software facts and the entries of each section (``context``: the report's
    render context, whose model view is reused so both documents say the same)."""
    from ..analyse.operators import operator_cells

    sweeps = operator_cells(report.tests, report.loaded.runs)
    cells = []
    for position, cell in enumerate(report.cells):
        label = cell_label(*cell)
        cells.append({"label": label, "software": _software(report, cell), "sections": [
            ("features", _features(report, position)),
            ("operators", _operators(sweeps, label)),
            ("models", _models(context.get("models"), label)),
        ]})
    return cells


def support_matrix_csv(cells: list[dict[str, Any]]) -> str:
    """One row per entry: cell, section, item, status, detail, evidence (software facts as section software)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(("cell", "section", "item", "status", "detail", "evidence"))
    for cell in cells:
        for key, value in cell["software"]:
            writer.writerow(_safe((cell["label"], "software", key, value, "", "")))
        for section, entries in cell["sections"]:
            for e in entries:
                writer.writerow(_safe((cell["label"], section, e["item"], e["status"], e["detail"], e["evidence"])))
    return buffer.getvalue()


def _safe(values: tuple) -> tuple:
    """Cells a spreadsheet shows as text: one starting like a formula gets a leading quote."""
    return tuple("'" + str(v) if str(v)[:1] in ("=", "+", "-", "@", "\t", "\r") else v for v in values)


def support_matrix_markdown(cells: list[dict[str, Any]], title: str) -> str:
    """The matrix as GitHub-flavoured Markdown: per cell, the software, then each section's table."""
    from .text import md_escape as md

    lines = [f"# Support matrix: {md(title)}", "",
             "Built only from the runs' records; \"not run\" where nothing ran. Evidence: the sections of report.html.", ""]
    for cell in cells:
        lines += [f"## {md(cell['label'])}", "", "| software | version |", "|---|---|"]
        lines += [f"| {md(k)} | {md(v)} |" for k, v in cell["software"]]
        for section, entries in cell["sections"]:
            lines += ["", f"### {section.capitalize()}", "", "| item | status | detail | evidence |", "|---|---|---|---|"]
            lines += [f"| {md(e['item'])} | {md(e['status'])} | {md(e['detail'])} | {md(e['evidence'])} |" for e in entries]
        lines.append("")
    return "\n".join(lines)


def write_support_matrix(report: Report, context: dict[str, Any], out: Path, write: Any, environment: Any) -> dict[str, Path]:
    """Write the three files into ``out`` with ``write(path, text)`` (the report's atomic writer);
    ``environment`` is the report's HTML template environment."""
    cells = matrix_entries(report, context)
    html = environment.get_template("support_matrix.html.j2").render(title=context["title"], cells=cells)
    texts = {"md": support_matrix_markdown(cells, context["title"]), "html": html, "csv": support_matrix_csv(cells)}
    return {FILES[fmt]: write(out / FILES[fmt], text) for fmt, text in texts.items()}
