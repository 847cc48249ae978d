"""The report's evidence views (part of :mod:`accel_reports.render.report`): each run's fingerprint and what
it says about comparing with the baseline, the device profile's applicable coverage per area,
expired known issues (their failures count as untracked) and flaky failures, shown as "flaky (rate)"
and never as new failures (see :mod:`accel_reports.analyse.evidence`); and the facts shown under the verdict at
the top: each run's exact command line, versions and fingerprint."""

from __future__ import annotations

from typing import Any

from ..analyse.analysis import Report, cell_label
from ..analyse.evidence import coverage_rows, fingerprint_rows
from .text import _pct, _records, safe_url


def flaky_text(rate: Any) -> str:
    """``flaky (33%)``: how a flaky failure is shown wherever it appears (``flaky`` without a rate)."""
    return f"flaky ({rate:.0%})" if isinstance(rate, (int, float)) and not isinstance(rate, bool) else "flaky"


def _fingerprint_view(report: Report) -> dict[str, Any]:
    """The runs' fingerprints and, against a baseline, the notes that say whether the comparison is fair."""
    rows = fingerprint_rows(report.loaded.runs)
    notes = list(report.comparison)
    return {"rows": rows, "unfair": [n["text"] for n in notes if not n["fair"]],
            "notes": [n["text"] for n in notes if n["fair"]]}


def _coverage_view(report: Report) -> list[dict[str, Any]]:
    """Per run with a device profile: its claims and the applicable coverage per claimed area."""
    out = []
    for run in coverage_rows(report.loaded.runs):
        for area in run["areas"]:
            area["coverage_text"] = _pct(area["coverage"]) if area["coverage"] is not None else "–"
            area["css"] = ("r-bad" if area["failed"] or area["contradicted"]
                           else "r-ok" if area["coverage"] is not None and area["coverage"] >= 0.999
                           else "r-warn" if area["applicable"] else "r-none")
        run["not_claimed_text"] = ", ".join(f"{area} ({count})" for area, count in run["not_claimed"].items())
        out.append(run)
    return out


def _expired_view(report: Report) -> list[dict[str, Any]]:
    """Expired known issues with the untracked failures they used to cover."""
    rows = _records(report.expired)
    for row in rows:
        row["url"] = safe_url(row["issue"])
    return rows


def _flaky_view(report: Report) -> list[dict[str, Any]]:
    """Flaky failures, flakiest first: test, cell, ``flaky (rate)`` and where the rate comes from."""
    rows = _records(report.flaky)
    for row in rows:
        row["cell"] = cell_label(row["backend"], row["torch_version"], row["accel_version"])
        row["text"] = flaky_text(row["flake_rate"])
        row["evidence_text"] = ("its re-runs (--flake-runs)" if row["evidence"] == "re-runs"
                                else f"the run history ({row['runs']} runs)")
    rows.sort(key=lambda r: (-(r["flake_rate"] if isinstance(r["flake_rate"], float) else 0.0), r["test_id"]))
    return rows


def flaky_keys(report: Report) -> dict[tuple, Any]:
    """(backend, torch version, accel version, test id) -> flake rate, for every flaky failure."""
    if report.flaky.empty:
        return {}
    return {(r["backend"], r["torch_version"], r["accel_version"], r["test_id"]): r["flake_rate"]
            for r in report.flaky.to_dict("records")}


#: runs whose command line, versions and fingerprint are shown at the top (the rest: the Runs section)
RUN_FACTS_SHOWN = 3


def _text_or(value: Any, default: str) -> str:
    return value if isinstance(value, str) and value else default


def run_facts(report: Report) -> dict[str, Any]:
    """What the top of the report says each run was: the exact command line ("not recorded" for a file
    written before it was kept), the versions (torch, accel, Python, plug-ins) and the fingerprint
    (environment hash, selected tests and their hash); test runs only, the first few."""
    runs = report.loaded.runs
    rows = []
    for run in ([] if runs.empty else runs.to_dict("records")):
        print_ = run.get("fingerprint") if isinstance(run.get("fingerprint"), dict) else {}
        selection = run.get("selection") if isinstance(run.get("selection"), dict) else {}
        plugins = print_.get("plugins") if isinstance(print_.get("plugins"), dict) else {}
        versions = [f"torch {_text_or(run.get('torch_version'), '–')}", f"accel {_text_or(run.get('accel_version'), '–')}"]
        if isinstance(run.get("python"), str) and run["python"]:
            versions.append(f"Python {run['python']}")
        versions += [f"{name} {version or ''}".strip() for name, version in sorted(plugins.items())]
        digest = print_.get("sha256")
        fingerprint = (f"environment {digest[:12]}" if isinstance(digest, str) and digest else "not recorded")
        if isinstance(selection.get("count"), int) and isinstance(selection.get("sha256"), str):
            fingerprint += f"; {selection['count']} tests selected ({selection['sha256'][:12]})"
        rows.append({"run_id": run["run_id"], "backends": run.get("backends") or "",
                     "command_line": _text_or(run.get("command_line"), ""), "versions": ", ".join(versions),
                     "fingerprint": fingerprint})
    return {"rows": rows[:RUN_FACTS_SHOWN], "more": max(0, len(rows) - RUN_FACTS_SHOWN)}


def evidence_context(report: Report) -> dict[str, Any]:
    """The template values of this module's sections."""
    return {"fingerprints": _fingerprint_view(report), "coverage": _coverage_view(report),
            "expired": _expired_view(report), "flaky": _flaky_view(report), "run_facts": run_facts(report)}
