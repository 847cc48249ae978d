"""Version comparisons with Accelerate's module path (``accelerate.utils.versions``).

The functions live in :mod:`accel.utils.imports`; this module gives them Accelerate's import path.
"""

from __future__ import annotations

from .imports import compare_versions, is_torch_version

__all__ = ["compare_versions", "is_torch_version"]
