"""Claims about the hardware drawn from benchmark figures, made only when the figures' noise allows.

A dtype's matmul far slower than float32's on the same device means the device has no fast kernels
for that dtype. That is a statement about the hardware, so it is made only from two figures that are
each steady: both spreads known and at most :data:`accel_reports.analyse.noise.NOISY_SPREAD` (the same
threshold that calls a benchmark too noisy to judge). Otherwise the figure is said to be too noisy
to conclude, with the spreads. The matmul benchmark writes its note with :func:`slow_kernel_note`
(against its own float32 reference timing); the report finds the claim in a note
(:func:`claimed_ratio`) and makes it again from the figures it shows, the dtype's and the float32
row's of the same benchmark, so a note that ignored the noise (an older file) is never shown as a
conclusion.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .noise import NOISY_SPREAD, is_too_noisy, spread_text

__all__ = ["SLOW_FACTOR", "claimed_ratio", "slow_kernel_note"]

#: a dtype's matmul this many times slower per call than float32's has no fast kernels on the device
SLOW_FACTOR = 8.0


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def slow_kernel_note(dtype: str, ratio: Any, spread: Any, float32_spread: Any) -> str | None:
    """The note on a dtype's matmul figure: the claim that the device has no fast kernels for it when
    it is at least :data:`SLOW_FACTOR` times slower per call than float32 and both figures are steady;
    "too noisy to conclude" with the spreads when it looks that slow but either spread is past
    :data:`~accel_reports.analyse.noise.NOISY_SPREAD` or unknown; None when it does not look that slow (or
    for float32 itself, or without a ratio)."""
    ratio = _number(ratio)
    if dtype == "float32" or ratio is None or ratio < SLOW_FACTOR:
        return None
    own, reference = _number(spread), _number(float32_spread)
    if own is None or reference is None or is_too_noisy(own) or is_too_noisy(reference):
        return (f"{dtype} matmul vs float32: too noisy to conclude (spread {spread_text(own)}, float32 "
                f"reference {spread_text(reference)}; a claim about the kernels needs both at most "
                f"{NOISY_SPREAD:.0%})")
    return (f"{dtype} matmul is {ratio:.0f}× slower than float32 here: the device has no fast "
            f"{dtype} matmul kernels, so this figure measures a fallback path")


_CLAIM = re.compile(r"(\S+) matmul is (\d+(?:\.\d+)?)× slower than float32 here: the device has no fast ")


def claimed_ratio(note: Any) -> float | None:
    """The ratio a note claims when it is :func:`slow_kernel_note`'s claim about the kernels (None for
    any other note), so the report can check the claim against the figures it shows."""
    match = _CLAIM.match(note) if isinstance(note, str) else None
    return float(match.group(2)) if match else None
