"""Test decorators and helpers with Accelerate's names, answered by accel's backend registry.

Every ``require_*`` decorator (and ``slow``) is a row of :data:`accel.facts.requirements.REQUIREMENT_TABLE`,
the table ``accel_harness.markers`` builds its Accelerate aliases from, evaluated here against the
active backend when the test is decorated. A decorator attaches
``pytest.mark.skipif(not satisfied, reason=..., reason_code=..., requirement=...)`` to a test
function, class or ``unittest.TestCase`` method and, when the test is to be skipped, also
``unittest.skip`` so plain ``unittest`` runners skip it too. The skip text is
``"[code] message (detail)"``, e.g. ``[not-on-backend] test requires a cuda device (the active
backend is cpu; backend cuda unavailable: ...)``, the form the harness's result recorder parses.

Device questions go to the backend registry only; this module never touches a device module.
"""

from __future__ import annotations

import inspect
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ..facts import versions
from ..facts.environment import env_flag
from ..facts.network import DEFAULT_PORT
from ..facts.reasons import (
    KNOWN_LIMITATION, NEEDS_DEVICES, NEEDS_MULTIPROCESS, NEEDS_PACKAGE, NOT_ON_BACKEND, OPT_IN, SKIP_CODES, TORCH_VERSION,
    UNSUPPORTED_DTYPE,
)
from ..facts.requirements import REQUIREMENT_TABLE, Need, Row, marker_code, module_found, package_problem
from ..utils.environment import str_to_bool  # noqa: F401 - Accelerate re-exports it here
from ..utils.imports import is_hpu_available, is_torch_version, is_xpu_available  # noqa: F401 - Accelerate re-exports them here

__all__ = [
    "REASON_CODES",
    "REQUIREMENTS",
    "AccelerateTestCase",
    "MockingTestCase",
    "Requirement",
    "SubprocessCallException",
    "TempDirTestCase",
    "are_the_same_tensors",
    "assert_exception",
    "capture_call_output",
    "evaluate_requirement",
    "execute_subprocess_async",
    "get_launch_command",
    "get_torch_dist_unique_port",
    "parse_flag_from_env",
    "path_in_accel_package",
    "path_in_accelerate_package",
    "pytest_xdist_worker_id",
    "run_command",
    "run_first",
    "skip",
    "skip_unless",
    "slow",
]

REASON_CODES = SKIP_CODES


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """The yes/no environment variable ``key``, else ``default``; another value is a ValueError naming ``key``."""
    return env_flag(key, default=default)


# ---------------------------------------------------------------------- the requirement table, evaluated here
Check = tuple[bool, str]


@dataclass(frozen=True)
class Requirement:
    """One decorator's condition: ``predicate(**params)`` gives ``(satisfied, detail)`` or
    ``(satisfied, detail, code)``; ``reason_code`` is the code when the predicate names none.

    ``message`` may hold ``{param}`` fields (``"test requires torch >= {version}"``).
    """

    predicate: Callable[..., Any]
    reason_code: str
    message: str

    def check(self, **params: Any) -> tuple[bool, str, str]:
        """``(satisfied, reason, code)``; a predicate that raises counts as unsatisfied, with the error."""
        code = self.reason_code
        try:
            answer = self.predicate(**params)
            satisfied, detail = answer[0], answer[1]
            if len(answer) > 2:
                code = answer[2]
        except Exception as exc:  # a broken probe must skip with its error, not break collection
            satisfied, detail = False, f"check failed: {type(exc).__name__}: {exc}"
        message = self.message.format(**params)
        return bool(satisfied), (f"{message} ({detail})" if detail else message), code

    def evaluate(self, **params: Any) -> tuple[bool, str]:
        """``(satisfied, reason)``, as :meth:`check` without the code."""
        satisfied, reason, _ = self.check(**params)
        return satisfied, reason


def _registry() -> Any:
    from ..backends import get_registry

    return get_registry()


def _active() -> Any:
    from ..backends import get_backend

    return get_backend()


