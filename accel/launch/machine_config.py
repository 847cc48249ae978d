"""The default launch configuration for a machine: its backend, how many processes it runs, and the
distributed type that follows from both.

``accel config default`` and Accelerate's ``write_basic_config`` both write it; the questions of
``accel config`` start from it. Errors are :class:`MachineConfigError`, which the CLI shows on one line.
"""

from __future__ import annotations

from typing import Any

from accel.facts.network import DEFAULT_PORT
from accel.launch.config_file import DISTRIBUTED_TYPES, ConfigError, LaunchConfig

__all__ = [
    "MachineConfigError",
    "check_multiprocess",
    "collective_backend",
    "config_backend",
    "default_config",
    "devices_per_machine",
    "distributed_type_for",
]


class MachineConfigError(ValueError):
    """A launch configuration that cannot be written for this machine, with the reason."""


def config_backend(name: str | None, use_cpu: bool) -> Any:
    """The backend object for ``name`` (or the detected one). Unknown names are errors; an unavailable
    one is returned, since a config may be written for another machine (``is_available()`` tells)."""
    from accel.backends import BackendUnavailableError, UnknownBackendError, get_registry

    if use_cpu:
        if name not in (None, "cpu"):
            raise MachineConfigError(f"--cpu contradicts backend {name!r}")
        name = "cpu"
    registry = get_registry()
    try:
        return registry.select() if name is None else registry.get(name)
    except (UnknownBackendError, BackendUnavailableError) as exc:
        raise MachineConfigError(str(exc)) from None


def collective_backend(backend: Any) -> str | None:
    """The backend's collective backend, or None where it has none (it cannot run several processes)."""
    try:
        return backend.comm_backend
    except Exception:
        return None


def devices_per_machine(backend: Any) -> int:
    """Devices of ``backend`` on this machine (1 for the host, or where it cannot tell)."""
    if backend.is_host or not backend.is_available():
        return 1
    try:
        return max(int(backend.device_count()), 1)
    except Exception:
        return 1


def distributed_type_for(backend: Any, num_processes: int) -> str:
    """NO for one process, else the backend's multi-process type (MULTI_GPU where it names none we know)."""
    if num_processes <= 1:
        return "NO"
    kind = str(getattr(backend, "distributed_type", "MULTI_GPU")).upper()
    return kind if kind in DISTRIBUTED_TYPES and kind != "NO" else "MULTI_GPU"


def check_multiprocess(backend: Any, num_processes: int | None) -> None:
    """Refuse several processes on a backend without collectives, naming why it has none."""
    if num_processes and num_processes > 1 and collective_backend(backend) is None:
        reason = backend.comm_backend_reason() or "it has no collective backend"
        raise MachineConfigError(f"backend {backend.name!r} cannot run {num_processes} processes: {reason}")


def default_config(**values: Any) -> LaunchConfig:
    """The default config for this machine's backend (or ``values['backend']``), with ``values`` applied.

    ``num_processes`` defaults to the devices per machine times ``num_machines`` (1 per machine on
    cpu); ``distributed_type`` follows from the backend and the process count.
    """
    backend = config_backend(values.get("backend"), bool(values.get("use_cpu")))
    config = LaunchConfig(backend=backend.name, use_cpu=backend.is_host)
    for key, value in values.items():
        if key not in ("backend", "use_cpu"):
            setattr(config, key, value)
    if config.num_processes is None:
        per_machine = devices_per_machine(backend) if collective_backend(backend) else 1
        if config.gpu_ids not in (None, "all"):
            per_machine = len(config.gpu_ids.split(","))
        config.num_processes = per_machine * config.num_machines
    check_multiprocess(backend, config.num_processes)
    if "distributed_type" not in values:
        config.distributed_type = distributed_type_for(backend, config.num_processes)
    if config.num_machines > 1:
        if not config.main_process_ip:
            raise MachineConfigError(
                f"{config.num_machines} machines need --main_process_ip (the address of the machine of rank 0)")
        if config.main_process_port is None:
            config.main_process_port = DEFAULT_PORT
    try:
        return config.validate()
    except ConfigError as exc:
        raise MachineConfigError(str(exc)) from None
