"""A device profile: one declarative file that makes a backend, with claims the harness checks.

A vendor describes its device in YAML or TOML (or reuses a transformers-style ``spec.py``) instead of
writing a :class:`~accel.backends.base.Backend` subclass::

    device: {name: mycpu, device_type: cpu}
    hooks: {seed: "torch:manual_seed", get_rng_state: "torch:get_rng_state"}
    capabilities: {dtypes: [fp32, bf16], autocast: [bf16], collectives: true}
    tolerances: {bf16: {training: 0.05}}
    known_issues: [...]

:func:`load_profile` validates the file (errors name the file, line and key, with a "did you mean")
and :class:`ProfileBackend` turns it into a backend. A hook the profile does not name is filled, in
order, from ``torch.accelerator`` (when it drives the profile's device type), from the device module
(``torch.<module>``) and from accel's built-in backend for the same device type. ``docs/profile.md``
is the reference for every field.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from accel.facts import yaml_safe
from accel.facts.yaml_safe import preview

from .base import Availability, Backend, BackendError, Capability, DeviceProperties
from .device_module import properties_from_module
from .hook_check import HookCheckError, check_hooks

__all__ = [
    "CAPABILITY_AREAS",
    "HOOKS",
    "DeviceProfile",
    "ProfileBackend",
    "ProfileError",
    "canonical_dtype",
    "load_profile",
    "resolve_callable",
    "spec_no_op",
]

#: the hooks a profile may name (``comm_backend`` is a collective backend's name, the rest callables)
HOOKS = ("seed", "empty_cache", "device_count", "synchronize", "memory_allocated", "max_memory_allocated",
         "reset_peak_memory_stats", "get_rng_state", "set_rng_state", "is_available")
_STRING_HOOKS = ("comm_backend",)

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

#: transformers' device spec names (diffusers adds SUPPORTS_TRAINING) -> profile hook
_SPEC_NAMES = {
    "MANUAL_SEED_FN": "seed", "EMPTY_CACHE_FN": "empty_cache", "DEVICE_COUNT_FN": "device_count",
    "SYNCHRONIZE_FN": "synchronize", "MEMORY_ALLOCATED_FN": "memory_allocated",
    "MAX_MEMORY_ALLOCATED_FN": "max_memory_allocated", "RESET_PEAK_MEMORY_STATS_FN": "reset_peak_memory_stats",
    "RESET_MAX_MEMORY_ALLOCATED_FN": "reset_peak_memory_stats",
}

#: a device spec's ``None`` means what it means in transformers (its dispatch returns None instead of
#: calling): these actions do nothing; a count or a statistic is left to torch (the hook is omitted)
_SPEC_NONE_IS_NO_OP = ("seed", "empty_cache", "synchronize", "reset_peak_memory_stats")


def spec_no_op(*args: Any, **kwargs: Any) -> None:
    """A device spec's ``None`` action (``EMPTY_CACHE_FN = None``): nothing to do on this device."""
    return None


# module attribute names that stand in for a hook the profile leaves out
_MODULE_NAMES = {"seed": ("manual_seed_all", "manual_seed")}


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
    #: the declared claims: dtypes, autocast, collectives, compile, memory_stats, deterministic, device_count
    capabilities: dict[str, Any] = field(default_factory=dict)
    #: canonical dtype -> kind -> {"rtol": ..., "atol": ...}
    tolerances: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    #: known-issue entries as written (the harness validates them), with their line numbers
    known_issues: list[dict[str, Any]] = field(default_factory=list)
    #: operator pattern -> dtype -> {"rtol", "atol"}: the operator sweep's per-operator tolerances
    op_tolerances: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    known_issue_lines: list[int | None] = field(default_factory=list)
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


