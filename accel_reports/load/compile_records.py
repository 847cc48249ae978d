"""What the loader keeps of the compile suite's records: which test it is, and its checked ``compile`` block.

The compile suite (``suites/test_compile.py``) puts what Dynamo counted into its record (``extra["compile"]``:
the compile backend, the number of graphs, the number of graph breaks and each break's reason); a
malformed block is left out rather than guessed at. The section drawn from it is
:mod:`accel_reports.render.compile_view`.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["COMPILE_TEST", "compile_detail", "is_compile_id"]

#: the compile suite's test function
COMPILE_TEST = "suites/test_compile.py::test_compiled_training_matches_eager"
#: at most this many graph-break reasons are kept from one record
REASON_LIMIT = 20


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
