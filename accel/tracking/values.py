"""What trackers accept as logged values: scalars, strings, one-element tensors; checked and converted once."""

from __future__ import annotations

import json
import math
import numbers
import os
from enum import Enum
from typing import Any


def _plain(key: str, value: Any, nested: bool) -> Any:
    """``value`` as a JSON-ready Python value, or a TypeError naming ``key``.

    Tensors and numpy values with one element become Python numbers; with ``nested`` lists,
    tuples and dicts are converted item by item.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)  # a str subclass (e.g. a str enum) as its plain text
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Enum):
        return _plain(key, value.value, nested)
    numel = _element_count(value)
    if numel is not None:
        if numel != 1:
            shape = tuple(getattr(value, "shape", ()))
            raise TypeError(
                f"cannot log {key!r}: a {type(value).__name__} of shape {shape} is not a scalar; "
                "log one number per key (e.g. tensor.mean())"
            )
        return _plain(key, value.item(), nested)
    if nested and isinstance(value, dict):
        return {_key(k, key): _plain(f"{key}/{k}", v, nested) for k, v in value.items()}
    if nested and isinstance(value, (list, tuple)):
        return [_plain(f"{key}[{i}]", v, nested) for i, v in enumerate(value)]
    raise TypeError(
        f"cannot log {key!r}: values of type {type(value).__module__}.{type(value).__qualname__} are not "
        "serialisable; log numbers, strings, booleans, None or one-element tensors"
    )


def _element_count(value: Any) -> int | None:
    """Element count of a tensor or numpy array/scalar, None for anything else."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel()
    module = type(value).__module__
    if module == "numpy" or module.startswith("numpy."):
        size = getattr(value, "size", None)
        if isinstance(size, int) and hasattr(value, "item"):
            return size
    return None


def _key(key: Any, parent: str | None = None) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, (int, Enum)) and not isinstance(key, bool):
        return str(key.value if isinstance(key, Enum) else key)
    where = f" inside {parent!r}" if parent else ""
    raise TypeError(f"tracker keys must be strings; got {key!r} ({type(key).__name__}){where}")


def _check_mapping(values: Any, what: str) -> None:
    if not isinstance(values, dict):
        raise TypeError(f"{what} takes a dict of name -> value, got {type(values).__name__}")


def to_serialisable(values: dict, nested: bool = True) -> dict[str, Any]:
    """``values`` with every value converted for JSON (see the module docstring)."""
    _check_mapping(values, "log")
    return {_key(k): _plain(_key(k), v, nested) for k, v in values.items()}


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``parent/child`` keys; lists as JSON text (one CSV cell each)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, prefix=f"{name}/"))
        elif isinstance(value, list):
            flat[name] = json.dumps(value)
        else:
            flat[name] = value
    return flat


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # nan, inf, -inf: what float() reads back
    if isinstance(value, float):
        return repr(value)
    return value


def _step(step: Any) -> int | None:
    if step is None:
        return None
    if isinstance(step, numbers.Integral) and not isinstance(step, bool):
        return int(step)
    if _element_count(step) == 1:
        return _step(step.item())
    raise TypeError(f"step must be an int or None, got {step!r}")