def _package_problem(requirement: str) -> str | None:
    return package_problem(requirement)


def _named_backend_state(name: str) -> str:
    """Whether the backend ``name`` is registered and available here, in words."""
    from ..backends import UnknownBackendError

    try:
        backend = _registry().get(name)
    except UnknownBackendError:
        return f"no backend named {name!r} is registered (known: {', '.join(_registry().names())})"
    state = "available" if backend.is_available() else "unavailable"
    return f"backend {name} {state}: {backend.availability.reason}"


def _need_backend(backend: Any, *names: str) -> tuple[bool, str, str]:
    ok = backend.name in names
    detail = f"the active backend is {backend.name}"
    if not ok:
        detail += "; " + "; ".join(_named_backend_state(name) for name in names)
    return ok, detail, NOT_ON_BACKEND


def _need_non(backend: Any, excluded: str) -> tuple[bool, str, str]:
    return backend.name != excluded, f"the active backend is {backend.name}", NOT_ON_BACKEND


def _need_devices(backend: Any, n: int, exact: bool = False, of: tuple[str, ...] = ()) -> tuple[bool, str, str]:
    if of and backend.name not in of:
        return False, f"needs {n} {' or '.join(of)} device(s); the active backend is {backend.name}", NEEDS_DEVICES
    count = backend.device_count()
    ok = count == n if exact else count >= n
    return ok, f"the active backend {backend.name} has {count} device(s)", NEEDS_DEVICES


def _need_dtype(attribute: str, backend: Any, amp: bool = False, training: bool = False) -> tuple[bool, str, str]:
    if training:
        from ..precision.fp8 import fp8_refusal

        refusal = fp8_refusal()
        if refusal is not None:
            return False, refusal, UNSUPPORTED_DTYPE
    cap = getattr(backend, f"{attribute}_amp" if amp else attribute)
    return bool(cap), f"{backend.name}: {cap.reason}" if cap.reason else backend.name, UNSUPPORTED_DTYPE


def _torch_matches(backend: Any, spec: str) -> tuple[bool, str, str]:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    installed = Version(Version(str(backend.torch_version)).base_version)
    return SpecifierSet(spec).contains(installed, prereleases=True), f"installed torch is {backend.torch_version}", TORCH_VERSION


def _need_fsdp2(backend: Any) -> tuple[bool, str, str]:
    ok, detail, code = _torch_matches(backend, f">={versions.TORCH_FSDP2}")
    if not ok:
        return ok, detail, code
    if backend.comm_backend is None:
        return False, f"{backend.name} has no collective backend", NEEDS_MULTIPROCESS
    return True, detail, code


def _need_packages(backend: Any, *requirements: str, any_of: bool = False) -> tuple[bool, str, str]:
    problems = [p for p in (_package_problem(r) for r in requirements) if p]
    if any_of:
        ok = len(problems) < len(requirements)
        return ok, "" if ok else f"none of {', '.join(requirements)} is installed", NEEDS_PACKAGE
    return not problems, "; ".join(problems), NEEDS_PACKAGE


def _need_no_package(backend: Any, name: str) -> tuple[bool, str, str]:
    present = _package_problem(name) is None
    return not present, f"{name} is installed" if present else "", KNOWN_LIMITATION


def _need_deepspeed(backend: Any) -> tuple[bool, str, str]:
    problem = _package_problem("deepspeed")
    if problem:
        return False, problem, NEEDS_PACKAGE
    from ..backends.deepspeed_agreement import deepspeed_accelerator_problem

    missing = deepspeed_accelerator_problem(backend)  # None too where the backend brings its own accelerator
    if missing:
        return False, missing, NOT_ON_BACKEND
    return True, "", NEEDS_PACKAGE


def _need_opt_in(backend: Any, variable: str) -> tuple[bool, str, str]:
    try:
        return env_flag(variable), f"set {variable}=1 to run it", OPT_IN
    except ValueError as exc:  # not a yes/no word: the test skips, saying so
        return False, str(exc), OPT_IN


def _need_slow(backend: Any) -> tuple[bool, str, str]:
    return True, "", OPT_IN


