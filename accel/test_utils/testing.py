"""Test decorators and helpers with Accelerate's names, answered by accel's backend registry.

Every ``require_*`` decorator is one row of :data:`REQUIREMENTS`: a predicate returning
``(satisfied, detail)``, a reason code and a message. The codes are the harness's
(``backend-unavailable``, ``not-on-backend``, ``needs-devices``, ``needs-package``,
``unsupported-dtype``, ``torch-version``, ``known-limitation``) plus ``opt-in`` for tests that run
only when asked (``@slow``). Applied to a test function, a test class or a ``unittest.TestCase``
method, a decorator evaluates its row once (at decoration time) and attaches
``pytest.mark.skipif(not satisfied, reason=..., reason_code=..., requirement=...)``; when the test
is to be skipped it also applies ``unittest.skip`` so plain ``unittest`` runners skip it too. The
skip text is ``"[code] message (detail)"``, e.g. ``[backend-unavailable] test requires a cuda
device (backend cuda unavailable: ...)``, the form the harness's result recorder parses. The
harness can reuse the table (:func:`evaluate_requirement`) to turn the same rows into its own
markers.

Device questions go to the backend registry only; this module never touches a device module.
"""

from __future__ import annotations

import importlib.util
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

from ..utils.imports import is_hpu_available, is_torch_version, is_xpu_available  # noqa: F401 - Accelerate re-exports them here
from ..utils.environment import str_to_bool  # noqa: F401

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

REASON_CODES = (
    "backend-unavailable",
    "not-on-backend",
    "needs-devices",
    "needs-package",
    "unsupported-dtype",
    "torch-version",
    "known-limitation",
    "opt-in",
)

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """The boolean environment variable ``key`` (yes/no, true/false, 1/0), else ``default``."""
    value = os.environ.get(key)
    if value is None:
        return default
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"if set, {key} must be yes or no (got {value!r})")


# ---------------------------------------------------------------------- the requirement table
Check = tuple[bool, str]


@dataclass(frozen=True)
class Requirement:
    """One decorator's condition: ``predicate(**params) -> (satisfied, detail)``, reason code, message.

    ``message`` may hold ``{param}`` fields (``"test requires torch >= {version}"``).
    """

    predicate: Callable[..., Check]
    reason_code: str
    message: str

    def evaluate(self, **params: Any) -> tuple[bool, str]:
        """``(satisfied, reason)``; a predicate that raises counts as unsatisfied, with the error."""
        try:
            satisfied, detail = self.predicate(**params)
        except Exception as exc:  # a broken probe must skip with its error, not break collection
            satisfied, detail = False, f"check failed: {type(exc).__name__}: {exc}"
        message = self.message.format(**params)
        return bool(satisfied), f"{message} ({detail})" if detail else message


def _registry() -> Any:
    from ..backends import get_registry

    return get_registry()


def _lookup(name: str) -> tuple[Any, str]:
    """(backend or None, why not)."""
    from ..backends import UnknownBackendError

    try:
        return _registry().get(name), ""
    except UnknownBackendError:
        return None, f"no backend named {name!r} is registered (known: {', '.join(_registry().names())})"


def _active() -> Any:
    from ..backends import get_backend

    return get_backend()


def _backend_is_available(name: str) -> Check:
    backend, why = _lookup(name)
    if backend is None:
        return False, why
    if not backend.is_available():
        return False, f"backend {name} unavailable: {backend.availability.reason}"
    return True, f"backend {name} available: {backend.availability.reason}"


def _any_backend_available(*names: str) -> Check:
    details = []
    for name in names:
        ok, detail = _backend_is_available(name)
        if ok:
            return True, detail
        details.append(detail)
    return False, "; ".join(details)


def _active_is(name: str) -> Check:
    active = _active()
    return active.name == name, f"the active backend is {active.name}"


def _active_is_not(name: str) -> Check:
    active = _active()
    return active.name != name, f"the active backend is {active.name}"


def _device_count(name: str) -> tuple[int, str]:
    ok, detail = _backend_is_available(name)
    if not ok:
        return 0, detail
    count = _registry().get(name).device_count()
    return count, f"backend {name} has {count} device(s)"


def _count_of(names: tuple[str, ...], wanted: Callable[[int], bool]) -> Check:
    details = []
    for name in names:
        count, detail = _device_count(name)
        if wanted(count):
            return True, detail
        details.append(detail)
    return False, "; ".join(details)


def _active_count(wanted: Callable[[int], bool], accelerator_only: bool = False) -> Check:
    active = _active()
    if accelerator_only and active.name == "cpu":
        return False, "the active backend is cpu, not an accelerator"
    count = active.device_count()
    return wanted(count), f"the active backend {active.name} has {count} device(s)"


def _capability(attr: str) -> Check:
    active = _active()
    cap = getattr(active, attr)
    return bool(cap), f"{active.name}: {cap.reason}" if cap.reason else active.name


