"""The report's torch.compile section: per cell, what the compile suite compiled and where the graph broke.

The compile suite (``suites/test_compile.py``) trains a model eagerly and through ``torch.compile`` with
the backend's compile backend; the loader keeps what Dynamo counted (:mod:`accel_reports.load.compile_records`).
This module reads those checked blocks only.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..analyse.groups import cell_label
from ..load.compile_records import is_compile_id

__all__ = ["compile_view"]

#: outcome -> what the table says
_STATUS = {"passed": "passed", "failed": "failed", "error": "error", "xfailed": "expected failure",
           "xpassed": "passed (marked to fail)", "skipped": "not run"}


def compile_view(tests: pd.DataFrame) -> list[dict[str, Any]] | None:
    """One row per cell that ran the compile suite: status, compile backend, graphs, graph breaks and why.
    None when no record of the suite is there (the section is left out)."""
    if tests is None or tests.empty or "test_id" not in tests:
        return None
    rows = tests[tests["test_id"].map(is_compile_id)]
    if rows.empty:
        return None
    out = []
    for _, rec in rows.iterrows():
        detail = rec.get("compile_run") if isinstance(rec.get("compile_run"), dict) else None
        reasons = (detail or {}).get("break_reasons") or {}
        breaks = (detail or {}).get("graph_breaks")
        out.append({
            "cell": cell_label(rec.get("backend"), rec.get("torch_version"), rec.get("accel_version")),
            "status": _STATUS.get(str(rec.get("outcome")), str(rec.get("outcome"))),
            "css": "ok" if rec.get("outcome") == "passed" else ("bad" if rec.get("outcome") in ("failed", "error") else "mute"),
            "compiler": (detail or {}).get("backend") or "–",
            "graphs": "–" if detail is None or detail.get("graphs") is None else str(detail["graphs"]),
            "breaks": "–" if breaks is None else str(breaks),
            "reasons": "; ".join(f"{reason} (×{n})" for reason, n in reasons.items()) or ("none" if breaks == 0 else "–"),
        })
    return sorted(out, key=lambda r: r["cell"])
