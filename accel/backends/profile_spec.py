"""What a device profile is: its hooks and capability areas, :class:`DeviceProfile`, and its errors.

Shared by the loader (:mod:`accel.backends.profile_load`) and the backend built from a profile
(:mod:`accel.backends.profile`), so that neither depends on the other for these.
"""

from __future__ import annotations

import difflib
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from accel.facts.yaml_safe import preview

from .base import BackendError

__all__ = ["CAPABILITY_AREAS", "HOOKS", "DeviceProfile", "ProfileError", "canonical_dtype", "resolve_callable"]

#: the hooks a profile may name (``comm_backend`` is a collective backend's name, ``deepspeed_accelerator`` the
#: ``"module:Class"`` of the DeepSpeed accelerator the device brings, the rest callables)
HOOKS = ("seed", "empty_cache", "device_count", "synchronize", "memory_allocated", "max_memory_allocated",
         "reset_peak_memory_stats", "get_rng_state", "set_rng_state", "is_available")
_STRING_HOOKS = ("comm_backend", "deepspeed_accelerator")

#: capability areas a profile can claim, and the key of ``capabilities`` each comes from
CAPABILITY_AREAS = ("fp16", "bf16", "fp8", "fp16_autocast", "bf16_autocast", "fp8_autocast", "collectives",
                    "compile", "memory_stats", "determinism", "device_count")

#: dtype spellings accepted in ``dtypes``, ``autocast`` and ``tolerances`` -> the canonical short name
_DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8",
    "fp64": "fp64", "float64": "fp64", "double": "fp64",
}


class ProfileError(BackendError, ValueError):
    """A profile that cannot be used; the message names the file, the line and the key."""

    def __init__(self, message: str, path: Any = None, line: int | None = None, key: str | None = None):
        self.path, self.line, self.key, self.problem = path, line, key, message
        where = ", ".join(p for p in (f"device profile {path}" if path else "", f"line {line}" if line else "") if p)
        text = f"{key}: {message}" if key else message
        super().__init__(f"{where}: {text}" if where else text)


def _suggest(word: str, options: Any) -> str:
    match = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else f" (known: {', '.join(map(str, options))})"


def canonical_dtype(value: Any) -> str:
    """``"bf16"`` for ``torch.bfloat16``, ``"bfloat16"`` or ``"bf16"``; a ValueError names unknown ones."""
    text = str(value).removeprefix("torch.").strip().lower()
    if text not in _DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {preview(value)}{_suggest(text, sorted(set(_DTYPE_ALIASES)))}")
    return _DTYPE_ALIASES[text]


def resolve_callable(spec: Any, what: str = "hook") -> Callable[..., Any]:
    """The callable ``spec`` names: ``"pkg.mod:func"``, ``"pkg.mod.func"`` (or a callable, returned as is)."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not re.fullmatch(r"[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?", spec.strip()):
        raise ValueError(f"{what}: expected an importable name such as 'torch:manual_seed' or 'torch.manual_seed', got {spec!r}")
    spec = spec.strip()
    if ":" in spec:
        module_name, attr_path = spec.split(":", 1)
    else:
        module_name, _, attr_path = spec.rpartition(".")
        if not module_name:
            raise ValueError(f"{what}: {spec!r} names no module; write 'module:function' or 'module.function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what}: cannot import {module_name!r} ({exc})") from None
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            options = [n for n in dir(obj) if not n.startswith("_")]
            raise ValueError(f"{what}: {module_name} has no {attr_path!r}{_suggest(part, options) if options else ''}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{what}: {spec!r} is not callable ({type(obj).__name__})")
    return obj


# ---------------------------------------------------------------------------- the profile
@dataclass
class DeviceProfile:
    """A validated device profile (what :func:`load_profile` returns)."""

    name: str
    device_type: str
    module: str | None = None
    #: optional device facts: start_method, visible_devices_env, distributed_type, oom_messages, ranks_share_device
    device_extra: dict[str, Any] = field(default_factory=dict)
    #: hook name -> importable name (str) or, from a spec file, the callable itself (None: explicitly none)
    hooks: dict[str, Any] = field(default_factory=dict)
    comm_backend: str | None = None
    #: ``"module:Class"`` of the device's own DeepSpeed accelerator (``Backend.deepspeed_accelerator``), or None
    deepspeed_accelerator: str | None = None
    #: the declared claims: dtypes, autocast, collectives, compile, memory_stats, deterministic, device_count
    capabilities: dict[str, Any] = field(default_factory=dict)
    #: canonical dtype -> kind -> {"rtol": ..., "atol": ...}
    tolerances: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    #: known-issue entries as written (the harness validates them), with their line numbers
    known_issues: list[dict[str, Any]] = field(default_factory=list)
    #: operator pattern -> dtype -> {"rtol", "atol"}: the operator sweep's per-operator tolerances
    op_tolerances: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    known_issue_lines: list[int | None] = field(default_factory=list)
    #: the model suite's gates: mode -> {"quality"?, "steps"?} (the ``models: gates:`` section)
    model_gates: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the profile's own version (for the run fingerprint)
    version: str | None = None
    path: Path | None = None
    sha256: str | None = None
    format: str = "yaml"

    def declared(self) -> dict[str, Any]:
        """Claim per capability area: True/False, a device count, or None where the profile says nothing."""
        caps = self.capabilities
        dtypes = caps.get("dtypes")
        autocast = caps.get("autocast")
        out: dict[str, Any] = {}
        for d in ("fp16", "bf16", "fp8"):
            out[d] = None if dtypes is None else d in dtypes
            out[f"{d}_autocast"] = None if autocast is None else d in autocast
        out["collectives"] = caps.get("collectives")
        out["compile"] = caps.get("compile")
        out["memory_stats"] = caps.get("memory_stats")
        out["determinism"] = caps.get("deterministic")
        out["device_count"] = caps.get("device_count")
        return out

    def tolerance(self, dtype: Any, kind: str, default: Mapping[str, float] | None = None) -> dict[str, float]:
        """``{"rtol", "atol"}`` the profile sets for ``dtype`` and ``kind`` of check, else ``default``."""
        found = self.tolerances.get(canonical_dtype(dtype), {}).get(kind)
        if found is not None:
            return dict(found)
        if default is None:
            raise KeyError(f"profile {self.name!r} sets no tolerance for {canonical_dtype(dtype)}/{kind} and no default was given")
        return dict(default)

    def model_gate(self, mode: str, default: Mapping[str, float]) -> dict[str, float]:
        """The model suite's gate factors for ``mode``: ``default`` with what the profile sets for it on top."""
        return {**default, **self.model_gates.get(mode, {})}
