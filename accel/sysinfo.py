"""What this machine and this installation are: the facts `accel env` prints and a results header records.

:func:`collect_environment` returns plain JSON-ready data (accel, torch and its build, python, platform,
cpu, packages, every backend with its devices, the backend a launch here would select and why, the run
an Accelerator started here would get, DeepSpeed's agreement, plug-ins, the environment variables that
steer a run, the config file). Device facts come from the backend objects (this module never touches a
device module). Every probe is guarded: one that fails leaves ``{"error": "..."}`` in its field and the
rest is still collected, because a half-broken machine is when this runs. The command (`accel env`) and
its text form are :mod:`accel.commands.env`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
from typing import Any, Callable

__all__ = ["COLLECTIVES", "ENV_VARS", "ONECCL_MODULE", "PACKAGES", "SCHEMA_VERSION", "collect_environment", "is_error",
           "torch_build"]

#: bumped when a key is renamed or removed (adding keys keeps the version)
SCHEMA_VERSION = 1

#: variables of torch, DeepSpeed and the devices that change a run, reported when set (accel's own
#: variables, those of accel.facts.environment's table, are reported too)
ENV_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "HABANA_VISIBLE_MODULES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "OMP_NUM_THREADS",
    "GLOO_SOCKET_IFNAME",
    "DS_ACCELERATOR",
)

#: distributions whose versions are reported (looked up in metadata, never imported)
PACKAGES = ("numpy", "deepspeed", "safetensors", "psutil", "PyYAML")

#: torch.distributed collective backends, each probed with ``is_<name>_available``
COLLECTIVES = ("gloo", "nccl", "mpi", "ucc", "xccl")


#: the module of Intel's oneCCL bindings for torch (its presence is reported)
ONECCL_MODULE = "oneccl_bindings_for_pytorch"


def is_error(value: Any) -> bool:
    """Whether a collected field is a failed probe (``{"error": "..."}``)."""
    return isinstance(value, dict) and set(value) == {"error"}


# ---------------------------------------------------------------------------- collection
def collect_environment(include_deepspeed: bool = True, config_file: str | None = None) -> dict[str, Any]:
    """Everything `accel env` reports, as JSON-serialisable data with stable top-level keys.

    Any value may instead be ``{"error": "<ExceptionType>: <message>"}`` when its probe failed.
    ``include_deepspeed=False`` skips asking DeepSpeed (a child process, about a second) for
    callers that run often, such as every pytest session's results header; the conformance suites
    check the agreement as tests instead.
    """
    registry = _guard(_load_registry)
    env = {
        "schema_version": SCHEMA_VERSION,
        "accel": _guard(_accel_info),
        "torch": _guard(_torch_info),
        "python": _guard(_python_info),
        "platform": _guard(_platform_info),
        "cpu": _guard(_cpu_info),
        "packages": _guard(_package_versions),
        "backends": _guard(lambda: _backends(_usable(registry))),
        "selected_backend": _guard(lambda: _selected_backend(_usable(registry), config_file)),
        "distributed": _guard(_distributed_info),
        "run_plan": _guard(lambda: _run_plan(_usable(registry))),
        "deepspeed": _guard(lambda: _deepspeed_info(_usable(registry), include_deepspeed)),
        "plugins": _guard(lambda: _plugins(_usable(registry))),
        "environment_variables": _guard(lambda: _environment_variables(registry)),
        "config_file": _guard(lambda: _config_file(config_file)),
    }
    return _jsonable(env)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _guard(probe: Callable[[], Any]) -> Any:
    try:
        return probe()
    except Exception as exc:
        return {"error": _error_text(exc)}


def _load_registry() -> Any:
    from accel.backends import get_registry

    return get_registry()


def _usable(registry: Any) -> Any:
    if is_error(registry):
        raise RuntimeError(f"the backend registry could not be built ({registry['error']})")
    return registry


def _accel_info() -> dict[str, Any]:
    import accel

    return {"version": accel.__version__, "location": os.path.dirname(os.path.abspath(accel.__file__))}


def _torch_info() -> dict[str, Any]:
    import torch

    versions = torch.version
    return {
        "version": torch.__version__,
        "build": torch_build(versions),
        "cuda": getattr(versions, "cuda", None),
        "hip": getattr(versions, "hip", None),
        "xpu": getattr(versions, "xpu", None),
        "git_version": getattr(versions, "git_version", None),
        "debug": bool(getattr(versions, "debug", False)),
        "location": os.path.dirname(os.path.abspath(torch.__file__)),
    }


def torch_build(versions: Any) -> str:
    """What the torch wheel was compiled for: ``cpu``, ``CUDA 12.4``, ``ROCm 6.2``, ``XPU ...``."""
    rocm = getattr(versions, "rocm", None) or getattr(versions, "hip", None)
    if rocm:
        return f"ROCm {rocm}"
    if getattr(versions, "cuda", None):
        return f"CUDA {versions.cuda}"
    if getattr(versions, "xpu", None):
        return f"XPU {versions.xpu}"
    return "cpu"


def _python_info() -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }


def _platform_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "host": platform.node(),
    }


def _cpu_info() -> dict[str, Any]:
    def physical_cores() -> int | None:
        import psutil

        return psutil.cpu_count(logical=False)

    def usable_cores() -> int | None:
        affinity = getattr(os, "sched_getaffinity", None)
        return len(affinity(0)) if affinity else os.cpu_count()

    def torch_threads() -> int:
        import torch

        return torch.get_num_threads()

    def memory_total() -> int:
        import psutil

        return int(psutil.virtual_memory().total)

    return {
        "model": _guard(_cpu_model),
        "architecture": platform.machine(),
        "logical_cores": os.cpu_count(),
        "physical_cores": _guard(physical_cores),
        "usable_cores": _guard(usable_cores),
        "torch_threads": _guard(torch_threads),
        "memory_total": _guard(memory_total),
    }


def _cpu_model() -> str:
    """The processor's marketing name, read from the OS (``platform.processor()`` is often empty)."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    key, _, value = line.partition(":")
                    if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                        return value.strip()
        except OSError:
            pass
    elif sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5, check=False
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package_versions() -> dict[str, Any]:
    return {name: _guard(lambda name=name: _distribution_version(name)) for name in PACKAGES}


