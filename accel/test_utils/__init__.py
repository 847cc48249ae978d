"""Helpers for tests of code that uses accel, with Accelerate's names (``accelerate.test_utils``).

``torch_device``, ``device_count``, ``memory_allocated_func`` and ``DEFAULT_LAUNCH_COMMAND`` are
computed from the active backend on first use.
"""

from __future__ import annotations

from typing import Any

from . import testing as _testing
from .testing import *  # noqa: F401,F403 - the decorators and helpers, listed in testing.__all__
from .testing import REQUIREMENTS, Requirement, evaluate_requirement, require_torch_min_version, skip_unless  # noqa: F401
from .training import RegressionDataset, RegressionModel  # noqa: F401

__all__ = [*_testing.__all__, "RegressionDataset", "RegressionModel",
           "torch_device", "device_count", "memory_allocated_func", "DEFAULT_LAUNCH_COMMAND"]

_LAZY = ("torch_device", "device_count", "memory_allocated_func", "DEFAULT_LAUNCH_COMMAND")
#: accel's own multi-process check scripts, importable as in Accelerate (``from accel.test_utils import test_ops``)
_SCRIPTS = ("test_script", "test_sync", "test_ops")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(_testing, name)
        globals()[name] = value
        return value
    if name in _SCRIPTS:
        import importlib

        module = importlib.import_module(f"{__name__}.scripts.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SCRIPTS))
