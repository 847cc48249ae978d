"""Backend names under their earlier import path; the table lives in :mod:`accel.facts.backends`."""

from __future__ import annotations

from .facts.backends import BUILTIN_BACKENDS

__all__ = ["BUILTIN_BACKENDS"]
