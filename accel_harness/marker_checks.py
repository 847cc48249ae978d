"""Per-marker checks: each harness mark read, validated and turned into ranked skip checks.

:func:`parse_marks` gives the checks of an item's marks (and its world sizes); :func:`accel_harness.markers.evaluate`
runs them for one test instance. Bad usage raises :class:`MarkerUsageError` while parsing, on every
backend alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from packaging.version import Version

from accel.facts import versions
from accel.facts.requirements import package_problem

from .marker_table import is_harness_mark
from .skip_reasons import (
    KNOWN_LIMITATION, NEEDS_DEVICES, NEEDS_MULTIPROCESS, NEEDS_PACKAGE, NOT_ON_BACKEND, OPT_IN, TORCH_VERSION,
    UNSUPPORTED_DTYPE, SkipReason,
)


# ---------------------------------------------------------------------------- usage errors
class MarkerUsageError(ValueError):
    """A harness marker used with bad arguments; the message names the test, marker and argument."""

    def __init__(self, marker: str, argument: str, problem: str, where: str | None = None, call: str | None = None):
        self.marker = marker
        self.argument = argument
        self.problem = problem
        self.where = where
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}bad @pytest.mark.{call or marker}: argument {argument}: {problem}")


def _args_text(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return ", ".join(parts)


# ---------------------------------------------------------------------------- evaluation
@dataclass
class CheckContext:
    """What a check looks at: the instance's backend, world size and torch version."""

    backend: Any
    world_size: int | None
    torch_version: Version


@dataclass
class _Check:
    rank: int
    run: Callable[[CheckContext], SkipReason | None]


# evaluation order: cheap, name-based answers first; probes that touch a device last
_RANK_BACKEND = 0
_RANK_LIMITATION = 1
_RANK_TORCH = 2
_RANK_PACKAGE = 3
_RANK_MULTIPROCESS = 4
_RANK_DEVICES = 5
_RANK_DTYPE = 6

_FSDP2_MIN_TORCH = Version(versions.TORCH_FSDP2)

class _Mark:
    """Reads one mark and raises :class:`MarkerUsageError` with its context."""

    def __init__(self, mark: Any, where: str | None):
        self.name: str = getattr(mark, "name")
        self.args: tuple[Any, ...] = tuple(getattr(mark, "args", ()) or ())
        self.kwargs: dict[str, Any] = dict(getattr(mark, "kwargs", {}) or {})
        self.where = where

    def error(self, argument: str, problem: str) -> MarkerUsageError:
        return MarkerUsageError(self.name, argument, problem, self.where, self.call_text())

    def call_text(self) -> str:
        return f"{self.name}({_args_text(self.args, self.kwargs)})"

    def only_kwargs(self, *allowed: str) -> None:
        for key in self.kwargs:
            if key not in allowed:
                expected = ", ".join(allowed) if allowed else "no keyword arguments"
                raise self.error(f"{key}={self.kwargs[key]!r}", f"unexpected keyword argument (accepted: {expected})")

    def no_args(self) -> None:
        if self.args:
            raise self.error(repr(self.args[0]), f"{self.name} takes no positional arguments")
        self.only_kwargs()

    def names(self, what: str) -> tuple[str, ...]:
        if not self.args:
            raise self.error("(none)", f"{self.name} needs at least one {what} name")
        out = []
        for value in self.args:
            if not isinstance(value, str) or not value.strip():
                raise self.error(repr(value), f"expected a {what} name (a non-empty string)")
            out.append(value.strip())
        return tuple(out)