#: harness marker -> how accel.test_utils answers it for the active backend
_NEED_CHECKS: dict[str, Callable[..., tuple[bool, str, str]]] = {
    "require_backend": _need_backend,
    "require_devices": _need_devices,
    "require_multi_device": partial(_need_devices, n=2),
    "require_fp16": partial(_need_dtype, "supports_fp16"),
    "require_bf16": partial(_need_dtype, "supports_bf16"),
    "require_fp8": partial(_need_dtype, "supports_fp8"),
    "require_torch": _torch_matches,
    "require_fsdp2": _need_fsdp2,
    "require_package": _need_packages,
    "require_no_package": _need_no_package,
    "require_deepspeed": _need_deepspeed,
    "require_opt_in": _need_opt_in,
    "slow": _need_slow,
}


def _check_need(need: Need, backend: Any) -> tuple[bool, str, str]:
    if need.marker.startswith("require_non_"):
        return _need_non(backend, need.marker[len("require_non_"):])
    try:
        check = _NEED_CHECKS[need.marker]
    except KeyError:
        raise ValueError(f"accel.test_utils cannot evaluate the marker {need.marker!r}") from None
    return check(backend, *need.args, **dict(need.kwargs))


def check_needs(needs: tuple[Need, ...], backend: Any = None) -> tuple[bool, str, str]:
    """``(satisfied, detail, code)`` of ``needs`` (all must hold) on ``backend`` (default: the active one);
    the first unmet need gives the detail and the code."""
    backend = _active() if backend is None else backend
    details, code = [], ""
    for need in needs:
        ok, detail, need_code = _check_need(need, backend)
        code = code or need_code
        if not ok:
            return False, detail, need_code
        if detail:
            details.append(detail)
    return True, "; ".join(dict.fromkeys(details)), code


def _from_row(row: Row) -> Requirement:
    return Requirement(partial(check_needs, row.needs), marker_code(row.needs[0].marker), row.message)


def _never() -> Check:
    return False, ""


#: decorator name -> Requirement, one per row of accel.facts.requirements.REQUIREMENT_TABLE (plus ``skip``)
REQUIREMENTS: dict[str, Requirement] = {name: _from_row(row) for name, row in REQUIREMENT_TABLE.items()}
REQUIREMENTS["require_torch_min_version"] = Requirement(
    lambda version=None: check_needs((Need("require_torch", (f">={_version_param(version)}",)),)),
    TORCH_VERSION, "test requires torch >= {version}")
REQUIREMENTS["skip"] = Requirement(_never, KNOWN_LIMITATION, "Test was skipped")


def _version_param(version: Any) -> str:
    if version is None:
        raise ValueError("require_torch_min_version needs version=...")
    return str(version)


def evaluate_requirement(name: str, **params: Any) -> tuple[bool, str, str]:
    """``(satisfied, reason, reason_code)`` for the decorator ``name`` (a key of :data:`REQUIREMENTS`)."""
    try:
        row = REQUIREMENTS[name]
    except KeyError:
        raise KeyError(f"unknown requirement {name!r}; known: {', '.join(sorted(REQUIREMENTS))}") from None
    return row.check(**params)


def skip_unless(satisfied: bool, reason: str, reason_code: str, requirement: str = "") -> Callable[[Any], Any]:
    """A decorator that skips a test (function, class or TestCase method) unless ``satisfied``.

    The skip text is ``"[reason_code] reason"``. It attaches a ``pytest.mark.skipif`` carrying
    ``reason_code`` and ``requirement`` (when pytest is installed) and, if the test is to be
    skipped, ``unittest.skip`` for plain unittest runs.
    """
    if reason_code not in REASON_CODES:
        raise ValueError(f"unknown reason code {reason_code!r}; known: {', '.join(REASON_CODES)}")
    reason = f"[{reason_code}] {reason}"

    def decorate(test_case: Any) -> Any:
        if not satisfied:
            test_case = unittest.skip(reason)(test_case)
        try:
            import pytest
        except ImportError:
            return test_case
        mark = pytest.mark.skipif(not satisfied, reason=reason, reason_code=reason_code, requirement=requirement)
        return mark(test_case)

    return decorate