def _fp8_training() -> Check:
    """fp8 training can run: a library accel drives for it (torchao) and fp8 on the active backend (as Accelerate's
    require_fp8 asks for a library and the device's capability)."""
    from ..utils.fp8 import fp8_refusal

    refusal = fp8_refusal()
    if refusal is not None:
        return False, refusal
    return _capability("supports_fp8")


def _package(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _packages(*names: str, any_of: bool = False) -> Check:
    present = [n for n in names if _package(n)]
    missing = [n for n in names if n not in present]
    if any_of:
        return bool(present), (f"{present[0]} is installed" if present else f"none of {', '.join(names)} is installed")
    return not missing, (f"{', '.join(missing)} not installed" if missing else "")


def _torch_at_least(version: str | None = None) -> Check:
    if version is None:
        raise ValueError("require_torch_min_version needs version=...")
    from ..utils.imports import is_torch_version
    from ..backends import torch_version

    return is_torch_version(">=", str(version)), f"installed torch is {torch_version()}"


def _no_package(name: str) -> Check:
    return not _package(name), f"{name} is installed" if _package(name) else ""


def _run_slow() -> Check:
    return parse_flag_from_env("RUN_SLOW", default=False), "set RUN_SLOW=1 to run it"


def _never() -> Check:
    return False, ""


def _flag(probe: str, what: str) -> Check:
    from ..utils import imports

    ok = getattr(imports, probe)()
    return ok, f"{what} {'is' if ok else 'is not'} available"


def _tensor_parallel() -> Check:
    from ..utils.imports import compare_versions, is_torch_version

    if not is_torch_version(">=", "2.3.0"):
        return False, "torch < 2.3.0"
    if not _package("transformers"):
        return False, "transformers not installed"
    ok = compare_versions("transformers", ">=", "4.52.0")
    return ok, "" if ok else "transformers < 4.52.0"


#: the trackers whose presence lets ``require_trackers`` tests run (Accelerate's choice)
_TRACKER_PACKAGES = ("wandb", "tensorboard", "trackio", "swanlab")


def _trackers() -> Check:
    present = [name for name in _TRACKER_PACKAGES if _package(name)]
    if not present:
        return False, f"none of {', '.join(_TRACKER_PACKAGES)} is installed"
    if _package("comet_ml"):
        return False, "comet_ml is installed (it patches the frameworks it finds at import)"
    return True, f"{present[0]} is installed"


def _backend_row(name: str) -> Requirement:
    return Requirement(partial(_backend_is_available, name), "backend-unavailable", f"test requires a {name} device")


def _package_row(package: str, label: str | None = None) -> Requirement:
    return Requirement(partial(_packages, package), "needs-package", f"test requires {label or package}")


#: decorator name -> Requirement; the one place each decorator's condition and reason live
REQUIREMENTS: dict[str, Requirement] = {
    # which backend is active / present
    "require_cpu": Requirement(partial(_active_is, "cpu"), "not-on-backend", "test requires only a CPU"),
    "require_non_cpu": Requirement(partial(_active_is_not, "cpu"), "not-on-backend",
                                   "test requires a hardware accelerator"),
    "require_cuda": _backend_row("cuda"),
    "require_xpu": _backend_row("xpu"),
    "require_mps": _backend_row("mps"),
    "require_hpu": _backend_row("hpu"),
    "require_npu": _backend_row("npu"),
    "require_mlu": _backend_row("mlu"),
    "require_musa": _backend_row("musa"),
    "require_sdaa": _backend_row("sdaa"),
    "require_neuron": _backend_row("neuron"),
    "require_tpu": _backend_row("xla"),
    "require_cuda_or_xpu": Requirement(partial(_any_backend_available, "cuda", "xpu"), "backend-unavailable",
                                       "test requires a cuda or xpu device"),
    "require_cuda_or_hpu": Requirement(partial(_any_backend_available, "cuda", "hpu"), "backend-unavailable",
                                       "test requires a cuda or hpu device"),
    "require_non_xpu": Requirement(partial(_active_is_not, "xpu"), "not-on-backend", "test does not run on xpu"),
    "require_non_hpu": Requirement(partial(_active_is_not, "hpu"), "not-on-backend", "test does not run on hpu"),
    "require_non_torch_xla": Requirement(partial(_no_package, "torch_xla"), "known-limitation",
                                         "test requires an environment without torch_xla"),
    # how many devices
    "require_single_device": Requirement(partial(_active_count, lambda n: n == 1, accelerator_only=True),
                                         "needs-devices", "test requires a single accelerator device"),
    "require_multi_device": Requirement(partial(_active_count, lambda n: n > 1), "needs-devices",
                                        "test requires several devices"),
    "require_single_gpu": Requirement(partial(_count_of, ("cuda",), lambda n: n == 1), "needs-devices",
                                      "test requires exactly one cuda device"),
    "require_single_xpu": Requirement(partial(_count_of, ("xpu",), lambda n: n == 1), "needs-devices",
                                      "test requires exactly one xpu device"),
    "require_multi_gpu": Requirement(partial(_count_of, ("cuda",), lambda n: n > 1), "needs-devices",
                                     "test requires several cuda devices"),
    "require_multi_xpu": Requirement(partial(_count_of, ("xpu",), lambda n: n > 1), "needs-devices",
                                     "test requires several xpu devices"),
    "require_multi_gpu_or_xpu": Requirement(partial(_count_of, ("cuda", "xpu"), lambda n: n > 1), "needs-devices",
                                            "test requires several cuda or xpu devices"),
    # dtypes on the active backend
    "require_fp16": Requirement(partial(_capability, "supports_fp16"), "unsupported-dtype", "test requires fp16 support"),
    "require_bf16": Requirement(partial(_capability, "supports_bf16"), "unsupported-dtype", "test requires bf16 support"),
    "require_fp8": Requirement(_fp8_training, "unsupported-dtype", "test requires fp8 training support"),
    # torch
    "require_torch_min_version": Requirement(_torch_at_least, "torch-version", "test requires torch >= {version}"),
    "require_fsdp2": Requirement(partial(_torch_at_least, "2.5.0"), "torch-version", "test requires FSDP2 (torch >= 2.5.0)"),
    # packages
    "require_deepspeed": _package_row("deepspeed", "DeepSpeed"),
    "require_tensorboard": Requirement(partial(_packages, "tensorboard", "tensorboardX", any_of=True), "needs-package",
                                       "test requires tensorboard"),
    "require_wandb": _package_row("wandb"),
    "require_comet_ml": _package_row("comet_ml"),
    "require_mlflow": _package_row("mlflow"),
    "require_aim": _package_row("aim"),
    "require_clearml": _package_row("clearml"),
    "require_dvclive": _package_row("dvclive"),
    "require_swanlab": _package_row("swanlab"),
    "require_trackio": _package_row("trackio"),
    "require_pandas": _package_row("pandas"),
    "require_matplotlib": _package_row("matplotlib"),
    "require_torchvision": _package_row("torchvision"),
    "require_timm": _package_row("timm"),
    "require_transformers": _package_row("transformers"),
    "require_datasets": _package_row("datasets"),
    "require_peft": _package_row("peft", "PEFT"),
    "require_bnb": _package_row("bitsandbytes"),
    "require_torchao": _package_row("torchao"),
    "require_triton": _package_row("triton"),
    "require_schedulefree": _package_row("schedulefree"),
    "require_transformer_engine": _package_row("transformer_engine"),
    "require_torchdata_stateful_dataloader": _package_row("torchdata", "torchdata (stateful_dataloader)"),
    "require_huggingface_suite": Requirement(partial(_packages, "transformers", "datasets"), "needs-package",
                                             "test requires the Hugging Face suite (transformers and datasets)"),
    "require_import_timer": _package_row("import_timer", "import_timer (the tuna interpreter)"),
    "require_pippy": Requirement(partial(_flag, "is_pippy_available", "torch.distributed.pipelining"), "needs-package",
                                 "test requires pipeline parallelism (torch.distributed.pipelining)"),
    "require_transformer_engine_mxfp8": Requirement(
        partial(_flag, "is_transformer_engine_mxfp8_available", "transformer_engine >= 2.0"), "needs-package",
        "test requires transformers engine MXFP8 block scaling"),
    "require_tp": Requirement(_tensor_parallel, "needs-package",
                              "test requires torch version >= 2.3.0 and transformers version >= 4.52.0"),
    "require_trackers": Requirement(_trackers, "needs-package",
                                    "test requires at least one tracker to be available and for `comet_ml` to not be installed"),
    # opt-in and unconditional
    "slow": Requirement(_run_slow, "opt-in", "test is slow"),
    "skip": Requirement(_never, "known-limitation", "Test was skipped"),
}


def evaluate_requirement(name: str, **params: Any) -> tuple[bool, str, str]:
    """``(satisfied, reason, reason_code)`` for the decorator ``name`` (a key of :data:`REQUIREMENTS`)."""
    try:
        row = REQUIREMENTS[name]
    except KeyError:
        raise KeyError(f"unknown requirement {name!r}; known: {', '.join(sorted(REQUIREMENTS))}") from None
    satisfied, reason = row.evaluate(**params)
    return satisfied, reason, row.reason_code


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
        satisfied, reason = row.evaluate()
        return skip_unless(satisfied, reason, row.reason_code, name)(test_case)

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
    if _package("pytest_order"):
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
    """29500 plus the xdist worker number, so parallel workers use different rendezvous ports."""
    return 29500 + pytest_xdist_worker_id()


def path_in_accel_package(*components: str) -> Path:
    """A path inside the installed ``accel`` package."""
    import accel

    return Path(inspect.getfile(accel)).parent.joinpath(*components)


#: Accelerate's name for :func:`path_in_accel_package`
path_in_accelerate_package = path_in_accel_package
