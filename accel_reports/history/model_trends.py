"""Model runs across the history: a model x mode that learned last time and does not now is a regression.

Why: the model suite's gates judge one run against the host's reference of the same session, so a
backend change that makes llama in bf16 take twice the steps it took last night still passes when
both stay under the gate, and a model that fails today shows as a failure with no past beside it.
Here each model suite record of the current results is set against the latest earlier stored
record of the same test (backend, torch version and test id: one model x mode x world size; the
accel version is not part of the key, comparing accel versions is the point), and the figures both
carry (``model_run``, see :mod:`accel_reports.load.model_records`) decide:

* ``fails now``: the earlier record passed, this one failed or errored;
* ``not reached``: the earlier run reached the target, this one never did;
* ``steps-to-target``: both reached it, and this run's steps as a multiple of its own reference's
  exceed the earlier multiple times the mode's steps factor (``accel.facts.model_gates``): judged
  against each run's own host reference, so a change of the host (a torch upgrade moving the
  reference) is not the backend's regression;
* ``quality``: final accuracy below the mode's quality factor times the earlier run's.

A row keeps both runs' ids, outcomes and figures and the three loss curves (this run, its reference,
the earlier run), so a report can draw the regression beside the reference. Records without figures
(skipped, older records) can still fail now; strict expected failures are no regression.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import pandas as pd

from accel.facts.model_gates import MODE_GATES
from ..analyse.groups import CELL, FAILING
from ..load.model_records import is_model_id

__all__ = ["REGRESSION_COLUMNS", "model_regressions", "model_test_parts", "regression_text"]

#: the columns of :func:`model_regressions`' frame
REGRESSION_COLUMNS = CELL + [
    "test_id", "model", "mode", "world_size", "run_id", "outcome", "previous_run", "previous_accel_version",
    "previous_outcome", "steps_ratio", "previous_steps_ratio", "final_accuracy", "previous_final_accuracy",
    "reasons", "losses", "loss_every", "reference_losses", "reference_loss_every", "previous_losses",
    "previous_loss_every"]
#: the columns a tests frame must have for the comparison
NEEDED = CELL + ["test_id", "run_id", "start_time", "outcome", "model_run"]
_ID = re.compile(r"[\[-]ws(\d+)-([^-\[\]]+)(?:-([^-\[\]]+))?\]$")


def model_test_parts(test_id: str) -> tuple[str, str, int] | None:
    """(model, mode, world size) of a model suite test id (``...[ws2-llama-zero3]``, a node id's
    ``[cpu-ws2-llama-zero3]`` too); ids from before
    the modes (``[cpu-ws2-llama]``) name the one-process or DDP mode by their world size; None otherwise."""
    if not is_model_id(test_id):
        return None
    found = _ID.search(test_id)
    if found is None:
        return None
    world = int(found.group(1))
    return found.group(2), found.group(3) or ("single" if world == 1 else "ddp"), world


def _ratio(run: Any) -> float | None:
    """Steps to target as a multiple of the run's own reference's; None where either is missing."""
    if not isinstance(run, dict) or not isinstance(run.get("reference"), dict):
        return None
    steps, reference = run.get("steps_to_target"), run["reference"].get("steps_to_target")
    return steps / reference if isinstance(steps, float) and isinstance(reference, float) and reference > 0 else None


def _figure(run: Any, key: str) -> Any:
    return run.get(key) if isinstance(run, dict) else None


def _reasons(mode: str, outcome: str, previous: dict[str, Any]) -> Iterable[str]:
    gates = MODE_GATES.get(mode, MODE_GATES["single"])
    run, before = previous["now"], previous["model_run"]
    if previous["outcome"] == "passed" and outcome in FAILING:
        yield f"fails now: {outcome} after passing in run {previous['run_id']}"
    reached, reached_before = _figure(run, "steps_to_target"), _figure(before, "steps_to_target")
    if run is not None and reached is None and reached_before is not None:
        yield f"not reached: the target was reached at step {reached_before:.1f} in run {previous['run_id']}, not now"
    ratio, ratio_before = _ratio(run), _ratio(before)
    if ratio is not None and ratio_before is not None and ratio > gates["steps"] * ratio_before:
        yield (f"steps-to-target: {ratio:.3f} x its reference's steps vs {ratio_before:.3f} x in run {previous['run_id']} "
               f"(gate {gates['steps']:g} x that = {gates['steps'] * ratio_before:.3f})")
    accuracy, accuracy_before = _figure(run, "final_accuracy"), _figure(before, "final_accuracy")
    if accuracy is not None and accuracy_before is not None and accuracy < gates["quality"] * accuracy_before:
        yield (f"quality: final accuracy {accuracy:.4f} vs {accuracy_before:.4f} in run {previous['run_id']} "
               f"(gate {gates['quality']:g} x that = {gates['quality'] * accuracy_before:.4f})")


def _model_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    missing = [c for c in NEEDED if c not in frame.columns]
    if missing:
        raise ValueError(f"a tests frame for the model comparison needs the columns {', '.join(missing)}")
    rows = frame[frame["test_id"].map(is_model_id)] if not frame.empty else frame
    return [dict(zip(NEEDED, values)) for values in rows[NEEDED].itertuples(index=False, name=None)]


def model_regressions(current: pd.DataFrame, stored: pd.DataFrame) -> pd.DataFrame:
    """Every model suite record of ``current`` that regressed against the latest earlier record of the same
    backend, torch version and test id in ``stored`` (both tests frames of the loader's columns; ``stored``
    may hold the current runs too: records of a current run id, or not earlier than it, are not "earlier").
    One row per regressed test (columns :data:`REGRESSION_COLUMNS`), ``reasons`` joined by ``"; "``."""
    earlier: dict[tuple, list[dict[str, Any]]] = {}
    for row in _model_rows(stored):
        earlier.setdefault((row["backend"], row["torch_version"], row["test_id"]), []).append(row)
    for rows in earlier.values():
        rows.sort(key=lambda r: str(r["start_time"] or ""))
    current_runs = set(current["run_id"]) if "run_id" in current.columns else set()
    out = []
    for row in _model_rows(current):
        parts = model_test_parts(row["test_id"])
        if parts is None or row["outcome"] in ("skipped", "xfailed"):
            continue
        model, mode, world = parts
        start = str(row["start_time"] or "")
        before = [r for r in earlier.get((row["backend"], row["torch_version"], row["test_id"]), [])
                  if r["run_id"] not in current_runs and str(r["start_time"] or "") < start
                  and r["outcome"] not in ("skipped", "xfailed")]
        if not before:
            continue
        previous = {**before[-1], "now": row["model_run"]}
        reasons = list(_reasons(mode, row["outcome"], previous))
        if not reasons:
            continue
        run, prior = row["model_run"], previous["model_run"]
        reference = _figure(run, "reference")
        out.append({**{c: row[c] for c in CELL}, "test_id": row["test_id"], "model": model, "mode": mode,
                    "world_size": world, "run_id": row["run_id"], "outcome": row["outcome"],
                    "previous_run": previous["run_id"], "previous_accel_version": previous["accel_version"],
                    "previous_outcome": previous["outcome"], "steps_ratio": _ratio(run),
                    "previous_steps_ratio": _ratio(prior), "final_accuracy": _figure(run, "final_accuracy"),
                    "previous_final_accuracy": _figure(prior, "final_accuracy"), "reasons": "; ".join(reasons),
                    "losses": _figure(run, "losses") or [], "loss_every": _figure(run, "loss_every") or 1,
                    "reference_losses": _figure(reference, "losses") or [],
                    "reference_loss_every": _figure(reference, "loss_every") or 1,
                    "previous_losses": _figure(prior, "losses") or [], "previous_loss_every": _figure(prior, "loss_every") or 1})
    return pd.DataFrame(out, columns=REGRESSION_COLUMNS)


def regression_text(row: dict[str, Any]) -> str:
    """One line naming the regression: model, mode, backend and torch version, then its reasons."""
    return (f"{row['model']} in mode {row['mode']} on {row['backend']} (torch {row['torch_version']}, accel "
            f"{row['accel_version']} vs {row['previous_accel_version']}): {row['reasons']}")
