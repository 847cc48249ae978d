"""The report's validated-models section: each model of the model suite × mode, per cell, from the records.

The model suite (``suites/test_models.py``) trains real architectures to a target in several modes
(one process, DDP, FSDP2, ZeRO, mixed precision, torch.compile) and judges each run against the
host's fp32 run; its records say which model in which mode passed, failed (with the gate's reason as
the test's message) or was not run (with the skip's reason), and carry the run's figures in
``extra["model_run"]``. This module only reads those records, so every entry has a record behind it;
a model × mode with no record is shown as "not run". Per cell: a status grid (model rows × mode
columns) and a figures table (steps and time to target, throughput, peak memory, the loss curve
against the reference's). Records written before modes existed (``[cpu-ws2-llama]``) read as the
one-process and DDP modes; records without figures show their status only.
"""

from __future__ import annotations

import math

import re
from typing import Any

import pandas as pd

from accel.facts.model_gates import MODE_LABELS, MODEL_MODES
from accel.facts.reasons import OPT_IN

from ..analyse.groups import cell_label
from ..load.model_records import is_model_id
from .loss_curves import loss_curve_svg

__all__ = ["OPT_IN_NOTE", "models_view"]

#: the parameter id ends with the world size, the model and (since modes exist) the mode: ``[cpu-ws1-llama-bf16]``
_PARAMS = re.compile(r"\[(?:.*-)?ws(?P<world>\d+)-(?P<model>[^\]-]+)(?:-(?P<mode>[^\]-]+))?\]$")
#: outcome -> (what the table says, css class)
_STATUS = {"passed": ("passed", "ok"), "failed": ("failed", "bad"), "error": ("error", "bad"),
           "xfailed": ("expected failure", "mute"), "xpassed": ("passed (marked to fail)", "warn"),
           "skipped": ("not run", "mute")}
MESSAGE_CHARS = 160
#: what an opt-in skip of the model suite means: the row is in the full set only
OPT_IN_NOTE = "in the full set only (accel qualify --models full, or RUN_SLOW=1)"


def _mode(world_size: int, mode: str | None) -> str:
    return mode if mode else ("single" if world_size == 1 else "ddp")


def _reason(row: pd.Series) -> str:
    """The first line of the record's message (a gate's verdict, a skip's reason), cut short."""
    if row["outcome"] == "skipped" and row.get("reason_code") == OPT_IN:
        return OPT_IN_NOTE
    text = str(row.get("message") or row.get("reason_code") or "").strip().splitlines()
    line = text[0] if text else ""
    code = row.get("reason_code")
    if row["outcome"] == "skipped" and code and not line.startswith(f"[{code}]"):
        line = f"[{code}] {line}"
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS] + "…"


def _fmt(value: float | None, digits: int = 1, unit: str = "") -> str:
    missing = value is None or (isinstance(value, float) and math.isnan(value))  # a frame's empty cell is NaN
    return "–" if missing else f"{value:,.{digits}f}{unit}"


def _figure_row(model: str, mode: str, entry: dict[str, str], run: dict[str, Any]) -> dict[str, Any]:
    """One row of the figures table (texts formatted here; the curve as inline SVG)."""
    ref = run.get("reference") or {}
    memory = run.get("peak_memory_bytes")
    steps = run.get("steps_to_target")
    ref_steps = ref.get("steps_to_target")
    label = f"{model} in {MODE_LABELS.get(mode, mode)}: loss per step, this run (blue) against the host reference (grey)"
    return {
        "model": model, "mode": MODE_LABELS.get(mode, mode), "status": entry["status"], "css": entry["css"],
        "steps_text": ("not reached" if steps is None else _fmt(steps)) + f" / {_fmt(ref_steps)}",
        "seconds_text": _fmt(run.get("seconds_to_target"), 2, " s"),
        "throughput_text": _fmt(run.get("samples_per_second"), 0),
        "ref_throughput_text": _fmt(ref.get("samples_per_second"), 0),
        "memory_text": "–" if memory is None else f"{memory / 2 ** 20:,.0f} MiB",
        "accuracy_text": _fmt(run.get("final_accuracy"), 3) + f" / {_fmt(ref.get('final_accuracy'), 3)}",
        "curve": loss_curve_svg(run["losses"], ref.get("losses"), run_every=run["loss_every"],
                                reference_every=ref.get("loss_every") or 1, steps=run.get("steps"),
                                run_target=steps, reference_target=ref_steps, label=label),
    }