def _backends(registry: Any) -> list[dict[str, Any]]:
    out = []
    for backend in registry.probe_order():
        try:
            out.append(backend.describe())
        except Exception as exc:  # one broken backend must not hide the others
            availability = backend.availability
            out.append(
                {
                    "name": backend.name,
                    "device_type": backend.device_type,
                    "available": availability.available,
                    "reason": availability.reason,
                    "error": _error_text(exc),
                }
            )
    return out


def _config_backend(config_file: str | None) -> tuple[str, str | None]:
    """The config file in use and the backend it names (``backend``, or cpu by ``use_cpu``/MULTI_CPU)."""
    from pathlib import Path

    from accel.launch.config_file import ConfigError, config_file_in_use, load_config

    path, exists = (Path(config_file).expanduser(), True) if config_file else config_file_in_use()
    if not exists or not path.is_file():
        return str(path), None
    try:
        config = load_config(path).to_dict()
    except (ConfigError, OSError, ValueError):
        return str(path), None  # the config section reports what is wrong with it
    name = config.get("backend")
    if not name and (config.get("use_cpu") or config.get("distributed_type") == "MULTI_CPU"):
        name = "cpu"
    return str(path), (str(name).strip().lower() if name else None)


def _selected_backend(registry: Any, config_file: str | None = None) -> dict[str, Any]:
    """The backend a launch here would use, by the one precedence rule, and where it came from."""
    from accel.backends import OVERRIDE_ENV, BackendUnavailableError, UnknownBackendError
    from accel.launch.precedence import choose

    requested = (os.environ.get(OVERRIDE_ENV) or "").strip().lower() or None
    config_path, configured = _config_backend(config_file)
    choice = choose("backend", environment=(OVERRIDE_ENV, requested), config=(config_path, configured))
    source = {"environment": OVERRIDE_ENV, "config file": f"config file {config_path}"}.get(choice.source, "detected")
    info: dict[str, Any] = {"name": None, "source": source, "note": choice.note, "error": None}
    try:
        info["name"] = registry.select(choice.value).name
    except (BackendUnavailableError, UnknownBackendError) as exc:
        info["error"] = str(exc)
    return info


