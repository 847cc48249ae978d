"""Harness markers: the table the plugin registers, Accelerate-style aliases, and skip reasons.

A test declares what it needs with markers (``@pytest.mark.require_devices(2)``,
``@pytest.mark.require_bf16``, ...). Unlike Accelerate's ``unittest.skipUnless`` decorators, which
are evaluated at import time against a guessed device, these are evaluated per *test instance*
(one backend, one world size) by :func:`evaluate`, so ``-m`` can select them and every skip carries
a machine-readable reason code. The plugin turns a :class:`SkipReason` into pytest's skip text with
:func:`format_skip`; the result recorder gets the code back with :func:`parse_skip`.

Semantics worth knowing:

* ``require_devices(n)`` counts *physical* devices of the instance's backend
  (``backend.device_count()``). The CPU backend has exactly one device, so ``require_devices(2)``
  always skips on cpu, while ``world_size(n)`` tests do run on cpu: several processes share the
  one host device (see :func:`ranks_share_device`).
* On a backend whose ranks cannot share a device (every backend but cpu, unless the backend sets a
  boolean ``ranks_share_device`` attribute), a world size ``n > 1`` also needs ``n`` devices.
* ``require_fsdp2`` means: torch >= the FSDP2 floor of :mod:`accel.facts.versions` (``fully_shard``
  is public there) and a backend with a collective backend (``backend.comm_backend`` is not None).
* The Accelerate-style aliases (``require_cuda``, ``require_multi_gpu``, ...) are generated from
  :data:`accel.facts.requirements.REQUIREMENT_TABLE`, the table ``accel.test_utils`` evaluates too,
  so the two decorator sets cannot disagree.
* ``require_package`` never imports anything: a plain name is looked up with
  ``importlib.util.find_spec`` (dotted names without importing their parents); a name with a
  version specifier (``"deepspeed>=0.14"``) is checked against installed distribution metadata.
* Reason codes (:data:`SKIP_CODES`) come from :mod:`accel.facts.reasons`; ``accel.test_utils``'
  decorators write the same ``"[code] message"`` skip text.
* Bad usage (``require_devices("two")``, ``require_torch("banana")``) raises
  :class:`MarkerUsageError` (a ``ValueError``) naming the test, the marker and the argument, for
  every instance alike, so the plugin can report it as a collection error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from packaging.version import InvalidVersion, Version

from accel.facts import reasons, versions
from accel.facts.backends import BUILTIN_BACKENDS
from accel.facts.requirements import NOT_IN_TABLE, REQUIREMENT_TABLE, Need, package_problem

# packaging.requirements/specifiers, importlib.metadata and difflib load on first use: the plugin imports
# this module in every pytest session of the environment, most of which never evaluate a mark

__all__ = [
    "ACCELERATE_ALIASES",
    "Alias",
    "BUILTIN_BACKENDS",
    "MARKERS",
    "SKIP_CODES",
    "UNSPECIFIED",
    "MarkerUsageError",
    "SkipReason",
    "as_decorator",
    "evaluate",
    "format_skip",
    "is_harness_mark",
    "parse_skip",
    "ranks_share_device",
    "require_torch_min_version",
    "validate",
]

# ---------------------------------------------------------------------------- reason codes
from accel.facts.reasons import (  # noqa: E402 - the codes under their names here
    BACKEND_NOT_SELECTED, BACKEND_UNAVAILABLE, KNOWN_LIMITATION, NEEDS_DEVICES, NEEDS_MULTIPROCESS, NEEDS_PACKAGE,
    NOT_ON_BACKEND, OPT_IN, TORCH_VERSION, UNSUPPORTED_DTYPE,
)

#: every reason code a harness skip may carry (the table in accel.facts.reasons)
SKIP_CODES: tuple[str, ...] = reasons.SKIP_CODES
#: the code of a skip whose text carries no (known) code, e.g. a plain ``pytest.skip("...")``
UNSPECIFIED = reasons.UNSPECIFIED

# each built-in backend (accel.facts.backends.BUILTIN_BACKENDS) gets a ``require_non_<name>`` marker registered

# ---------------------------------------------------------------------------- marker table
#: marker name -> description; the plugin registers each as ``f"{name}: {description}"``
MARKERS: dict[str, str] = {
    "require_backend": "run only on the named backend(s), e.g. require_backend('cuda', 'xpu'); other instances skip [not-on-backend]",
    **{
        f"require_non_{name}": f"skip the instances that run on the {name} backend [not-on-backend]"
        for name in BUILTIN_BACKENDS
    },
    "require_devices": "require_devices(n, exact=False, of=()): skip unless the backend has at least n physical devices (exactly n with exact=True; cpu has 1) and, with of=('cuda', ...), is one of those backends [needs-devices]",
    "require_multi_device": "same as require_devices(2) [needs-devices]",
    "require_fp16": "skip unless the backend computes in float16; require_fp16(amp=True) asks for fp16 autocast instead [unsupported-dtype]",
    "require_bf16": "skip unless the backend computes in bfloat16; require_bf16(amp=True) asks for bf16 autocast instead [unsupported-dtype]",
    "require_fp8": "skip unless the backend runs float8 (e4m3) matmuls; require_fp8(training=True) also asks that accel can train in fp8 here [unsupported-dtype]",
    "require_package": "require_package(name, ..., any_of=False): skip unless each package (any_of=True: at least one) is installed; 'name>=1.2' also checks its version [needs-package]",
    "require_torch": "require_torch(spec): skip unless the installed torch matches the specifier, e.g. require_torch('>=2.5') [torch-version]",
    "require_no_package": "require_no_package(name): skip when the package is installed [known-limitation]",
    "require_deepspeed": "skip unless deepspeed is installed with an accelerator for the backend [needs-package, not-on-backend]",
    "require_fsdp2": f"skip unless torch >= {versions.TORCH_FSDP2} (fully_shard) and the backend has a collective backend [torch-version, needs-multiprocess]",
    "require_opt_in": "require_opt_in(VARIABLE): skip unless the yes/no environment variable is true, e.g. require_opt_in('RUN_SLOW') [opt-in]",
    "slow": "takes more than a few seconds",
    "models": "the validated-models suite: real architectures trained to a target, judged against the host fp32 run (a label: no condition)",
    "world_size": "world_size(n) or world_size([1, 2, 4]): run the body in n processes, one test instance per size [needs-multiprocess, needs-devices]",
    "known_limitation": "known_limitation('mps', ..., reason='...', torch='<2.8'): skip on the named backends (optionally only in a torch range) [known-limitation]",
}

# ---------------------------------------------------------------------------- Accelerate aliases
#: an Accelerate decorator's condition as a harness mark: ``pytest.mark.<marker>(*args, **kwargs)``
Alias = Need

#: Accelerate ``accelerate.test_utils`` decorator name -> the harness marks it stands for, generated
#: from accel.facts.requirements.REQUIREMENT_TABLE (the table accel.test_utils evaluates). "The backend"
#: is the instance's: ``require_cuda`` means only the cuda instance runs, ``require_multi_gpu`` means a
#: cuda instance with two devices.
ACCELERATE_ALIASES: dict[str, tuple[Alias, ...]] = {name: row.needs for name, row in REQUIREMENT_TABLE.items()}


def _mark_of(need: Alias) -> Any:
    import pytest

    decorator = getattr(pytest.mark, need.marker)
    return decorator(*need.args, **dict(need.kwargs)) if need.args or need.kwargs else decorator


def as_decorator(name: str) -> Any:
    """A pytest mark decorator for a harness marker or an Accelerate-style alias.

    ``as_decorator("require_cuda")`` is ``pytest.mark.require_backend("cuda")``;
    ``as_decorator("require_devices")`` is ``pytest.mark.require_devices`` (call it with ``n``).
    The same names can be imported directly: ``from accel_harness.markers import require_cuda``.
    """
    import pytest

    if name in ACCELERATE_ALIASES:
        marks = [_mark_of(need) for need in ACCELERATE_ALIASES[name]]
        if len(marks) == 1:
            return marks[0]

        def apply_all(test: Any) -> Any:
            for mark_decorator in marks:
                test = mark_decorator(test)
            return test

        apply_all.__name__ = apply_all.__qualname__ = name
        apply_all.__doc__ = f"The harness marks of Accelerate's {name}: " + ", ".join(m.mark.name for m in marks)
        apply_all.marks = marks  # type: ignore[attr-defined]
        return apply_all
    if name in MARKERS or (name.startswith("require_non_") and len(name) > len("require_non_")):
        return getattr(pytest.mark, name)
    known = sorted(set(MARKERS) | set(ACCELERATE_ALIASES) | set(NOT_IN_TABLE))
    import difflib

    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise AttributeError(f"no harness marker or Accelerate-style decorator named {name!r}{hint}")


def require_torch_min_version(test_case: Any = None, version: str | None = None) -> Any:
    """Accelerate's ``require_torch_min_version(version="2.5")``: ``require_torch(">=2.5")``."""
    if version is None:
        raise ValueError("require_torch_min_version needs version=, e.g. require_torch_min_version(version='2.5')")
    decorator = _mark_of(Need("require_torch", (f">={version}",)))
    return decorator(test_case) if test_case is not None else decorator