def _regression_row(row: dict[str, Any]) -> dict[str, Any]:
    """One row of the regressions table: texts formatted here, the three curves as one inline SVG."""
    mode = MODE_LABELS.get(row["mode"], row["mode"])
    label = (f"{row['model']} in {mode}: loss per step, this run (blue), the earlier run (orange, dashed) and the "
             "host reference (grey)")
    return {
        "model": row["model"], "mode": mode, "reasons": row["reasons"],
        "cell": cell_label(row["backend"], row["torch_version"], row["accel_version"]),
        "ratio_text": f"{_fmt(row['steps_ratio'], 2, '×')} / {_fmt(row['previous_steps_ratio'], 2, '×')}",
        "accuracy_text": f"{_fmt(row['final_accuracy'], 3)} / {_fmt(row['previous_final_accuracy'], 3)}",
        "previous": f"{row['previous_run']} (accel {row['previous_accel_version']}, {row['previous_outcome']})",
        "curve": loss_curve_svg(row["losses"], row["reference_losses"], run_every=int(row["loss_every"]),
                                reference_every=int(row["reference_loss_every"]), earlier=row["previous_losses"],
                                earlier_every=int(row["previous_loss_every"]), label=label),
    }


def models_view(tests: pd.DataFrame, regressions: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """Per cell (backend · torch): model rows × mode columns with status and reason, and a figures row per
    model × mode whose record has them; ``regressions`` (model runs worse than their last stored run) as a
    table with the three curves. None when no record of the model suite is in the report."""
    if tests.empty or "test_id" not in tests:
        return None
    rows = tests[tests["test_id"].map(is_model_id)]
    if rows.empty:
        return None
    order = {mode: i for i, mode in enumerate(MODEL_MODES)}
    cells = []
    for (backend, torch_version, accel_version), group in rows.groupby(
            ["backend", "torch_version", "accel_version"], dropna=False, sort=True):
        found: dict[tuple[str, str], dict[str, str]] = {}
        runs: dict[tuple[str, str], dict[str, Any]] = {}
        for _, row in group.iterrows():
            match = _PARAMS.search(str(row["test_id"]))
            if not match:
                continue
            key = (match["model"], _mode(int(match["world"]), match["mode"]))
            status, css = _STATUS.get(str(row["outcome"]), (str(row["outcome"]), "mute"))
            found[key] = {"status": status, "css": css, "reason": _reason(row)}
            run = row.get("model_run")
            if isinstance(run, dict):
                runs[key] = run
        modes = sorted({mode for _, mode in found}, key=lambda m: (order.get(m, len(order)), m))
        models = sorted({model for model, _ in found})
        table = [{"model": model,
                  "cells": [found.get((model, mode), {"status": "not run", "css": "mute", "reason": "no record"})
                            for mode in modes]} for model in models]
        figures = [_figure_row(model, mode, found[(model, mode)], runs[(model, mode)])
                   for model in models for mode in modes if (model, mode) in runs]
        counts = {"passed": sum(1 for e in found.values() if e["status"] == "passed"),
                  "failed": sum(1 for e in found.values() if e["css"] == "bad")}
        cells.append({"label": cell_label(backend, torch_version, accel_version),
                      "modes": [MODE_LABELS.get(m, m) for m in modes], "rows": table, "figures": figures,
                      "passed": counts["passed"], "failed": counts["failed"], "entries": len(found)})
    if not cells:
        return None
    rows = regressions.to_dict("records") if regressions is not None and not regressions.empty else []
    return {"cells": cells, "regressions": [_regression_row(row) for row in rows]}
