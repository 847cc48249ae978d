"""The report's torch.compile section: per cell, what the compile suite compiled and where the graph broke.

The compile suite (``suites/test_compile.py``) trains a model eagerly and through ``torch.compile`` with
the backend's compile backend and puts what Dynamo counted into its record (``extra["compile"]``: the
compile backend, the number of graphs, the number of graph breaks and each break's reason). This module
reads those records only; a malformed block is left out rather than guessed at.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from .groups import cell_label

__all__ = ["COMPILE_TEST", "compile_detail", "compile_view", "is_compile_id"]

#: the compile suite's test function
COMPILE_TEST = "suites/test_compile.py::test_compiled_training_matches_eager"
#: at most this many graph-break reasons are kept from one record
REASON_LIMIT = 20
#: outcome -> what the table says
_STATUS = {"passed": "passed", "failed": "failed", "error": "error", "xfailed": "expected failure",
           "xpassed": "passed (marked to fail)", "skipped": "not run"}


def is_compile_id(test_id: Any) -> bool:
    """Whether ``test_id`` is the compile suite's test."""
    return isinstance(test_id, str) and (test_id == COMPILE_TEST or test_id.startswith(COMPILE_TEST + "["))


def _count(value: Any) -> int | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return int(value) if ok else None


def compile_detail(extra: Any) -> dict[str, Any] | None:
    """The checked ``compile`` block of a record's ``extra``: backend, graphs, graph breaks, their reasons."""
    block = extra.get("compile") if isinstance(extra, dict) else None
    if not isinstance(block, dict):
        return None
    reasons = block.get("break_reasons")
    reasons = reasons if isinstance(reasons, dict) else {}
    kept = {str(k): n for k, v in list(reasons.items())[:REASON_LIMIT] if (n := _count(v)) is not None}
    backend = block.get("backend")
    return {"backend": str(backend) if isinstance(backend, str) else None, "graphs": _count(block.get("graphs")),
            "graph_breaks": _count(block.get("graph_breaks")), "break_reasons": kept}


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
