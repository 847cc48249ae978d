"""Precision names: the values of ``mixed_precision`` everywhere (Accelerator, launcher, config file)."""

from __future__ import annotations

__all__ = ["PRECISIONS", "check_precision"]

#: Accelerate's ``mixed_precision`` values, in the order ``accelerate launch --mixed_precision`` lists them
PRECISIONS: tuple[str, ...] = ("no", "fp16", "bf16", "fp8")


def check_precision(value: object, what: str = "mixed_precision") -> str:
    """``value`` as a precision name (lower-cased); a ValueError naming ``what`` and the choices otherwise."""
    text = str(value).strip().lower() if value is not None else "no"
    if text not in PRECISIONS:
        raise ValueError(f"{what} must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return text