def _positive_int(mark: _Mark, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise mark.error(repr(value), "expected a positive integer")
    return value


def _specifier(mark: _Mark, value: Any) -> Any:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if not isinstance(value, str) or not value.strip():
        raise mark.error(repr(value), "expected a version specifier string such as '>=2.5' or '>=2.5,<2.8'")
    try:
        return SpecifierSet(value)
    except InvalidSpecifier as exc:
        raise mark.error(repr(value), f"not a version specifier ({exc}); write e.g. '>=2.5' or '>=2.5,<2.8'") from None


def backend_name(backend: Any) -> str:
    """The backend's name for messages (``"?"`` when it has none)."""
    return str(getattr(backend, "name", "") or "?")


def _safe(ctx_name: str, probe: Callable[[], Any]) -> tuple[Any, str | None]:
    try:
        return probe(), None
    except Exception as exc:
        return None, f"{ctx_name} failed: {type(exc).__name__}: {exc}"


# --- individual checks ---------------------------------------------------------------
def _check_require_backend(mark: _Mark) -> list[_Check]:
    mark.only_kwargs()
    wanted = tuple(n.lower() for n in mark.names("backend"))

    def run(ctx: CheckContext) -> SkipReason | None:
        name = backend_name(ctx.backend)
        if name in wanted:
            return None
        return SkipReason(NOT_ON_BACKEND, f"test runs only on {', '.join(wanted)}; this instance runs on {name}")

    return [_Check(_RANK_BACKEND, run)]


def _check_require_non(mark: _Mark) -> list[_Check]:
    mark.no_args()
    excluded = mark.name[len("require_non_"):].lower()

    def run(ctx: CheckContext) -> SkipReason | None:
        if backend_name(ctx.backend) != excluded:
            return None
        return SkipReason(NOT_ON_BACKEND, f"test does not run on {excluded} ({mark.name})")

    return [_Check(_RANK_BACKEND, run)]


def _check_known_limitation(mark: _Mark) -> list[_Check]:
    mark.only_kwargs("reason", "torch", "url")
    backends = tuple(n.lower() for n in mark.names("backend"))
    reason = mark.kwargs.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise mark.error("reason", "known_limitation needs reason='...' saying what is limited")
    spec = _specifier(mark, mark.kwargs["torch"]) if mark.kwargs.get("torch") is not None else None
    url = mark.kwargs.get("url")
    if url is not None and not isinstance(url, str):
        raise mark.error(f"url={url!r}", "expected a string")

    def run(ctx: CheckContext) -> SkipReason | None:
        name = backend_name(ctx.backend)
        if name not in backends:
            return None
        if spec is not None and not spec.contains(ctx.torch_version, prereleases=True):
            return None
        text = f"known limitation on {name}: {reason.strip()}"
        if spec is not None:
            text += f" (torch {spec}; installed {ctx.torch_version})"
        if url:
            text += f" ({url})"
        return SkipReason(KNOWN_LIMITATION, text)

    return [_Check(_RANK_LIMITATION, run)]


def _check_require_torch(mark: _Mark) -> list[_Check]:
    mark.only_kwargs("spec")
    values = list(mark.args) + ([mark.kwargs["spec"]] if "spec" in mark.kwargs else [])
    if len(values) != 1:
        raise mark.error(_args_text(mark.args, mark.kwargs) or "(none)", "require_torch takes exactly one specifier, e.g. require_torch('>=2.5')")
    spec = _specifier(mark, values[0])

    def run(ctx: CheckContext) -> SkipReason | None:
        if spec.contains(ctx.torch_version, prereleases=True):
            return None
        return SkipReason(TORCH_VERSION, f"test needs torch {spec}; installed {ctx.torch_version} ({backend_name(ctx.backend)})")

    return [_Check(_RANK_TORCH, run)]


def _package_check(mark: _Mark, value: Any) -> Callable[[], str | None]:
    from packaging.requirements import InvalidRequirement, Requirement

    if not isinstance(value, str) or not value.strip():
        raise mark.error(repr(value), "expected a package name (a non-empty string), optionally with a version specifier")
    text = value.strip()
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise mark.error(repr(value), f"not a package name or requirement ({exc})") from None
    if requirement.extras or requirement.marker or requirement.url:
        raise mark.error(repr(value), "extras, URLs and environment markers are not supported; give a name and optional version specifier")

    def missing() -> str | None:
        return package_problem(text)

    return missing


def _check_require_no_package(mark: _Mark) -> list[_Check]:
    mark.only_kwargs()
    if len(mark.args) != 1:
        raise mark.error(_args_text(mark.args, mark.kwargs) or "(none)", "require_no_package takes exactly one package name")
    probe = _package_check(mark, mark.args[0])
    if any(ch in mark.args[0] for ch in "<>=!~"):
        raise mark.error(repr(mark.args[0]), "require_no_package takes a package name without a version")

    def run(ctx: CheckContext) -> SkipReason | None:
        if probe() is not None:
            return None
        return SkipReason(KNOWN_LIMITATION, f"test needs an environment without {mark.args[0].strip()}, which is installed")

    return [_Check(_RANK_PACKAGE, run)]


def _check_require_opt_in(mark: _Mark) -> list[_Check]:
    mark.only_kwargs()
    names = mark.names("environment variable")
    if len(names) != 1:
        raise mark.error(_args_text(mark.args, mark.kwargs), "require_opt_in takes exactly one variable name")
    variable = names[0]

    def run(ctx: CheckContext) -> SkipReason | None:
        from accel.facts.environment import env_flag

        try:
            wanted = env_flag(variable)
        except ValueError as exc:
            return SkipReason(OPT_IN, f"test runs only when asked: {exc}")
        return None if wanted else SkipReason(OPT_IN, f"test runs only when asked: set {variable}=1 to run it")

    return [_Check(_RANK_LIMITATION, run)]


def _check_require_package(mark: _Mark) -> list[_Check]:
    mark.only_kwargs("any_of")
    if not mark.args:
        raise mark.error("(none)", "require_package needs at least one package name")
    any_of = mark.kwargs.get("any_of", False)
    if not isinstance(any_of, bool):
        raise mark.error(f"any_of={any_of!r}", "expected True or False")
    probes = [_package_check(mark, v) for v in mark.args]

    def run(ctx: CheckContext) -> SkipReason | None:
        problems = [problem for problem in (probe() for probe in probes) if problem]
        if not problems or (any_of and len(problems) < len(probes)):
            return None
        if any_of:
            return SkipReason(NEEDS_PACKAGE, "test needs one of " + ", ".join(map(str, mark.args)) + "; none is installed")
        return SkipReason(NEEDS_PACKAGE, problems[0])

    return [_Check(_RANK_PACKAGE, run)]


def _check_require_deepspeed(mark: _Mark) -> list[_Check]:
    mark.no_args()
    probe = _package_check(mark, "deepspeed")

    def run(ctx: CheckContext) -> SkipReason | None:
        problem = probe()
        if problem:
            return SkipReason(NEEDS_PACKAGE, problem)
        from accel.backends.deepspeed_agreement import provided_accelerator

        device_type = getattr(ctx.backend, "device_type", None)
        # a backend that brings its own DeepSpeed accelerator (installed with set_accelerator) needs no list
        supported = () if provided_accelerator(ctx.backend) else _deepspeed_accelerators()
        if device_type and supported and device_type not in supported:
            return SkipReason(NOT_ON_BACKEND, f"DeepSpeed has no accelerator for {device_type} "
                                              f"(DS_ACCELERATOR accepts {', '.join(supported)})")
        # the test runs and may build DeepSpeed's ops: never into a folder a killed build left locked
        from .extension_cache import settle_extension_cache

        settle_extension_cache()
        return None

    return [_Check(_RANK_PACKAGE, run)]


def _deepspeed_accelerators() -> tuple[str, ...]:
    """The device types the installed DeepSpeed has an accelerator for (empty when unknown)."""
    from accel.backends.deepspeed_agreement import deepspeed_accelerator_types

    return deepspeed_accelerator_types()


def _comm_backend(backend: Any) -> tuple[str | None, str]:
    """(collective backend name or None, why there is none)."""
    name = backend_name(backend)
    comm, error = _safe(f"{name}: comm_backend", lambda: backend.comm_backend)
    if error:
        return None, error
    if comm is not None:
        return comm, ""
    why_probe = getattr(backend, "comm_backend_reason", None)
    why, _ = _safe("comm_backend_reason", why_probe) if callable(why_probe) else (None, None)
    return None, why or "no collective backend"


def _check_require_fsdp2(mark: _Mark) -> list[_Check]:
    mark.no_args()

    def torch_ok(ctx: CheckContext) -> SkipReason | None:
        if ctx.torch_version >= _FSDP2_MIN_TORCH:
            return None
        return SkipReason(TORCH_VERSION, f"FSDP2 (fully_shard) needs torch >= {_FSDP2_MIN_TORCH}; installed {ctx.torch_version}")

    def comm_ok(ctx: CheckContext) -> SkipReason | None:
        comm, why = _comm_backend(ctx.backend)
        if comm is not None:
            return None
        return SkipReason(NEEDS_MULTIPROCESS, f"FSDP2 needs a collective backend; {backend_name(ctx.backend)} has none ({why})")

    return [_Check(_RANK_TORCH, torch_ok), _Check(_RANK_MULTIPROCESS, comm_ok)]


def _device_count(backend: Any) -> tuple[int, str | None]:
    count, error = _safe(f"{backend_name(backend)}: device_count()", backend.device_count)
    return (int(count) if count is not None else 0), error


def _too_few_devices(ctx: CheckContext, needed: int, what: str, per: str = "") -> SkipReason | None:
    """A needs-devices skip when the backend shows fewer than ``needed`` devices (``what`` needs them)."""
    count, error = _device_count(ctx.backend)
    if count >= needed:
        return None
    detail = f" ({error})" if error else ""
    return SkipReason(NEEDS_DEVICES, f"{what} needs {needed} {backend_name(ctx.backend)} devices{per}, {count} visible{detail}")


def _devices_check(n: int) -> Callable[[CheckContext], SkipReason | None]:
    def run(ctx: CheckContext) -> SkipReason | None:
        return _too_few_devices(ctx, n, "test")

    return run


def _check_require_devices(mark: _Mark) -> list[_Check]:
    mark.only_kwargs("n", "exact", "of")
    values = list(mark.args) + ([mark.kwargs["n"]] if "n" in mark.kwargs else [])
    if len(values) != 1:
        raise mark.error(_args_text(mark.args, mark.kwargs) or "(none)", "require_devices takes exactly one device count, e.g. require_devices(2)")
    n = _positive_int(mark, values[0])
    exact = mark.kwargs.get("exact", False)
    if not isinstance(exact, bool):
        raise mark.error(f"exact={exact!r}", "expected True or False")
    of = mark.kwargs.get("of", ())
    if isinstance(of, str) or not isinstance(of, (tuple, list)) or not all(isinstance(v, str) and v for v in of):
        raise mark.error(f"of={of!r}", "expected a tuple of backend names, e.g. of=('cuda',)")
    of = tuple(v.lower() for v in of)

    def run(ctx: CheckContext) -> SkipReason | None:
        name = backend_name(ctx.backend)
        if of and name not in of:
            return SkipReason(NEEDS_DEVICES, f"test needs {n} {' or '.join(of)} device(s); this instance runs on {name}")
        if not exact:
            return _too_few_devices(ctx, n, "test")
        count, error = _device_count(ctx.backend)
        if count == n:
            return None
        detail = f" ({error})" if error else ""
        return SkipReason(NEEDS_DEVICES, f"test needs exactly {n} {name} device(s), {count} visible{detail}")

    return [_Check(_RANK_DEVICES, run)]


def _check_require_multi_device(mark: _Mark) -> list[_Check]:
    mark.no_args()
    return [_Check(_RANK_DEVICES, _devices_check(2))]


def _dtype_check(label: str, plain: str, amp: str | None) -> Callable[[_Mark], list[_Check]]:
    def parse(mark: _Mark) -> list[_Check]:
        if mark.args:
            raise mark.error(repr(mark.args[0]), f"{mark.name} takes no positional arguments")
        mark.only_kwargs(*(("amp",) if amp else ("training",)))
        use_amp = mark.kwargs.get("amp", False)
        training = mark.kwargs.get("training", False)
        for key, value in (("amp", use_amp), ("training", training)):
            if not isinstance(value, bool):
                raise mark.error(f"{key}={value!r}", "expected True or False")
        attribute = amp if (use_amp and amp) else plain
        what = f"{label} autocast" if use_amp else label

        def run(ctx: CheckContext) -> SkipReason | None:
            name = backend_name(ctx.backend)
            if training:
                from accel.precision.fp8 import fp8_refusal

                refusal, error = _safe("fp8_refusal()", fp8_refusal)
                if refusal or error:
                    return SkipReason(UNSUPPORTED_DTYPE, f"test needs {label} training: {refusal or error}")
            cap, error = _safe(f"{name}: {attribute}", lambda: getattr(ctx.backend, attribute))
            if error is None and cap is not None and bool(getattr(cap, "supported", cap)):
                return None
            reason = error or str(getattr(cap, "reason", "") or "no reason given")
            return SkipReason(UNSUPPORTED_DTYPE, f"test needs {what}, which {name} does not support: {reason}")

        return [_Check(_RANK_DTYPE, run)]

    return parse


def _world_sizes(mark: _Mark) -> list[int]:
    mark.only_kwargs("n", "sizes")
    values: list[Any] = list(mark.args) + [mark.kwargs[k] for k in ("n", "sizes") if k in mark.kwargs]
    if len(values) == 1 and isinstance(values[0], (list, tuple)):
        values = list(values[0])
    if not values:
        raise mark.error("(none)", "world_size needs a size or a list of sizes, e.g. world_size(2) or world_size([1, 2, 4])")
    return [_positive_int(mark, v) for v in values]


def _check_slow(mark: _Mark) -> list[_Check]:
    return []


#: the largest ``rank_timeout`` scale: a test that needs more is too slow for the suites, not for its limit
MAX_RANK_TIMEOUT_SCALE = 10.0


def _rank_timeout_scale(mark: _Mark) -> float:
    mark.only_kwargs("scale")
    values = list(mark.args) + ([mark.kwargs["scale"]] if "scale" in mark.kwargs else [])
    if len(values) != 1:
        raise mark.error("(none)" if not values else repr(values), "rank_timeout takes one scale, e.g. rank_timeout(2)")
    value = values[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= MAX_RANK_TIMEOUT_SCALE:
        raise mark.error(repr(value), f"expected a number from 1 to {MAX_RANK_TIMEOUT_SCALE:g} (times --dist-timeout)")
    return float(value)


def _check_rank_timeout(mark: _Mark) -> list[_Check]:
    _rank_timeout_scale(mark)  # a bad scale is an error when the test is collected, not when its ranks time out
    return []


def rank_timeout_scale(item: Any) -> float:
    """How many times ``--dist-timeout`` this test's ranks may run: its closest ``rank_timeout`` mark's scale, else 1."""
    mark = item.get_closest_marker("rank_timeout")
    return 1.0 if mark is None else _rank_timeout_scale(_Mark(mark, getattr(item, "nodeid", None)))


def _check_fork_server_imports(mark: _Mark) -> list[_Check]:
    mark.only_kwargs()
    if not mark.args:
        raise mark.error("(none)", "fork_server_imports names the modules, e.g. fork_server_imports('json')")
    for module in mark.args:
        if not isinstance(module, str) or not all(part.isidentifier() for part in module.split(".")):
            raise mark.error(repr(module), "expected a module's dotted name")
    return []


_PARSERS: dict[str, Callable[[_Mark], list[_Check]]] = {
    "require_backend": _check_require_backend,
    "known_limitation": _check_known_limitation,
    "require_torch": _check_require_torch,
    "require_package": _check_require_package,
    "require_no_package": _check_require_no_package,
    "require_opt_in": _check_require_opt_in,
    "require_deepspeed": _check_require_deepspeed,
    "require_fsdp2": _check_require_fsdp2,
    "require_devices": _check_require_devices,
    "require_multi_device": _check_require_multi_device,
    "require_fp16": _dtype_check("fp16", "supports_fp16", "supports_fp16_amp"),
    "require_bf16": _dtype_check("bf16", "supports_bf16", "supports_bf16_amp"),
    "require_fp8": _dtype_check("fp8", "supports_fp8", None),
    "slow": _check_slow,
    "models": _check_slow,  # a selection label, like slow: no condition
    "rank_timeout": _check_rank_timeout,  # a time limit, not a condition
    "fork_server_imports": _check_fork_server_imports,  # what a process imports, not a condition
}


def ranks_share_device(backend: Any) -> bool:
    """Whether several ranks of one test may run on one device of ``backend``.

    A backend may say so with a boolean ``ranks_share_device`` attribute; otherwise only the host
    cpu allows it (on accelerators each rank gets its own device: NCCL, for one, refuses two ranks
    on one GPU).
    """
    declared = getattr(backend, "ranks_share_device", None)
    if isinstance(declared, bool):
        return declared
    return getattr(backend, "is_host", False) is True


def world_size_checks(world_size: int) -> list[_Check]:
    """The checks a world size above 1 adds: a collective backend, and a device per rank unless ranks share one."""
    def multiprocess(ctx: CheckContext) -> SkipReason | None:
        comm, why = _comm_backend(ctx.backend)
        if comm is not None:
            return None
        name = backend_name(ctx.backend)
        return SkipReason(NEEDS_MULTIPROCESS, f"world size {world_size} needs several processes, but {name} has no collective backend: {why}")

    def devices(ctx: CheckContext) -> SkipReason | None:
        if ranks_share_device(ctx.backend):
            return None
        return _too_few_devices(ctx, world_size, f"world size {world_size}", per=" (one per rank)")

    return [_Check(_RANK_MULTIPROCESS, multiprocess), _Check(_RANK_DEVICES, devices)]


def parse_marks(marks: Iterable[Any], where: str | None) -> tuple[list[_Check], list[int] | None]:
    """The checks of the harness marks among ``marks`` and the closest ``world_size`` mark's sizes (or None)."""
    checks: list[_Check] = []
    sizes: list[int] | None = None
    for raw in marks:
        name = getattr(raw, "name", None)
        if not isinstance(name, str) or not is_harness_mark(name):
            continue  # parametrize, usefixtures, backend-name marks, other plugins' marks
        mark = _Mark(raw, where)
        if name == "world_size":
            found = _world_sizes(mark)
            if sizes is None:  # iter_markers yields the closest mark first
                sizes = found
        elif name in _PARSERS:
            checks.extend(_PARSERS[name](mark))
        else:
            checks.extend(_check_require_non(mark))
    return checks, sizes