# ---------------------------------------------------------------------------- loading
def load_profile(path: Any) -> DeviceProfile:
    """Load and validate a profile: ``.yaml``/``.yml``, ``.toml`` or a transformers-style ``.py`` spec."""
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            yaml_safe.check_size(path)
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ProfileError("file not found", path) from None
    except OSError as exc:
        raise ProfileError(f"cannot be read: {exc}", path) from None
    except yaml_safe.YamlError as exc:
        raise ProfileError(exc.problem, path) from None
    if suffix == ".py":
        profile = _from_spec(path)
    elif suffix in (".yaml", ".yml"):
        data, lines = _read_yaml(raw.decode("utf-8", errors="replace"), path)
        profile = _validate(data, lines, path, "yaml")
    elif suffix == ".toml":
        data, lines = _read_toml(raw.decode("utf-8", errors="replace"), path)
        profile = _validate(data, lines, path, "toml")
    else:
        raise ProfileError(f"unknown profile format {suffix or '(no suffix)'!r}; use .yaml, .yml, .toml or a .py device spec", path)
    profile.path = path
    profile.sha256 = hashlib.sha256(raw).hexdigest()
    return profile


def _read_yaml(text: str, path: Path) -> tuple[Any, dict[tuple, int]]:
    try:
        root = yaml_safe.compose(text, path)
        lines = yaml_safe.key_lines(root)  # before construct, which rewrites merge keys in place
        data = yaml_safe.construct(root, path)
    except yaml_safe.YamlError as exc:
        raise ProfileError(exc.problem if exc.refused else f"not valid YAML: {exc.problem}", path, exc.line) from None
    return data, lines


