"""Environment-variable helpers with Accelerate's names (``accelerate.utils.environment``).

Reading: :func:`str_to_bool`, :func:`parse_flag_from_env`, :func:`parse_choice_from_env`,
:func:`get_int_from_env`, :func:`env_value` (accel's ``ACCEL_*`` name first, Accelerate's
``ACCELERATE_*`` alias second). Changing, for tests and launchers: :func:`patch_environment`,
:func:`clear_environment`, :func:`purge_accelerate_environment`,
:func:`convert_dict_to_env_variables`.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

from ..facts.environment import FALSE_WORDS, TRUE_WORDS, env_flag, env_text

logger = logging.getLogger(__name__)

__all__ = [
    "ENV_PREFIXES",
    "are_libraries_initialized",
    "clear_environment",
    "convert_dict_to_env_variables",
    "env_value",
    "get_int_from_env",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "str_to_bool",
]

#: accel's own prefix first, then Accelerate's: ``ACCEL_X`` wins over ``ACCELERATE_X``
ENV_PREFIXES = ("ACCEL_", "ACCELERATE_")

def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """``1``/``0`` (or ``True``/``False`` with ``to_bool``) for a yes/no word; ValueError for anything else.

    The words are :data:`accel.facts.environment.TRUE_WORDS` / ``FALSE_WORDS`` (Accelerate's).
    """
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True if to_bool else 1
    if text in FALSE_WORDS:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value!r}: expected one of {sorted(TRUE_WORDS | FALSE_WORDS)}")


def env_value(suffix: str, default: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of ``ACCEL_<suffix>``, else of Accelerate's ``ACCELERATE_<suffix>``, else ``default``.

    Empty values count as unset, so ``ACCEL_X=`` does not hide ``ACCELERATE_X=1``.
    """
    return env_text(*(prefix + suffix for prefix in ENV_PREFIXES), default=default, environ=environ)


def get_int_from_env(env_keys: Iterable[str], default: int) -> int:
    """The first non-negative integer among the variables ``env_keys``, else ``default``.

    A set variable that is not an integer is an error naming it (Accelerate raises a bare ValueError).
    """
    for key in env_keys:
        raw = os.environ.get(key)
        if raw is None or raw.strip() == "":
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"environment variable {key} must be an integer, got {raw!r}") from None
        if value >= 0:
            return value
    return default


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Whether the yes/no variable ``key`` is set to a true value (``default`` when unset or empty);
    another value is a ValueError naming ``key``."""
    return env_flag(key, default=default)


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """The raw value of ``key``, or ``default`` (as a string) when unset."""
    return os.environ.get(key, str(default))


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of ``library_names`` that are already imported in this process."""
    return [name for name in library_names if name in sys.modules]


_FORBIDDEN = (";", "\n", "<", ">", " ")


def convert_dict_to_env_variables(current_env: Mapping[str, str]) -> list[str]:
    """``["KEY=value\\n", ...]`` for the items safe to write into an environment file.

    Items whose key or value is empty or holds ``; < >``, a space or a newline are left out with a
    warning (they would break or inject into the file a multi-node launcher sources).
    """
    lines = []
    for key, value in current_env.items():
        key, value = str(key), str(value)
        if key and value and not any(ch in key or ch in value for ch in _FORBIDDEN):
            lines.append(f"{key}={value}\n")
        else:
            logger.warning(f"WARNING: Skipping {key}={value} as it contains forbidden characters or missing values.")
    return lines


@contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty ``os.environ``; the previous environment is back afterwards."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set ``KEY=str(value)`` for each keyword (keys upper-cased) during the block, then restore.

    A key that existed before gets its old value back, a new one is removed, even if the block raises.
    """
    updates = {key.upper(): str(value) for key, value in kwargs.items()}
    saved = {key: os.environ.get(key) for key in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


_PURGED = "_accelerate_is_purged_environment_wrapped"


def _is_purged_name(key: str) -> bool:
    return key.startswith(ENV_PREFIXES)


@contextmanager
def _restore_accelerate_variables() -> Iterator[None]:
    before = {k: v for k, v in os.environ.items() if _is_purged_name(k)}
    try:
        yield
    finally:
        for key in [k for k in os.environ if _is_purged_name(k)]:
            if key not in before:
                del os.environ[key]
        os.environ.update(before)


def _purging(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _restore_accelerate_variables():
            return function(*args, **kwargs)

    setattr(wrapper, _PURGED, True)
    return wrapper


def _purge_test_methods(cls: type) -> type:
    for name in dir(cls):
        if not name.startswith("test"):
            continue
        member = getattr(cls, name)
        if callable(member) and not getattr(member, _PURGED, False):
            setattr(cls, name, _purging(member))
    return cls


def purge_accelerate_environment(func_or_cls: Any) -> Any:
    """Undo the ``ACCEL_*``/``ACCELERATE_*`` variables a test (function, or every ``test*`` method of a class) sets.

    Some code (e.g. ``transformers.TrainingArguments(fp16=True)``) exports ``ACCELERATE_*`` variables
    that would leak into the next test. Variables that existed before the test keep their values.
    Decorating a class also covers its subclasses' test methods (unittest and plain pytest classes).
    """
    if not isinstance(func_or_cls, type):
        return _purging(func_or_cls)
    _purge_test_methods(func_or_cls)
    previous = func_or_cls.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        if previous is not None:
            previous.__func__(cls, **kwargs)
        _purge_test_methods(cls)

    func_or_cls.__init_subclass__ = classmethod(__init_subclass__)
    return func_or_cls


# ---------------------------------------------------------------------------------------------------
# Host and device facts Accelerate reads before any device is initialised (nvidia-smi, /sys, MPI variables)


@dataclass
class CPUInformation:
    """Rank, world size and their node-local counterparts of a CPU run, from torchrun's or MPI's variables."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1


