"""What a device profile says to the operator sweep: tolerances, and claims checked against the rows.

Tolerances, from loosest rule to most specific: torch's default for the dtype, torch's metadata for
the entry, the profile's ``tolerances: {<dtype>: {ops: ...}}`` for every operator of the device (a
floor: it loosens, never tightens torch's), and ``op_tolerances: {<op pattern>: {<dtype>: ...}}``,
which replaces everything before it for the operators it names. A claimed dtype that most compared
operators fail in is ``claim-contradicted``.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from .plan import Task
from .summary import pass_rates

__all__ = ["CONTRADICTED", "PROFILE_DTYPES", "apply_tolerances", "check_claims", "tolerance_rules"]

#: the profile's dtype names -> torch's
PROFILE_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64", "fp8": "float8_e4m3fn"}
#: a claimed dtype is contradicted when fewer than this share of its compared operators pass
CONTRADICTED = 0.5


def _short(dtype: str) -> str | None:
    return next((short for short, name in PROFILE_DTYPES.items() if name == dtype), None)


def tolerance_rules(profile: Any) -> dict[str, Any] | None:
    """The profile's tolerance rules for the sweep as plain data (sent to the worker that plans)."""
    if profile is None:
        return None
    device_wide = {short: kinds["ops"] for short, kinds in profile.tolerances.items() if "ops" in kinds}
    return {"ops": device_wide, "op_tolerances": dict(profile.op_tolerances)}


def apply_tolerances(tasks: list[Task], rules: dict[str, Any] | None) -> int:
    """Set each task's tolerance from the profile's rules (:func:`tolerance_rules`); returns how many changed."""
    if not rules:
        return 0
    from .compare import default_tolerance_values

    changed = 0
    for task in tasks:
        short = _short(task.dtype)
        if short is None:
            continue
        atol, rtol = task.atol, task.rtol
        device_wide = rules["ops"].get(short)
        if device_wide:
            base_atol, base_rtol = default_tolerance_values(task.dtype)
            atol = max(device_wide["atol"], base_atol if atol is None else atol)
            rtol = max(device_wide["rtol"], base_rtol if rtol is None else rtol)
        for pattern, per_dtype in rules["op_tolerances"].items():
            if fnmatch.fnmatchcase(task.name, pattern) and short in per_dtype:
                atol, rtol = per_dtype[short]["atol"], per_dtype[short]["rtol"]
        if (atol, rtol) != (task.atol, task.rtol):
            task.atol, task.rtol = atol, rtol
            changed += 1
    return changed


def check_claims(rows: list[Any], profile: Any) -> dict[str, dict[str, Any]]:
    """Each dtype the profile claims: how many of its compared operators passed, and the verdict
    (``supported``, ``claim-contradicted``, or ``not-swept``)."""
    if profile is None:
        return {}
    rates = pass_rates(rows)
    verdicts: dict[str, dict[str, Any]] = {}
    for short in profile.capabilities.get("dtypes") or []:
        name = PROFILE_DTYPES.get(short, short)
        rate = rates.get(name)
        if not rate or not rate["compared"]:
            verdicts[name] = {"verdict": "not-swept", "passed": 0, "compared": 0}
            continue
        share = rate["passed"] / rate["compared"]
        verdicts[name] = {"verdict": "supported" if share >= CONTRADICTED else "claim-contradicted",
                          "passed": rate["passed"], "compared": rate["compared"], "share": share}
    return verdicts