def _decorator(name: str) -> Callable[[Any], Any]:
    row = REQUIREMENTS[name]

    def decorator(test_case: Any) -> Any:
        satisfied, reason, code = row.check()
        return skip_unless(satisfied, reason, code, name)(test_case)

    decorator.__name__ = decorator.__qualname__ = name
    decorator.__doc__ = f"Skip the test unless: {row.message} (reason code {row.reason_code})."
    return decorator


def require_torch_min_version(test_case: Any = None, version: str | None = None) -> Any:
    """Skip the test when the installed torch is older than ``version``."""
    if version is None:
        raise ValueError("require_torch_min_version needs version=..., e.g. @require_torch_min_version(version='2.5')")
    if test_case is None:
        return partial(require_torch_min_version, version=version)
    satisfied, reason, code = evaluate_requirement("require_torch_min_version", version=version)
    return skip_unless(satisfied, reason, code, "require_torch_min_version")(test_case)


def run_first(test_case: Any) -> Any:
    """``pytest.mark.order(1)`` when the pytest-order plug-in is installed; the test unchanged otherwise."""
    if module_found("pytest_order"):
        import pytest

        return pytest.mark.order(1)(test_case)
    return test_case


# one module-level decorator per table row (require_torch_min_version is parametrised, above)
for _name in REQUIREMENTS:
    if _name != "require_torch_min_version":
        globals()[_name] = _decorator(_name)
        __all__.append(_name)
del _name


# ---------------------------------------------------------------------- device facts, lazily
def _device_facts() -> tuple[str, int, Callable[[], int]]:
    backend = _active()
    if backend.has_memory_stats:
        return backend.device_type, backend.device_count(), lambda: backend.memory_allocated()
    return backend.device_type, backend.device_count(), lambda: 0


def get_launch_command(**kwargs: Any) -> list[str]:
    """``["accel", "launch", "--key=value", ...]``; a true bool gives ``--key``, None and False are left out."""
    command = ["accel", "launch"]
    for key, value in kwargs.items():
        if isinstance(value, bool):
            if value:
                command.append(f"--{key}")
        elif value is not None:
            command.append(f"--{key}={value}")
    return command


def __getattr__(name: str) -> Any:
    # torch_device, device_count, memory_allocated_func and DEFAULT_LAUNCH_COMMAND are computed on
    # first use, so importing this module probes no device
    if name in ("torch_device", "device_count", "memory_allocated_func"):
        device, count, allocated = _device_facts()
        values = {"torch_device": device, "device_count": count, "memory_allocated_func": allocated}
        globals().update(values)
        return values[name]
    if name == "DEFAULT_LAUNCH_COMMAND":
        command = get_launch_command(num_processes=__getattr__("device_count"), monitor_interval=0.1)
        globals()[name] = command
        return command
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------- test case bases
class TempDirTestCase(unittest.TestCase):
    """Keeps one temporary directory (``cls.tmpdir``) per class, emptied before each test."""

    clear_on_setup = True
    tmpdir: Path

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmpdir = Path(tempfile.mkdtemp())

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmpdir, ignore_errors=True)
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        if self.clear_on_setup:
            for path in self.tmpdir.iterdir():
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()


class AccelerateTestCase(unittest.TestCase):
    """Resets the shared Accelerator/Gradient state after every test."""

    def tearDown(self) -> None:
        super().tearDown()
        from ..state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()


class MockingTestCase(unittest.TestCase):
    """Call ``self.add_mocks(mocks)`` at the end of ``setUp`` to start mocks stopped after each test."""

    def add_mocks(self, mocks: Any) -> None:
        self.mocks = list(mocks) if isinstance(mocks, (list, tuple)) else [mocks]
        for patcher in self.mocks:
            patcher.start()
            self.addCleanup(patcher.stop)