def _read_toml(text: str, path: Path) -> tuple[Any, dict[tuple, int]]:
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise ProfileError(f"not valid TOML: {exc}", path, int(match.group(1)) if match else None) from None
    lines: dict[tuple, int] = {}
    table: tuple = ()
    counts: dict[tuple, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        header = re.fullmatch(r"\[\[\s*([\w.\-]+)\s*\]\]", stripped) or re.fullmatch(r"\[\s*([\w.\-]+)\s*\]", stripped)
        if header:
            table = tuple(header.group(1).split("."))
            if stripped.startswith("[["):
                index = counts[table] = counts.get(table, -1) + 1
                table = table + (index,)
            lines.setdefault(table, number)
            continue
        key = re.match(r"([\w\-]+|\"[^\"]+\")\s*=", stripped)
        if key:
            lines.setdefault(table + (key.group(1).strip('"'),), number)
    return data, lines


def _line(lines: Mapping[tuple, int], where: tuple) -> int | None:
    while where:
        if where in lines:
            return lines[where]
        where = where[:-1]
    return lines.get(())


_SECTIONS = ("version", "device", "hooks", "capabilities", "tolerances", "op_tolerances", "known_issues")
_DEVICE_KEYS = ("name", "device_type", "module", "start_method", "visible_devices_env", "distributed_type",
                "oom_messages", "ranks_share_device")
_CAPABILITY_KEYS = ("dtypes", "autocast", "collectives", "compile", "memory_stats", "deterministic", "device_count")


def _validate(data: Any, lines: Mapping[tuple, int], path: Path | None, fmt: str) -> DeviceProfile:
    def fail(where: tuple, message: str) -> ProfileError:
        key = ".".join(str(p) for p in where) or None
        return ProfileError(message, path, _line(lines, where), key)

    def mapping(where: tuple, value: Any, allowed: tuple | None = None) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise fail(where, f"expected a mapping, got {type(value).__name__} {preview(value)}")
        for key in value:
            if allowed is not None and key not in allowed:
                raise fail(where + (str(key),), f"unknown key{_suggest(key, allowed)}")
        return dict(value)

    def text(where: tuple, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise fail(where, f"expected a non-empty string, got {preview(value)}")
        return value.strip()

    def flag(where: tuple, value: Any) -> bool:
        if not isinstance(value, bool):
            raise fail(where, f"expected true or false, got {preview(value)}")
        return value

    def dtype_list(where: tuple, value: Any) -> list[str]:
        if not isinstance(value, list):
            raise fail(where, f"expected a list of dtypes such as [fp32, bf16], got {preview(value)}")
        out = []
        for i, item in enumerate(value):
            try:
                out.append(canonical_dtype(item))
            except ValueError as exc:
                raise fail(where + (i,), str(exc)) from None
        return out

    top = mapping((), data if data is not None else {}, _SECTIONS)
    if "device" not in top:
        raise fail((), "the profile needs a 'device' section with at least name and device_type")
    device = mapping(("device",), top["device"], _DEVICE_KEYS)
    for required in ("name", "device_type"):
        if required not in device:
            raise fail(("device",), f"missing required key {required!r}")
    name = text(("device", "name"), device.pop("name"))
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise fail(("device", "name"), f"backend names are lower-case words (they are pytest markers), got {preview(name)}")
    device_type = text(("device", "device_type"), device.pop("device_type"))
    module = text(("device", "module"), device.pop("module")) if device.get("module") is not None else None
    extra: dict[str, Any] = {}
    if "start_method" in device:
        method = text(("device", "start_method"), device["start_method"])
        if method not in ("fork", "spawn", "forkserver"):
            raise fail(("device", "start_method"), f"expected fork, spawn or forkserver{_suggest(method, ('fork', 'spawn', 'forkserver'))}")
        extra["start_method"] = method
    for key in ("visible_devices_env", "distributed_type"):
        if key in device:
            extra[key] = text(("device", key), device[key])
    if "oom_messages" in device:
        messages = device["oom_messages"]
        if not isinstance(messages, list) or not all(isinstance(m, str) and m for m in messages):
            raise fail(("device", "oom_messages"), f"expected a list of non-empty strings, got {preview(messages)}")
        extra["oom_messages"] = tuple(messages)
    if "ranks_share_device" in device:
        extra["ranks_share_device"] = flag(("device", "ranks_share_device"), device["ranks_share_device"])

    hooks: dict[str, Any] = {}
    comm_backend = None
    for key, value in mapping(("hooks",), top.get("hooks") or {}, HOOKS + _STRING_HOOKS).items():
        where = ("hooks", key)
        if key == "comm_backend":
            comm_backend = text(where, value)
            continue
        hooks[key] = text(where, value)
    if path is not None:  # a profile is code: its hooks run in a child first (see hook_check)
        try:
            check_hooks(path, hooks)
        except HookCheckError as exc:
            raise fail(("hooks", exc.hook) if exc.hook else ("hooks",), str(exc)) from None
    for key, spec in hooks.items():
        try:
            resolve_callable(spec, f"hooks.{key}")
        except ValueError as exc:
            raise fail(("hooks", key), str(exc).split(": ", 1)[1]) from None

    capabilities: dict[str, Any] = {}
    for key, value in mapping(("capabilities",), top.get("capabilities") or {}, _CAPABILITY_KEYS).items():
        where = ("capabilities", key)
        if key in ("dtypes", "autocast"):
            capabilities[key] = dtype_list(where, value)
        elif key == "device_count":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise fail(where, f"expected a number of devices (an integer >= 0), got {preview(value)}")
            capabilities[key] = value
        else:
            capabilities[key] = flag(where, value)

    tolerances: dict[str, dict[str, dict[str, float]]] = {}
    for dtype_key, kinds in mapping(("tolerances",), top.get("tolerances") or {}).items():
        where = ("tolerances", dtype_key)
        try:
            dtype = canonical_dtype(dtype_key)
        except ValueError as exc:
            raise fail(where, str(exc)) from None
        for kind, value in mapping(where, kinds).items():
            here = where + (kind,)
            if not re.fullmatch(r"[a-z][a-z0-9_]*", str(kind)):
                raise fail(here, "a kind of check is a lower-case word such as training or forward")
            tolerances.setdefault(dtype, {})[str(kind)] = _tolerance_value(value, lambda m, h=here: fail(h, m))

    op_tolerances: dict[str, dict[str, dict[str, float]]] = {}
    for pattern, per_dtype in mapping(("op_tolerances",), top.get("op_tolerances") or {}).items():
        where = ("op_tolerances", pattern)
        for dtype_key, value in mapping(where, per_dtype).items():
            here = where + (dtype_key,)
            try:
                dtype = canonical_dtype(dtype_key)
            except ValueError as exc:
                raise fail(here, str(exc)) from None
            op_tolerances.setdefault(str(pattern), {})[dtype] = _tolerance_value(value, lambda m, h=here: fail(h, m))

    issues = top.get("known_issues") or []
    if not isinstance(issues, list):
        raise fail(("known_issues",), f"expected a list of known-issue entries, got {type(issues).__name__}")
    version = top.get("version")
    if version is not None and not isinstance(version, (str, int, float)):
        raise fail(("version",), f"expected a version string, got {preview(version)}")
    return DeviceProfile(
        name=name, device_type=device_type, module=module, device_extra=extra, hooks=hooks,
        comm_backend=comm_backend, capabilities=capabilities, tolerances=tolerances, op_tolerances=op_tolerances,
        known_issues=[dict(i) if isinstance(i, Mapping) else i for i in issues],
        known_issue_lines=[_line(lines, ("known_issues", i)) for i in range(len(issues))],
        version=None if version is None else str(version), format=fmt,
    )


def _tolerance_value(value: Any, fail: Callable[[str], ProfileError]) -> dict[str, float]:
    def number(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise fail(f"expected a non-negative number, got {preview(v)}")
        return float(v)

    if isinstance(value, Mapping):
        for key in value:
            if key not in ("rtol", "atol"):
                raise fail(f"unknown key {preview(key)}{_suggest(key, ('rtol', 'atol'))}")
        if set(value) != {"rtol", "atol"}:
            raise fail("give both rtol and atol, or one number for both")
        return {"rtol": number(value["rtol"]), "atol": number(value["atol"])}
    tol = number(value)
    return {"rtol": tol, "atol": tol}


def _from_spec(path: Path) -> DeviceProfile:
    """A transformers-style device spec (``DEVICE_NAME`` and optional ``*_FN`` callables) as a profile."""
    try:
        check_hooks(path, spec_file=True)  # executed and its functions called in a child first
    except HookCheckError as exc:
        raise ProfileError(str(exc), path, key=_spec_key(exc.hook)) from None
    spec = importlib.util.spec_from_file_location(f"_accel_device_spec_{abs(hash(str(path.resolve())))}", path)
    if spec is None or spec.loader is None:
        raise ProfileError("cannot be imported as a Python device spec", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ProfileError(f"importing the device spec failed: {type(exc).__name__}: {exc}", path) from None
    names = {k: v for k, v in vars(module).items() if k.isupper()}
    device_name = names.get("DEVICE_NAME")
    if not isinstance(device_name, str) or not device_name.strip():
        raise ProfileError(f"a device spec must set DEVICE_NAME to a device string such as 'cpu' or 'npu', got {device_name!r}",
                           path, key="DEVICE_NAME")
    device_type = torch.device(device_name.strip()).type
    hooks: dict[str, Any] = {}
    for key, value in names.items():
        if key == "DEVICE_NAME" or key == "SUPPORTS_TRAINING":
            continue
        known = sorted(_SPEC_NAMES) + ["DEVICE_NAME", "SUPPORTS_TRAINING"]
        if key not in _SPEC_NAMES and (key.endswith("_FN") or difflib.get_close_matches(key, known, n=1, cutoff=0.85)):
            # other upper-case names are the spec's own constants; a near miss of ours is a typo
            raise ProfileError(f"unknown device spec name{_suggest(key, known)}", path, key=key)
        if key in _SPEC_NAMES:
            if value is not None and not callable(value):
                raise ProfileError(f"expected a function or None, got {value!r}", path, key=key)
            hook = _SPEC_NAMES[key]
            if value is None:
                if hook in _SPEC_NONE_IS_NO_OP:
                    hooks[hook] = spec_no_op
                continue  # DEVICE_COUNT_FN = None (valid for transformers): torch's own count is used
            hooks[hook] = value
    capabilities: dict[str, Any] = {}
    training = names.get("SUPPORTS_TRAINING")
    if training is not None and not isinstance(training, bool):
        raise ProfileError(f"expected True or False, got {training!r}", path, key="SUPPORTS_TRAINING")
    extra = {"supports_training": training} if training is not None else {}
    return DeviceProfile(name=device_type, device_type=device_type, hooks=hooks, capabilities=capabilities,
                         device_extra=extra, format="spec")


def _spec_key(hook: str | None) -> str | None:
    """The device spec's name (``MANUAL_SEED_FN``) for a profile hook name (``seed``)."""
    return next((k for k, v in _SPEC_NAMES.items() if v == hook), None) if hook else None


# ---------------------------------------------------------------------------- the backend
_NOT_FOUND = object()


class ProfileBackend(Backend):
    """A backend made from a :class:`DeviceProfile` alone, no plug-in code.

    Each operation uses the profile's hook; a hook it leaves out comes from ``torch.accelerator``
    (when that drives the profile's device type), then the device module, then accel's built-in
    backend for the device type. An operation none of them provides raises
    :class:`~accel.backends.base.UnsupportedFeatureError` naming the missing hook.
    """

    priority = 50  # a profile asked for explicitly comes before the detected built-ins

    def __init__(self, profile: DeviceProfile, torch_version: Any = None):
        super().__init__(torch_version)
        self.profile = profile
        self.name = profile.name
        self.device_type = profile.device_type
        extra = profile.device_extra
        self._use_host_timers: bool | None = None  # None: decided by what provides events (see use_host_timers)
        base = self.base
        for attr in ("start_method", "visible_devices_env", "distributed_type", "oom_messages", "use_host_timers",
                     "compile_backend", "memory_is_host"):
            if attr in extra:
                setattr(self, attr, extra[attr])
            elif base is not None:
                setattr(self, attr, getattr(base, attr))
        if "ranks_share_device" in extra:
            self.ranks_share_device = extra["ranks_share_device"]

    @functools.cached_property
    def base(self) -> Backend | None:
        """accel's built-in backend for this device type, or None (the last source of missing hooks)."""
        from .builtin import builtin_factories

        for factory in builtin_factories():
            if getattr(factory, "device_type", None) == self.device_type:
                return factory(self._torch_version) if isinstance(factory, type) else factory()
        return None

    @property
    def module(self) -> Any:
        """``torch.<module>`` (the profile's ``device.module``, else the device type), or None.

        Found once it exists: a plug-in may register it only when the profile's ``is_available`` hook
        loads the device, so a lookup before that is not remembered."""
        found = self.__dict__.get("_module")
        if found is None:
            found = getattr(torch, self.module_name, None)
            if found is not None:
                self.__dict__["_module"] = found
        return found

    @property
    def module_name(self) -> str:
        """The name of the device module under ``torch`` (``device.module``, else the device type)."""
        return self.profile.module or self.device_type

    @property
    def use_host_timers(self) -> bool:
        """Whether the timer reads the host clock: as the built-in backend for the device type says, else
        True exactly when the device module has no ``Event`` to time with."""
        if self._use_host_timers is not None:
            return self._use_host_timers
        return self._module_callable("Event") is None

    @use_host_timers.setter
    def use_host_timers(self, value: bool) -> None:
        self._use_host_timers = bool(value)

    def _module_callable(self, attr: str) -> Callable[..., Any] | None:
        """``torch.<module>.<attr>`` when the device module has it and it is callable, else None."""
        found = getattr(self.module, attr, None) if self.module is not None else None
        return found if callable(found) else None

    def _from_module(self, attr: str, feature: str) -> Callable[..., Any]:
        """``torch.<module>.<attr>`` for ``feature`` where no built-in backend covers the device type; an
        UnsupportedFeatureError names what is missing otherwise."""
        found = self._module_callable(attr)
        if found is None:
            where = (f"torch.{self.module_name} has no {attr}" if self.module is not None
                     else f"torch has no {self.module_name} module")
            raise self.unsupported(feature, f"profile {self.profile.name!r}: no built-in backend for {self.device_type!r} "
                                            f"and {where}")
        return found

    @functools.cached_property
    def accelerator(self) -> Any:
        """``torch.accelerator`` when this torch has it and it drives the profile's device type."""
        acc = getattr(torch, "accelerator", None)
        try:
            current = acc.current_accelerator() if acc is not None else None
        except Exception:
            current = None
        return acc if current is not None and current.type == self.device_type else None

    @functools.lru_cache(maxsize=None)  # noqa: B019 - backends live for the process
    def hook(self, name: str) -> Any:
        """The callable behind ``name`` (see the class docstring), None when the profile says "none",
        or a missing marker when nothing provides it."""
        given = self.profile.hooks.get(name, _NOT_FOUND)
        if given is not _NOT_FOUND:
            return None if given is None else resolve_callable(given, f"hooks.{name}")
        attrs = _MODULE_NAMES.get(name, (name,))
        for source in (self.accelerator, self.module):
            for attr in attrs:
                fn = getattr(source, attr, None) if source is not None else None
                if callable(fn):
                    return fn
        return _NOT_FOUND

    def hook_source(self, name: str) -> str:
        """Where ``name`` comes from: "profile", "torch.accelerator", "torch.<module>", "built-in" or "none"."""
        if name in self.profile.hooks:
            return "profile"
        fn = self.hook(name)
        if fn is _NOT_FOUND:
            return "built-in" if self.base is not None else "none"
        for source, label in ((self.accelerator, "torch.accelerator"), (self.module, f"torch.{self.module_name}")):
            if source is not None and any(getattr(source, a, None) is fn for a in _MODULE_NAMES.get(name, (name,))):
                return label
        return "none"

    def _call(self, name: str, index: int | None, *args: Any, fallback: Callable[[], Any] | None = None,
              none_means: Any = _NOT_FOUND) -> Any:
        fn = self.hook(name)
        if fn is None:
            if none_means is not _NOT_FOUND:
                return none_means
            raise self.unsupported(name, f"profile {self.profile.name!r} sets hooks.{name} to none")
        if fn is _NOT_FOUND:
            if fallback is not None and self.base is not None:
                return fallback()
            raise self.unsupported(name, f"profile {self.profile.name!r} names no hooks.{name} and neither torch.accelerator "
                                         f"nor torch.{self.profile.module or self.device_type} provides one")
        if index is not None and _takes_argument(fn, len(args) + 1):
            return fn(*args, index)
        return fn(*args)

    # ------------------------------------------------------------------ probing and devices
    def _probe(self) -> Availability:
        source = self.hook("is_available")
        if callable(source):
            if not source():
                return Availability(False, f"profile {self.profile.name!r}: is_available() is False")
        elif self.base is not None and not self.base.is_available():
            return Availability(False, f"profile {self.profile.name!r}: {self.base.availability.reason}")
        count = self.device_count_raw()
        if count < 1:
            return Availability(False, f"profile {self.profile.name!r}: device_count() is {count}")
        return Availability(True, f"profile {self.profile.name!r} ({self.profile.format}): {count} {self.device_type} device(s)")

    def device_count_raw(self) -> int:
        """The device count the hook reports, without asking availability first (the probe uses it)."""
        return int(self._call("device_count", None, fallback=lambda: self.base.device_count()))

    def device_count(self) -> int:
        return self.device_count_raw() if self.is_available() else 0

    def device(self, index: int | None = None) -> torch.device:
        if self.base is not None and self.device_type == getattr(self.base, "device_type", None):
            return self.base.device(index)
        return super().device(index)

    def devices(self) -> list[torch.device]:
        return self.base.devices() if self.base is not None else super().devices()

    def set_device(self, index: int) -> None:
        if self.base is not None:
            self.base.set_device(index)
        elif self.module is not None and hasattr(self.module, "set_device"):
            self.module.set_device(index)
        else:
            raise self.unsupported("set_device", f"torch.{self.device_type} has no set_device")

    def current_device(self) -> int:
        if self.base is not None:
            return self.base.current_device()
        if self.module is not None and hasattr(self.module, "current_device"):
            return int(self.module.current_device())
        return 0

    def synchronize(self, index: int | None = None) -> None:
        self._call("synchronize", index, fallback=lambda: self.base.synchronize(index), none_means=None)

    # ------------------------------------------------------------------ collectives
    @property
    def comm_backend(self) -> str | None:
        if self.profile.comm_backend:
            return self.profile.comm_backend
        if self.base is not None:
            return self.base.comm_backend
        from torch.distributed import Backend as DistBackend

        return DistBackend.default_device_backend_map.get(self.device_type)

    def comm_backend_reason(self) -> str:
        return f"profile {self.profile.name!r} names no hooks.comm_backend and torch has no default for {self.device_type}"

    # ------------------------------------------------------------------ RNG
    def manual_seed(self, seed: int) -> None:
        self._call("seed", None, seed, fallback=lambda: self.base.manual_seed(seed))

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        return self._call("get_rng_state", index, fallback=lambda: self.base.get_rng_state(index))

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        self._call("set_rng_state", index, state, fallback=lambda: self.base.set_rng_state(state, index))

    # ------------------------------------------------------------------ memory
    @property
    def memory_stats_capability(self) -> Capability:
        fn = self.hook("memory_allocated")
        if callable(fn):
            return Capability(True, f"hooks.memory_allocated ({self.hook_source('memory_allocated')})")
        if fn is _NOT_FOUND and self.base is not None:
            return self.base.memory_stats_capability
        return Capability(False, f"profile {self.profile.name!r} has no memory_allocated hook")

    def memory_allocated(self, index: int | None = None) -> int:
        self._require_memory_stats("memory_allocated")
        return int(self._call("memory_allocated", index, fallback=lambda: self.base.memory_allocated(index)))

    def max_memory_allocated(self, index: int | None = None) -> int:
        self._require_memory_stats("max_memory_allocated")
        return int(self._call("max_memory_allocated", index, fallback=lambda: self.base.max_memory_allocated(index)))

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        self._require_memory_stats("reset_peak_memory_stats")
        self._call("reset_peak_memory_stats", index, fallback=lambda: self.base.reset_peak_memory_stats(index))

    def memory_reserved(self, index: int | None = None) -> int:
        if self.base is not None and self.base.has_memory_stats:
            return self.base.memory_reserved(index)
        return self.memory_allocated(index)

    def mem_get_info(self, index: int | None = None) -> tuple[int, int]:
        if self.base is not None:
            return self.base.mem_get_info(index)
        return super().mem_get_info(index)

    def empty_cache(self) -> None:
        self._call("empty_cache", None, fallback=lambda: self.base.empty_cache(), none_means=None)

    # ------------------------------------------------------------------ streams, events, copies
    # the built-in backend for the device type answers when there is one, else the device module's
    # Stream, current_stream, stream and Event (what torch.cuda and the PrivateUse1 modules offer)
    def stream(self) -> Any:
        if self.base is not None:
            return self.base.stream()
        return self._from_module("Stream", "streams")()

    def current_stream(self) -> Any:
        if self.base is not None:
            return self.base.current_stream()
        return self._from_module("current_stream", "streams")()

    def stream_context(self, stream: Any) -> contextlib.AbstractContextManager:
        if self.base is not None:
            return self.base.stream_context(stream)
        return self._from_module("stream", "streams")(stream)

    def event(self, enable_timing: bool = False) -> Any:
        if self.base is not None:
            return self.base.event(enable_timing)
        return self._from_module("Event", "events")(enable_timing=enable_timing)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.base.pin_memory(tensor) if self.base is not None else tensor

    # ------------------------------------------------------------------ AMP
    def amp_capability(self, dtype: torch.dtype) -> Capability:
        """Probed on the device: a tiny matmul under ``torch.autocast`` must come out in ``dtype``."""
        return self._amp_probe(dtype)

    @functools.lru_cache(maxsize=None)  # noqa: B019 - backends live for the process
    def _amp_probe(self, dtype: torch.dtype) -> Capability:
        return self.probe_autocast(dtype)

    @property
    def grad_scaler_capability(self) -> Capability:
        cap = self.amp_capability(torch.float16)
        if not cap:
            return Capability(False, f"no fp16 autocast, so no GradScaler: {cap.reason}")
        try:
            torch.amp.GradScaler(self.autocast_device_type)
        except Exception as exc:
            return Capability(False, f"torch.amp.GradScaler({self.autocast_device_type!r}) failed: {type(exc).__name__}: {exc}")
        return Capability(True, f"torch.amp.GradScaler({self.autocast_device_type!r})")

    # ------------------------------------------------------------------ description
    def device_properties(self, index: int = 0) -> DeviceProperties:
        if self.base is not None:
            props = self.base.device_properties(index)
        elif self._module_callable("get_device_properties") is not None:
            props = properties_from_module(self.module, index, self.device_type)
        else:
            props = DeviceProperties(index=index, name=self.device_type)
        props.extra = {**props.extra, "profile": self.profile.name}
        return props

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["profile"] = {"path": str(self.profile.path) if self.profile.path else None, "sha256": self.profile.sha256,
                           "hooks": {h: self.hook_source(h) for h in HOOKS}}
        return info


def _takes_argument(fn: Callable[..., Any], count: int) -> bool:
    """Whether ``fn`` accepts ``count`` positional arguments (unknown signatures: yes)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    try:
        sig.bind(*range(count))
    except TypeError:
        return False
    return True

