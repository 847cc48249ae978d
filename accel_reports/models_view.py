"""The report's validated-models table: each model of the model suite × mode, per cell, from the records.

The model suite (``suites/test_models.py``) trains real architectures to a target and judges each run
against the host's fp32 run; its records say which model at which world size passed, failed (with
the gate's reason as the test's message) or was not run (with the skip's reason). This module only
reads those records, so every cell of the table has a record behind it; a model × mode with no
record is shown as "not run".
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from accel.facts.reasons import OPT_IN

from .groups import cell_label

__all__ = ["MODEL_TEST", "models_view"]

#: the model suite's test function; its parameter id ends with the model's name (``[cpu-ws2-llama]``)
MODEL_TEST = "suites/test_models.py::test_model_trains_to_target_like_the_host_reference"
_PARAMS = re.compile(r"\[(?:.*-)?ws(?P<world>\d+)-(?P<model>[^\]-]+)\]$")
#: outcome -> (what the table says, css class)
_STATUS = {"passed": ("passed", "ok"), "failed": ("failed", "bad"), "error": ("error", "bad"),
           "xfailed": ("expected failure", "mute"), "xpassed": ("passed (marked to fail)", "warn"),
           "skipped": ("not run", "mute")}
MESSAGE_CHARS = 160


def _mode(world_size: int) -> str:
    return "1 process" if world_size == 1 else f"DDP × {world_size}"


#: what an opt-in skip of the model suite means: the row is in the full set only
OPT_IN_NOTE = "in the full set only (accel qualify --models full, or RUN_SLOW=1)"


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


def models_view(tests: pd.DataFrame) -> dict[str, Any] | None:
    """One table per cell (backend · torch): model rows × mode columns with status and reason; None when
    no record of the model suite is in the report."""
    if tests.empty or "test_id" not in tests:
        return None
    rows = tests[tests["test_id"].astype(str).str.startswith(MODEL_TEST + "[")]
    if rows.empty:
        return None
    cells = []
    for (backend, torch_version, accel_version), group in rows.groupby(
            ["backend", "torch_version", "accel_version"], dropna=False, sort=True):
        found: dict[tuple[str, int], dict[str, str]] = {}
        for _, row in group.iterrows():
            match = _PARAMS.search(str(row["test_id"]))
            if not match:
                continue
            status, css = _STATUS.get(str(row["outcome"]), (str(row["outcome"]), "mute"))
            found[(match["model"], int(match["world"]))] = {"status": status, "css": css, "reason": _reason(row)}
        worlds = sorted({world for _, world in found})
        models = sorted({model for model, _ in found})
        table = [{"model": model,
                  "cells": [found.get((model, world), {"status": "not run", "css": "mute", "reason": "no record"})
                            for world in worlds]} for model in models]
        counts = {"passed": sum(1 for e in found.values() if e["status"] == "passed"),
                  "failed": sum(1 for e in found.values() if e["css"] == "bad")}
        cells.append({"label": cell_label(backend, torch_version, accel_version), "modes": [_mode(w) for w in worlds],
                      "rows": table, "passed": counts["passed"], "failed": counts["failed"], "entries": len(found)})
    return {"cells": cells} if cells else None