def _run_plan(registry: Any) -> dict[str, Any]:
    """The strategy an Accelerator started here would run, from the launcher's environment (accel.resolve)."""
    from accel.resolve import resolve_run
    from accel.state import ProcessLayout

    layout = ProcessLayout.from_environment()
    backend = registry.select()
    plan = resolve_run(layout.world_size, backend.distributed_type)
    return {"strategy": plan.strategy, "distributed_type": str(plan.distributed_type), "num_processes": layout.world_size,
            "launcher": layout.source, "reasons": dict(plan.reasons), "fp8": _fp8_info(backend)}


def _fp8_info(backend: Any) -> dict[str, Any]:
    """What ``mixed_precision="fp8"`` would run here: "fp8", "fp8 (emulated)", or the refusal the launcher gives."""
    from accel.precision.fp8 import describe_fp8

    return describe_fp8(backend)


def _deepspeed_info(registry: Any, ask: bool = True) -> dict[str, Any]:
    """DeepSpeed's own accelerator choice next to accel's selection (``installed: False`` without DeepSpeed)."""
    from accel.backends.deepspeed_agreement import compare, deepspeed_installed, probe_deepspeed

    if not ask:
        return {"installed": deepspeed_installed(), "asked": False}
    selected = registry.select()
    answer = probe_deepspeed(backend=selected)  # a backend's own DeepSpeed accelerator is installed, as in a run
    if not answer.get("installed"):
        return answer
    return {**answer, "agreement": compare(selected, answer)}


def _distributed_info() -> dict[str, Any]:
    import torch.distributed as dist

    available = bool(dist.is_available())
    collectives: dict[str, Any] = {}
    for name in COLLECTIVES:
        probe = getattr(dist, f"is_{name}_available", None)
        if not available:
            collectives[name] = False
        elif probe is None:
            collectives[name] = None  # this torch release cannot tell
        else:
            collectives[name] = _guard(lambda probe=probe: bool(probe()))

    def default_map() -> dict[str, str] | None:
        mapping = getattr(getattr(dist, "Backend", None), "default_device_backend_map", None)
        return dict(mapping) if mapping is not None else None

    return {
        "available": available,
        "backends": collectives,
        ONECCL_MODULE: _guard(lambda: importlib.util.find_spec(ONECCL_MODULE) is not None),
        "default_device_backend_map": _guard(default_map) if available else None,
    }


def _plugins(registry: Any) -> dict[str, Any]:
    from accel.backends import ENTRY_POINT_GROUP

    entry_points = [f"{ep.name} = {ep.value}" for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]
    errors = [{"entry_point": e.entry_point, "error": e.error} for e in registry.plugin_errors]
    return {"entry_points": entry_points, "errors": errors}


def _environment_variables(registry: Any) -> dict[str, str]:
    from accel.facts.environment import ENV_VARS as CONTRACT, contract_entry

    names = [name for row in CONTRACT.values() for name in row.names] + list(ENV_VARS)
    names += sorted(name for name in os.environ if name not in names and contract_entry(name) is not None)
    if not is_error(registry):  # plug-in backends may bring their own visible-devices variable
        for backend in registry.probe_order():
            if backend.visible_devices_env and backend.visible_devices_env not in names:
                names.append(backend.visible_devices_env)
    return {name: os.environ[name] for name in names if name in os.environ}


def _config_file(config_file: str | None = None) -> dict[str, Any]:
    """Which config file is in use, whether it exists, and its contents (or why it cannot be used)."""
    from pathlib import Path

    from accel.launch.config_file import ConfigError, config_file_in_use, load_config

    if config_file:
        path = Path(config_file).expanduser()
        exists = path.is_file()
    else:
        path, exists = config_file_in_use()
    info: dict[str, Any] = {"path": str(path), "exists": exists}
    if exists:
        try:
            info["contents"] = load_config(path).to_dict()
        except ConfigError as exc:
            info["problem"] = str(exc)
    elif config_file:
        info["problem"] = f"no such file: {config_file}"
    return info


def _jsonable(value: Any) -> Any:
    """``value`` with everything JSON cannot hold turned into strings (keys included)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(v) for v in value), key=str)
    return str(value)
