"""Utilities with Accelerate's names (``accel.utils.set_seed``, ``accel.utils.gather``, ...).

Names resolve lazily so ``import accel.utils`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {}


def _export(module: str, *names: str) -> None:
    for name in names:
        _LAZY[name] = module


_export(
    "accel.utils.dataclasses",
    "ComputeEnvironment", "DataLoaderConfiguration", "DistributedType", "GradientAccumulationPlugin",
    "InitProcessGroupKwargs", "KwargsHandler", "PrecisionType", "RNGType",
)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'accel.utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