def __getattr__(name: str) -> Any:  # PEP 562: ``from accel_harness.markers import require_cuda``
    if name in ACCELERATE_ALIASES or name in MARKERS:
        return as_decorator(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------- skip reasons
@dataclass(frozen=True)
class SkipReason:
    """Why a test instance skips: a reason code from :data:`SKIP_CODES` (or ``"unspecified"``)."""

    code: str
    message: str

    def __post_init__(self) -> None:
        if self.code not in SKIP_CODES and self.code != UNSPECIFIED:
            raise ValueError(f"unknown skip reason code {self.code!r}; known codes: {', '.join(SKIP_CODES)}")

    def __str__(self) -> str:
        return format_skip(self)


def format_skip(reason: SkipReason) -> str:
    """The text given to ``pytest.skip``: ``"[code] message"``."""
    return f"[{reason.code}] {reason.message}".rstrip()


_SKIP_TEXT = re.compile(r"\[(?P<code>[a-z][a-z0-9-]*)\][ \t]*(?P<message>.*)\Z", re.DOTALL)


def parse_skip(text: Any) -> SkipReason:
    """The :class:`SkipReason` inside a skip text, such as pytest's ``"Skipped: [code] message"``.

    Also accepts pytest's skip ``longrepr`` tuple ``(path, lineno, text)``. Text without a known
    ``[code]`` prefix gives code ``"unspecified"`` and the text as message.
    """
    if isinstance(text, (tuple, list)) and len(text) == 3:
        text = text[2]
    text = "" if text is None else str(text)
    body = text.strip()
    if body.startswith("Skipped:"):
        body = body[len("Skipped:"):].strip()
    match = _SKIP_TEXT.match(body)
    if match and match.group("code") in SKIP_CODES:
        return SkipReason(match.group("code"), match.group("message").strip())
    return SkipReason(UNSPECIFIED, body)


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
class _Context:
    backend: Any
    world_size: int | None
    torch_version: Version


@dataclass
class _Check:
    rank: int
    run: Callable[[_Context], SkipReason | None]


# evaluation order: cheap, name-based answers first; probes that touch a device last
_RANK_BACKEND = 0
_RANK_LIMITATION = 1
_RANK_TORCH = 2
_RANK_PACKAGE = 3
_RANK_MULTIPROCESS = 4
_RANK_DEVICES = 5
_RANK_DTYPE = 6

_FSDP2_MIN_TORCH = Version(versions.TORCH_FSDP2)


def is_harness_mark(name: str) -> bool:
    """True for the marker names :func:`evaluate` understands (the plugin may parametrize on it)."""
    return name in MARKERS or (name.startswith("require_non_") and len(name) > len("require_non_"))


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


def _backend_name(backend: Any) -> str:
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

    def run(ctx: _Context) -> SkipReason | None:
        name = _backend_name(ctx.backend)
        if name in wanted:
            return None
        return SkipReason(NOT_ON_BACKEND, f"test runs only on {', '.join(wanted)}; this instance runs on {name}")

    return [_Check(_RANK_BACKEND, run)]


def _check_require_non(mark: _Mark) -> list[_Check]:
    mark.no_args()
    excluded = mark.name[len("require_non_"):].lower()

    def run(ctx: _Context) -> SkipReason | None:
        if _backend_name(ctx.backend) != excluded:
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

    def run(ctx: _Context) -> SkipReason | None:
        name = _backend_name(ctx.backend)
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

    def run(ctx: _Context) -> SkipReason | None:
        if spec.contains(ctx.torch_version, prereleases=True):
            return None
        return SkipReason(TORCH_VERSION, f"test needs torch {spec}; installed {ctx.torch_version} ({_backend_name(ctx.backend)})")

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

    def run(ctx: _Context) -> SkipReason | None:
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

    def run(ctx: _Context) -> SkipReason | None:
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

    def run(ctx: _Context) -> SkipReason | None:
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

    def run(ctx: _Context) -> SkipReason | None:
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
    name = _backend_name(backend)
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

    def torch_ok(ctx: _Context) -> SkipReason | None:
        if ctx.torch_version >= _FSDP2_MIN_TORCH:
            return None
        return SkipReason(TORCH_VERSION, f"FSDP2 (fully_shard) needs torch >= {_FSDP2_MIN_TORCH}; installed {ctx.torch_version}")

    def comm_ok(ctx: _Context) -> SkipReason | None:
        comm, why = _comm_backend(ctx.backend)
        if comm is not None:
            return None
        return SkipReason(NEEDS_MULTIPROCESS, f"FSDP2 needs a collective backend; {_backend_name(ctx.backend)} has none ({why})")

    return [_Check(_RANK_TORCH, torch_ok), _Check(_RANK_MULTIPROCESS, comm_ok)]


def _device_count(backend: Any) -> tuple[int, str | None]:
    count, error = _safe(f"{_backend_name(backend)}: device_count()", backend.device_count)
    return (int(count) if count is not None else 0), error


def _too_few_devices(ctx: _Context, needed: int, what: str, per: str = "") -> SkipReason | None:
    """A needs-devices skip when the backend shows fewer than ``needed`` devices (``what`` needs them)."""
    count, error = _device_count(ctx.backend)
    if count >= needed:
        return None
    detail = f" ({error})" if error else ""
    return SkipReason(NEEDS_DEVICES, f"{what} needs {needed} {_backend_name(ctx.backend)} devices{per}, {count} visible{detail}")


def _devices_check(n: int) -> Callable[[_Context], SkipReason | None]:
    def run(ctx: _Context) -> SkipReason | None:
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

    def run(ctx: _Context) -> SkipReason | None:
        name = _backend_name(ctx.backend)
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

        def run(ctx: _Context) -> SkipReason | None:
            name = _backend_name(ctx.backend)
            if training:
                from accel.utils.fp8 import fp8_refusal

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
    return getattr(backend, "device_type", None) == "cpu"


def _world_size_checks(world_size: int) -> list[_Check]:
    def multiprocess(ctx: _Context) -> SkipReason | None:
        comm, why = _comm_backend(ctx.backend)
        if comm is not None:
            return None
        name = _backend_name(ctx.backend)
        return SkipReason(NEEDS_MULTIPROCESS, f"world size {world_size} needs several processes, but {name} has no collective backend: {why}")

    def devices(ctx: _Context) -> SkipReason | None:
        if ranks_share_device(ctx.backend):
            return None
        return _too_few_devices(ctx, world_size, f"world size {world_size}", per=" (one per rank)")

    return [_Check(_RANK_MULTIPROCESS, multiprocess), _Check(_RANK_DEVICES, devices)]


def _parse(marks: Iterable[Any], where: str | None) -> tuple[list[_Check], list[int] | None]:
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


def validate(marks: Iterable[Any], where: str | None = None) -> None:
    """Raise :class:`MarkerUsageError` if any harness mark in ``marks`` is used wrongly."""
    _parse(marks, where)


def _resolve_torch_version(backend: Any, given: Any) -> Version:
    value = given
    if value is None:
        value = getattr(backend, "torch_version", None)
    if value is None:
        from accel.backends.base import torch_version

        value = torch_version()
    try:
        return Version(Version(str(value)).base_version)
    except InvalidVersion:
        raise ValueError(f"not a torch version: {value!r}") from None


def _availability(backend: Any) -> tuple[bool, str]:
    availability = getattr(backend, "availability", None)
    if availability is not None:
        return bool(getattr(availability, "available", availability)), str(getattr(availability, "reason", "") or "")
    probe = getattr(backend, "is_available", None)
    if callable(probe):
        return bool(probe()), ""
    return True, ""


def evaluate(
    marks: Iterable[Any],
    backend: Any,
    world_size: int | None = None,
    torch_version: Any = None,
    *,
    where: str | None = None,
) -> SkipReason | None:
    """The first reason for this test instance to skip, or None to run it.

    ``marks`` are the item's marks (pytest ``Mark`` objects or anything with ``name``, ``args`` and
    ``kwargs``; non-harness marks are ignored), ``backend`` the Backend the instance runs on and
    ``world_size`` its world size (default: the ``world_size`` mark's value when it names a single
    size, else 1). ``torch_version`` defaults to the backend's (``backend.torch_version``).
    ``where`` (the nodeid) is put into usage errors.

    Every mark is validated before anything is evaluated, so a usage error is raised on every
    backend alike. Checks run in a fixed order: backend availability, backend restrictions
    (``require_backend``, ``require_non_*``), known limitations, torch version, packages,
    multi-process support, device count, and last the dtype probes (which run a tiny kernel).
    """
    checks, sizes = _parse(marks, where)
    if world_size is None:
        world_size = sizes[0] if sizes and len(sizes) == 1 else 1
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")

    available, why = _availability(backend)
    if not available:
        return SkipReason(BACKEND_UNAVAILABLE, f"{_backend_name(backend)}: {why or 'not available'}")
    if world_size > 1:
        checks.extend(_world_size_checks(world_size))
    ctx = _Context(backend, world_size, _resolve_torch_version(backend, torch_version))
    for check in sorted(checks, key=lambda c: c.rank):  # stable: mark order within a rank
        reason = check.run(ctx)
        if reason is not None:
            return reason
    return None