def get_cpu_distributed_information() -> CPUInformation:
    """Where this process sits in a CPU run, read from torchrun, Intel MPI, Open MPI or MVAPICH variables."""
    return CPUInformation(
        rank=get_int_from_env(["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"], 0),
        world_size=get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1),
        local_rank=get_int_from_env(
            ["LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK"], 0),
        local_world_size=get_int_from_env(
            ["LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"], 1),
    )


def _nvidia_smi(*query: str) -> list[str]:
    """Lines of ``nvidia-smi --query-gpu=<query> --format=csv,noheader`` (FileNotFoundError without the tool)."""
    import shutil
    import subprocess

    tool = shutil.which("nvidia-smi") or (shutil.which("nvidia-smi.exe") if os.name == "nt" else None)
    if tool is None:
        raise FileNotFoundError("nvidia-smi is not on PATH (no NVIDIA driver on this machine)")
    out = subprocess.check_output([tool, f"--query-gpu={','.join(query)}", "--format=csv,noheader"], text=True)
    return [line.strip() for line in out.strip().splitlines() if line.strip()]


def get_gpu_info() -> tuple[list[str], int]:
    """Names and count of the NVIDIA GPUs, asked of nvidia-smi so that CUDA is not initialised."""
    lines = _nvidia_smi("count", "name")
    return [line.split(",", 1)[1].strip() for line in lines], len(lines)


def get_driver_version() -> str:
    """The NVIDIA driver version, from nvidia-smi."""
    return _nvidia_smi("driver_version")[0]


def check_cuda_p2p_ib_support() -> bool:
    """False when several consumer GPUs (RTX 40 series) run a driver older than 550.40.07, where P2P/IB hang.

    Asks nvidia-smi only, so CUDA stays uninitialised; any failure to ask means "no known problem" (True).
    """
    from packaging.version import Version

    try:
        names, count = get_gpu_info()
        if count > 1 and any("RTX 40" in name for name in names):
            return Version(get_driver_version()) >= Version("550.40.07")
    except Exception:
        pass
    return True


@functools.lru_cache(maxsize=None)
def check_cuda_fp8_capability() -> bool:
    """Whether the first NVIDIA GPU has compute capability >= 8.9 (fp8 matmuls).

    Asks nvidia-smi first; without it, the cuda backend (which initialises CUDA).
    """
    try:
        major, minor = (int(part) for part in _nvidia_smi("compute_cap")[0].split(".")[:2])
        return (major, minor) >= (8, 9)
    except Exception:
        from ..backends import get_registry

        return bool(get_registry().get("cuda").supports_fp8)


def get_current_device_type() -> tuple[str, str]:
    """``(device type, distributed type)`` of the first available accelerator in the registry's probe order.

    Nothing is initialised beyond the availability probes; with no accelerator the answer is
    Accelerate's default, ``("cuda", "MULTI_GPU")``.
    """
    from ..backends import get_registry

    for backend in get_registry().probe_order():
        if not backend.is_host and backend.is_available():
            return backend.device_type, backend.distributed_type
    return "cuda", "MULTI_GPU"


def _numa_nodes() -> list[list[int]]:
    """CPU ids of each NUMA node, from /sys (one node holding every CPU where /sys has none)."""
    import glob
    import re

    nodes = []
    for path in sorted(glob.glob("/sys/devices/system/node/node[0-9]*/cpulist"),
                       key=lambda p: int(re.search(r"node(\d+)/", p).group(1))):
        cpus: list[int] = []
        with open(path) as handle:
            for part in handle.read().strip().split(","):
                if part:
                    low, _, high = part.partition("-")
                    cpus.extend(range(int(low), int(high or low) + 1))
        if cpus:
            nodes.append(cpus)
    return nodes or [sorted(os.sched_getaffinity(0))]


@functools.lru_cache(maxsize=None)
def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to the CPUs of one NUMA node (node ``local_process_index`` modulo the node count).

    Spreads the processes of a node over its NUMA domains; cached, so repeated calls do nothing.
    ``verbose`` (default: ``ACCELERATE_DEBUG_MODE``) logs the assignment.
    """
    if local_process_index < 0:
        raise ValueError(f"local_process_index must be >= 0, got {local_process_index}")
    nodes = _numa_nodes()
    node = local_process_index % len(nodes)
    os.sched_setaffinity(0, nodes[node])
    if verbose if verbose is not None else parse_flag_from_env("ACCELERATE_DEBUG_MODE"):
        logger.info("process %d pinned to NUMA node %d (cpus %s)", local_process_index, node, nodes[node])


__all__ += ["CPUInformation", "check_cuda_fp8_capability", "check_cuda_p2p_ib_support", "get_cpu_distributed_information",
            "get_current_device_type", "get_driver_version", "get_gpu_info", "set_numa_affinity"]
