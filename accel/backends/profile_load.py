"""Loading a device profile: YAML, TOML or a transformers-style ``spec.py``, validated into a :class:`DeviceProfile`.

Errors name the file, the line and the key, with a "did you mean"; ``docs/profile.md`` is the
reference for every field. Apart from the backend so that tools can check a profile without building one.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import re
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from accel.facts import yaml_safe
from accel.facts.model_gates import GATE_KEYS, MODEL_MODES, gate_factor_problem
from accel.facts.yaml_safe import preview

from .hook_check import HookCheckError, check_hooks
from .profile_spec import _STRING_HOOKS, HOOKS, DeviceProfile, ProfileError, _suggest, canonical_dtype, resolve_callable

__all__ = ["load_profile", "spec_no_op"]

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


_SECTIONS = ("version", "device", "hooks", "capabilities", "tolerances", "op_tolerances", "known_issues", "models")
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
    comm_backend = deepspeed_accelerator = None
    for key, value in mapping(("hooks",), top.get("hooks") or {}, HOOKS + _STRING_HOOKS).items():
        where = ("hooks", key)
        if key == "comm_backend":
            comm_backend = text(where, value)
            continue
        if key == "deepspeed_accelerator":  # named, never imported here (that would import DeepSpeed)
            deepspeed_accelerator = text(where, value)
            if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", deepspeed_accelerator):
                raise fail(where, f"expected 'module:Class' (a DeepSpeedAccelerator subclass), got {preview(deepspeed_accelerator)}")
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

    model_gates = _model_gates(mapping(("models",), top.get("models") or {}, ("gates",)), mapping, fail)

    issues = top.get("known_issues") or []
    if not isinstance(issues, list):
        raise fail(("known_issues",), f"expected a list of known-issue entries, got {type(issues).__name__}")
    version = top.get("version")
    if version is not None and not isinstance(version, (str, int, float)):
        raise fail(("version",), f"expected a version string, got {preview(version)}")
    return DeviceProfile(
        name=name, device_type=device_type, module=module, device_extra=extra, hooks=hooks,
        comm_backend=comm_backend, deepspeed_accelerator=deepspeed_accelerator, capabilities=capabilities, tolerances=tolerances, op_tolerances=op_tolerances,
        known_issues=[dict(i) if isinstance(i, Mapping) else i for i in issues],
        known_issue_lines=[_line(lines, ("known_issues", i)) for i in range(len(issues))], model_gates=model_gates,
        version=None if version is None else str(version), format=fmt,
    )


def _model_gates(models: dict[str, Any], mapping: Callable[..., dict[str, Any]],
                 fail: Callable[[tuple, str], ProfileError]) -> dict[str, dict[str, float]]:
    """The ``models: gates:`` section: mode -> {quality?, steps?}, each factor checked (accel.facts.model_gates)."""
    gates: dict[str, dict[str, float]] = {}
    for mode, factors in mapping(("models", "gates"), models.get("gates") or {}).items():
        where = ("models", "gates", str(mode))
        if mode not in MODEL_MODES:
            raise fail(where, f"unknown model suite mode{_suggest(mode, MODEL_MODES)}")
        for key, value in mapping(where, factors, GATE_KEYS).items():
            problem = gate_factor_problem(key, value)
            if problem:
                raise fail(where + (key,), problem)
            gates.setdefault(str(mode), {})[key] = float(value)
    return gates


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