# ---------------------------------------------------------------------- helpers
def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """True when every process holds a tensor equal to this process's ``tensor``."""
    from ..state import PartialState
    from ..utils.operations import gather

    device = PartialState().device
    stacked = gather(tensor[None].clone().to(device)).cpu()
    mine = tensor.detach().cpu()
    return all(torch.equal(stacked[i], mine) for i in range(stacked.shape[0]))


@contextmanager
def assert_exception(exception_class: type[BaseException], msg: str | None = None) -> Iterator[None]:
    """Assert that the block raises ``exception_class`` (with ``msg`` in its text when given)."""
    try:
        yield
    except Exception as exc:
        assert isinstance(exc, exception_class), f"expected {exception_class.__name__}, got {type(exc).__name__}: {exc}"
        if msg is not None:
            assert msg in str(exc), f"expected {msg!r} in the exception message, got {str(exc)!r}"
        return
    raise AssertionError(f"expected {exception_class.__name__}, but the block ran without raising")


def capture_call_output(func: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """What ``func(*args, **kwargs)`` prints to stdout."""
    buffer = io.StringIO()
    saved = sys.stdout
    sys.stdout = buffer
    try:
        func(*args, **kwargs)
    finally:
        sys.stdout = saved
    return buffer.getvalue()


class _RunOutput:
    def __init__(self, returncode: int, stdout: list[str], stderr: list[str]):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def execute_subprocess_async(cmd: list[Any], env: dict | None = None, stdin: Any = None, timeout: float = 180,
                             quiet: bool = False, echo: bool = True) -> _RunOutput:
    """Run ``cmd``, return its exit status and output lines; raise RuntimeError if it fails or times out.

    Output is captured and echoed after the command ends (unless ``quiet``).
    """
    cmd = [str(c) if isinstance(c, os.PathLike) else c for c in cmd]
    command_text = " ".join(cmd)
    if echo:
        print("\nRunning: ", command_text)
    try:
        done = subprocess.run(cmd, env=env, stdin=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"'{command_text}' did not finish within {timeout}s\n\nstderr:\n{exc.stderr or ''}") from None
    out, err = done.stdout.splitlines(), done.stderr.splitlines()
    if not quiet:
        for line in out:
            print("stdout:", line)
        for line in err:
            print("stderr:", line, file=sys.stderr)
    if done.returncode != 0:
        raise RuntimeError(
            f"'{command_text}' failed with returncode {done.returncode}\n\n"
            "The combined stderr from workers follows:\n" + "\n".join(err)
        )
    return _RunOutput(done.returncode, out, err)


class SubprocessCallException(Exception):
    """A command run by :func:`run_command` failed."""


def run_command(command: list[Any], return_stdout: bool = False, env: dict | None = None) -> str | None:
    """Run ``command`` (stderr merged into stdout); return its output if asked; raise on failure."""
    command = [str(c) if isinstance(c, os.PathLike) else c for c in command]
    try:
        output = subprocess.check_output(command, stderr=subprocess.STDOUT, env=env if env is not None else os.environ.copy())
    except subprocess.CalledProcessError as exc:
        raise SubprocessCallException(
            f"Command `{' '.join(command)}` failed with the following error:\n\n{exc.output.decode(errors='replace')}"
        ) from exc
    return output.decode("utf-8", errors="replace") if return_stdout else None


def pytest_xdist_worker_id() -> int:
    """This pytest-xdist worker's number (``gw3`` -> 3), 0 outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    match = re.fullmatch(r"gw(\d+)", worker.strip())
    return int(match.group(1)) if match else 0


def get_torch_dist_unique_port() -> int:
    """The default rendezvous port plus the xdist worker number, so parallel workers use different ports."""
    return DEFAULT_PORT + pytest_xdist_worker_id()


def path_in_accel_package(*components: str) -> Path:
    """A path inside the installed ``accel`` package."""
    import accel

    return Path(inspect.getfile(accel)).parent.joinpath(*components)


#: Accelerate's name for :func:`path_in_accel_package`
path_in_accelerate_package = path_in_accel_package
