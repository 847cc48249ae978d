"""What a run header says about the run beyond the harness fields: the ``extra["upstream"]`` block
of an upstream suite's run (``accel qualify --upstream``) and the subject label made from it.

The loader reads headers with it and the vendor table names its rows with it; it sits below both
(imports nothing of accel_reports), so neither needs the other for it.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["side", "subject_label", "upstream_block"]


def upstream_block(header: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``extra["upstream"]`` block of a results header, or None for a harness-suite run."""
    extra = (header or {}).get("extra")
    block = extra.get("upstream") if isinstance(extra, Mapping) else None
    return dict(block) if isinstance(block, Mapping) and block.get("project") else None


def side(project: Any, version: Any) -> str:
    """``accelerate 1.15.0``: a project and its version (the project alone without one)."""
    return f"{project} {version}" if version else str(project)


def subject_label(block: Mapping[str, Any]) -> str:
    """``accelerate 1.15.0 tests → accel 0.1.0``: the suite and what it ran against."""
    suite = side(block.get("project"), block.get("version"))
    against = block.get("against") or block.get("project")
    return f"{suite} tests → {side(against, block.get('against_version'))}"
