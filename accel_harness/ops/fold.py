"""Fold sample results into rows: one row per entry x variant x dtype x direction (torch-free)."""

from __future__ import annotations

from typing import Iterable

from . import outcomes as oc
from .plan import Row, SampleResult, Task

__all__ = ["fold_task"]


def _finite_max(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def fold_task(task: Task, results: list[SampleResult]) -> list[Row]:
    """The task's rows: each takes its worst sample's reason; torch's expected failures become xfailed
    (or xpassed when nothing failed)."""
    rows: list[Row] = []
    for variant, direction in task.pairs:
        mine = [r for r in results if r.variant == variant and r.direction == direction]
        reason = oc.worst([r.reason for r in mine])
        outcome = oc.OP_REASONS[reason][0]
        worst_sample = next((r for r in mine if r.reason == reason), None)
        message = f"sample {worst_sample.sample}: {worst_sample.message}" if worst_sample and worst_sample.message and outcome != "passed" else None
        if task.xfail and outcome in ("failed", "passed"):
            outcome = "xfailed" if outcome == "failed" else "xpassed"
            message = f"torch expects a failure here; {reason}" + (f": {message}" if message else "")
            reason = oc.TORCH_XFAIL if outcome == "xfailed" else reason
        rows.append(Row(
            kind=task.kind, op=task.name, variant=variant, dtype=task.dtype, direction=direction, outcome=outcome,
            reason_code=reason, samples=len(mine), max_abs_err=_finite_max(r.max_abs for r in mine),
            max_rel_err=_finite_max(r.max_rel for r in mine), message=message,
            tolerance=next((r.tolerance for r in mine if r.tolerance), None), seconds=sum(r.seconds for r in mine)))
    return rows
