"""The model suite's modes and the gate factors each is judged with: one table.

Why here: the harness's model suite judges each mode with these factors, and a device profile's
``models: gates:`` section may override them, so the profile loader (in ``accel.backends``, below
the harness) must know the mode names and what a valid factor is. Torch-free.

A mode's gates compare its run with the host's fp32 reference of the same model: final accuracy at
least ``quality`` x the reference's, steps to the target at most ``steps`` x the reference's.
Reduced precision rounds every activation and gradient, so it gets room in the steps gate (fp8,
which rounds most, also in the quality gate): about ten times what the host measured for bf16 and
fp16, and half again for fp8 (docs/models.md has the figures). The full-precision modes keep the
strict factors.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GATE_KEYS", "MODEL_MODES", "MODE_GATES", "MODE_LABELS", "gate_factor_problem"]

#: mode -> {"quality": factor, "steps": factor}, the suite's default gates, in report column order
MODE_GATES: dict[str, dict[str, float]] = {
    "single": {"quality": 0.99, "steps": 1.05},
    "ddp": {"quality": 0.99, "steps": 1.05},
    "fsdp2": {"quality": 0.99, "steps": 1.05},
    "zero2": {"quality": 0.99, "steps": 1.05},
    "zero3": {"quality": 0.99, "steps": 1.05},
    "compile": {"quality": 0.99, "steps": 1.05},
    "bf16": {"quality": 0.99, "steps": 1.15},
    "fp16": {"quality": 0.99, "steps": 1.1},
    "fp8": {"quality": 0.97, "steps": 1.35},
}
#: the mode names, in report column order
MODEL_MODES: tuple[str, ...] = tuple(MODE_GATES)
#: mode -> how reports name it (column headers, the support matrix)
MODE_LABELS: dict[str, str] = {
    "single": "1 process", "ddp": "DDP × 2", "fsdp2": "FSDP2 × 2", "zero2": "ZeRO-2 × 2", "zero3": "ZeRO-3 × 2",
    "compile": "torch.compile", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8",
}
#: the factors a mode's gates have
GATE_KEYS: tuple[str, ...] = ("quality", "steps")


def gate_factor_problem(key: str, value: Any) -> str | None:
    """What is wrong with ``value`` as gate factor ``key`` (None: nothing): quality in (0, 1], steps >= 1."""
    if key not in GATE_KEYS:
        return f"unknown gate {key!r} (known: {', '.join(GATE_KEYS)})"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return f"expected a number, got {value!r}"
    if key == "quality" and not 0 < value <= 1:
        return f"the quality factor must be in (0, 1] (a share of the reference's accuracy), got {value!r}"
    if key == "steps" and not 1 <= value < float("inf"):
        return f"the steps factor must be a finite number of at least 1 (a multiple of the reference's steps), got {value!r}"
    return None
