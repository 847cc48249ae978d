"""The launch plan: every check made and every setting decided (torchrun's arguments, the ranks'
environment, the rendezvous) before anything starts."""

from __future__ import annotations

import argparse
import copy
import os
import shutil
from typing import Any

from accel.commands import UsageError
from accel.facts.environment import env_flag
from accel.facts.network import DEFAULT_PORT
from accel.launch.network import (free_port_on, is_loopback, loopback_interface, port_in_use,
                                  port_taken_on_any_address)
from accel.launch.plan import DEFAULT_HANG_TIMEOUT, LaunchPlan

from .options import HANG_TIMEOUT_ENV, _given
from .settings import _refusals, _validate_launch_command

#: the module every rank runs (it runs the script and records its failures)
BOOTSTRAP_MODULE = "accel.launch.bootstrap"


def build_plan(args: argparse.Namespace) -> LaunchPlan:
    """Resolve flags > config file > defaults and check everything; UsageError on any mistake.

    Besides Accelerate's variables (:func:`accel.utils.launch.launch_env`), the ranks get ``ACCEL_DEVICE``
    (when the backend was chosen by flag or config), ``OMP_NUM_THREADS`` (unless set: usable cores per
    local process), the backend's visible-devices variable for ``--gpu_ids`` and, on one CPU node,
    ``GLOO_SOCKET_IFNAME`` bound to loopback. One node meets on 127.0.0.1 at a free port unless
    ``--main_process_ip``/``--main_process_port`` say otherwise.
    """
    from accel.utils.launch import launch_env

    target, no_python, module = _check_target(args)  # first: the cheapest check and the commonest slip
    args, defaults, mp_from_config = _validate_launch_command(args)
    _refusals(args, defaults)
    warnings: list[str] = []
    where = f" (config file {args.config_file or _config_path_text()})" if defaults is not None else ""

    backend = _resolve_backend(args, where, warnings)
    comm = _comm_backend(backend)

    num_machines, machine_rank = args.num_machines, args.machine_rank or 0
    if num_machines < 1:
        raise UsageError(f"--num_machines must be at least 1, got {num_machines}")
    if not 0 <= machine_rank < num_machines:
        raise UsageError(f"--machine_rank must be from 0 to num_machines - 1 ({num_machines - 1}), got {machine_rank}")
    args.machine_rank = machine_rank

    gpu_ids = _gpu_ids(args.gpu_ids) if args.gpu_ids is not None else None
    specific_ids = gpu_ids.split(",") if gpu_ids not in (None, "all") else None
    args.gpu_ids = gpu_ids
    if args.multi_gpu and specific_ids and len(specific_ids) < 2 and num_machines <= 1:
        raise UsageError("--multi_gpu with fewer than two --gpu_ids: list at least two devices, or use --gpu_ids all")

    num_processes = args.num_processes
    if num_processes is None:
        if specific_ids:
            per_machine = len(specific_ids)
        elif comm is not None and not backend.is_host:
            per_machine = max(backend.device_count(), 1)
        else:
            per_machine = 1
        num_processes = per_machine * num_machines
    if num_processes < 1:
        raise UsageError(f"--num_processes must be at least 1, got {num_processes}")
    if num_processes % num_machines:
        raise UsageError(f"--num_processes ({num_processes}) is the total over all machines and must be a multiple of --num_machines ({num_machines})")
    args.num_processes = num_processes
    nproc_per_node = num_processes // num_machines
    if num_processes > 1 and comm is None:
        reason = backend.comm_backend_reason() or "it has no collective backend"
        raise UsageError(f"backend {backend.name!r} cannot run {num_processes} processes: {reason}")

    main_ip, port = args.main_process_ip, args.main_process_port
    if port is not None and not 0 <= port <= 65535:
        raise UsageError(f"--main_process_port must be from 0 to 65535, got {port}")
    if num_machines > 1 and not main_ip:
        raise UsageError(f"--num_machines {num_machines} needs --main_process_ip (the address of the machine of rank 0)")

    from accel.launch.config_file import RDZV_BACKENDS

    if args.rdzv_backend not in RDZV_BACKENDS:
        raise UsageError(f"--rdzv_backend must be one of {', '.join(RDZV_BACKENDS)}, got {args.rdzv_backend!r}")
    if args.max_restarts < 0:
        raise UsageError(f"--max_restarts must be 0 or more, got {args.max_restarts}")
    if not args.monitor_interval > 0:
        raise UsageError(f"--monitor_interval must be above 0 seconds, got {args.monitor_interval}")
    hang_timeout = _hang_timeout(getattr(args, "hang_timeout", None))
    threads = args.num_cpu_threads_per_process
    if threads is not None and threads < 1:
        raise UsageError(f"--num_cpu_threads_per_process must be at least 1, got {threads}")
    if args.use_deepspeed:
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise UsageError("--use_deepspeed needs DeepSpeed: pip install deepspeed")
        args.deepspeed_fields_from_accelerate_config = ",".join(
            [*(getattr(defaults, "deepspeed_config", None) or {}), *(["mixed_precision"] if mp_from_config else [])])
    if args.mixed_precision == "fp8" and args.use_deepspeed is False and args.fp8_backend is None:
        warnings.append("mixed precision fp8 without --fp8_backend: the library picks one that is installed")
    if "main_training_function" in _given(args):
        warnings.append("--main_training_function applies to TPU launches only; the script runs as __main__")
    warnings += _precision_warnings(backend, args.mixed_precision)

    # ---- environment of the ranks: Accelerate's variables, then accel's own
    try:
        env = launch_env(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    env["ACCEL_USE_CPU"] = "true" if backend.is_host else "false"
    env["ACCELERATE_USE_CPU"] = str(backend.is_host)
    if _backend_was_chosen(args):
        env["ACCEL_DEVICE"] = backend.name
    if threads is None:
        env.pop("OMP_NUM_THREADS", None)
        if not os.environ.get("OMP_NUM_THREADS"):
            env["OMP_NUM_THREADS"] = str(max(_usable_cores() // nproc_per_node, 1))
    visible_vars = _visible_devices_variables()
    for name in [n for n in env if n.endswith("_VISIBLE_DEVICES") or n in visible_vars]:
        del env[name]  # set below from the chosen backend, not the detected one
    if specific_ids:
        if backend.visible_devices_env:
            env[backend.visible_devices_env] = ",".join(specific_ids)
            if len(specific_ids) < nproc_per_node:
                warnings.append(f"--gpu_ids {gpu_ids} lists {len(specific_ids)} device(s) for {nproc_per_node} processes per machine: ranks will share devices")
        else:
            warnings.append(f"--gpu_ids {gpu_ids} is ignored: backend {backend.name!r} has no visible-devices variable")
    if backend.is_host:  # Intel OpenMP pinning, as Accelerate's CPU launch sets it; a user's own setting wins
        for name, value in (("KMP_AFFINITY", "granularity=fine,compact,1,0"), ("KMP_BLOCKTIME", "1")):
            if name not in os.environ:
                env[name] = value
    for item in args.env or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env expects NAME=VALUE, got {item!r}")
        env[name] = value

    # ---- rendezvous
    if num_machines == 1:
        host = main_ip or "127.0.0.1"
        if not port:
            port = free_port_on(host)
        elif port_in_use(host, port):
            raise UsageError(f"port {port} on {host} is in use; choose another --main_process_port, or leave it out to get a free one")
        if comm == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and is_loopback(host):
            iface = loopback_interface()
            if iface:
                env["GLOO_SOCKET_IFNAME"] = iface
    else:
        host = main_ip
        port = port or DEFAULT_PORT

    targs = [
        "--nnodes", str(num_machines),
        "--nproc-per-node", str(nproc_per_node),
        "--node-rank", str(machine_rank),
        "--rdzv-backend", args.rdzv_backend,
        "--max-restarts", str(args.max_restarts),
        "--monitor-interval", str(args.monitor_interval),
        "--role", str(args.role),
    ]
    if str(args.tee) not in ("0", ""):
        targs += ["--tee", str(args.tee)]
    if args.rdzv_backend == "static" and (num_machines == 1 or args.same_network):
        targs += ["--master-addr", host, "--master-port", str(port)]
    else:
        targs += ["--rdzv-endpoint", f"{host}:{port}"]
        if num_machines == 1:
            import uuid

            targs += ["--rdzv-id", uuid.uuid4().hex]
    if args.rdzv_conf:
        targs += ["--rdzv-conf", args.rdzv_conf]
    if no_python:
        targs += ["--no-python", target]
    else:
        # every rank runs this module's bootstrap, which runs the target and records its errors
        targs += ["--module", BOOTSTRAP_MODULE] + (["--module"] if module else []) + [target]
    targs += list(args.training_script_args)

    command = _other_launcher(args, env, host, port)
    if num_machines > 1 and machine_rank == 0 and args.rdzv_backend == "static" and command is None \
            and port_taken_on_any_address(port):  # node 0's launcher serves the rendezvous store on it
        raise UsageError(f"port {port} is in use on this host (node 0 serves the rendezvous store on it); "
                         "choose another --main_process_port on every node")
    return LaunchPlan(
        backend=backend.name,
        comm_backend=comm,
        num_machines=num_machines,
        machine_rank=machine_rank,
        nproc_per_node=nproc_per_node,
        mixed_precision=args.mixed_precision,
        debug=bool(args.debug) or _env_debug(),
        endpoint=f"{host}:{port}",
        torchrun_args=targs,
        env=env,
        warnings=warnings,
        command=command,
        log_dir=args.log_dir,
        quiet=bool(args.quiet),
        hang_timeout=hang_timeout,
        rdzv_backend=args.rdzv_backend,
    )


def _hang_timeout(value: Any) -> float:
    """--hang_timeout, else $ACCEL_HANG_TIMEOUT, else the default; a negative or unreadable value is a usage error."""
    where = "--hang_timeout"
    if value is None:
        text = os.environ.get(HANG_TIMEOUT_ENV, "").strip()
        if not text:
            return DEFAULT_HANG_TIMEOUT
        where = HANG_TIMEOUT_ENV
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{HANG_TIMEOUT_ENV} must be a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise UsageError(f"{where} must be 0 (never) or more seconds, got {value}")
    return float(value)


def _other_launcher(args: argparse.Namespace, env: dict[str, str], host: str, port: int) -> list[str] | None:
    """mpirun (``--mpirun_hostfile``) or DeepSpeed's multi-node runner, as Accelerate picks them; else None."""
    from accel.utils import launch as launch_utils

    if args.mpirun_hostfile is not None:
        probe = copy.copy(args)
        try:
            cmd, _ = launch_utils.prepare_simple_launcher_cmd_env(probe)
        except OSError as exc:
            raise UsageError(f"--mpirun_hostfile: {exc}") from None
        env.setdefault("MASTER_ADDR", host)
        env.setdefault("MASTER_PORT", str(port))
        return cmd
    if args.use_deepspeed and args.num_machines > 1 and (args.deepspeed_multinode_launcher or "pdsh") != "standard":
        if args.deepspeed_multinode_launcher not in (None, *launch_utils.DEEPSPEED_MULTINODE_LAUNCHERS):
            raise UsageError(f"--deepspeed_multinode_launcher must be one of {', '.join(launch_utils.DEEPSPEED_MULTINODE_LAUNCHERS)}, "
                             f"got {args.deepspeed_multinode_launcher!r}")
        probe = copy.copy(args)
        probe.main_process_port = port
        cmd, ds_env = launch_utils.prepare_deepspeed_cmd_env(probe)
        env["PYTHONPATH"] = ds_env["PYTHONPATH"]
        return cmd
    return None


def _env_debug() -> bool:
    """Debug mode already asked for in the environment (accel's variable first, then Accelerate's)."""
    try:
        return env_flag("ACCEL_DEBUG_MODE", "ACCELERATE_DEBUG_MODE")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _config_path_text() -> str:
    from accel.launch.config_file import default_config_path

    return str(default_config_path())


def _backend_was_chosen(args: argparse.Namespace) -> bool:
    return getattr(args, "backend_source", "detection") != "detection" or bool(
        args.cpu or args.backend or getattr(args, "use_cpu", False) or args.distributed_type_from_config == "MULTI_CPU")


def _resolve_backend(args: argparse.Namespace, where: str, notes: list[str] | None = None) -> Any:
    """The hardware backend by the one precedence rule (:mod:`accel.launch.precedence`): --cpu/--backend,
    else ``ACCEL_DEVICE``, else the config's use_cpu/backend, else detection. When the environment and
    the config file disagree, ``notes`` gets a line saying which was used and why."""
    from accel.backends import OVERRIDE_ENV, BackendUnavailableError, UnknownBackendError, get_backend
    from accel.launch.precedence import choose

    given = _given(args)
    cli_name = args.backend.strip().lower() if args.backend and "backend" in given else None
    config_name = args.backend.strip().lower() if args.backend and "backend" not in given else None
    if args.cpu and cli_name not in (None, "cpu"):
        raise UsageError(f"--cpu contradicts --backend {args.backend}")
    use_cpu = bool(getattr(args, "use_cpu", False))
    if use_cpu and config_name not in (None, "cpu"):
        raise UsageError(f"use_cpu: true contradicts backend: {config_name}{where}")
    if use_cpu or args.distributed_type_from_config == "MULTI_CPU":
        config_name = config_name or "cpu"
    env_name = (os.environ.get(OVERRIDE_ENV) or "").strip().lower() or None
    choice = choose("backend", flag="cpu" if args.cpu else cli_name, environment=(OVERRIDE_ENV, env_name),
                    config=(where.strip(" ()").removeprefix("config file ") or "in use", config_name))
    if choice.note and notes is not None:
        notes.append(choice.describe("backend"))
    args.backend_source = choice.source
    try:
        backend = get_backend(choice.value)
    except (UnknownBackendError, BackendUnavailableError) as exc:
        raise UsageError(f"{exc} (the backend came from {choice.origin})" if choice.source != "detection" else str(exc)) from None
    if args.multi_gpu and backend.is_host and "multi_gpu" in given:
        raise UsageError("--multi_gpu asks for a device backend, but the selected backend is cpu (see `accel env`)")
    return backend


def _visible_devices_variables() -> set[str]:
    """Every registered backend's visible-devices variable (one table: the backends themselves)."""
    from accel.backends import get_registry

    return {b.visible_devices_env for b in get_registry().probe_order() if getattr(b, "visible_devices_env", None)}


def _comm_backend(backend: Any) -> str | None:
    try:
        return backend.comm_backend
    except Exception as exc:  # e.g. ACCEL_CPU_COMM_BACKEND names a backend that is not installed
        raise UsageError(f"backend {backend.name!r}: {exc}") from None


def _gpu_ids(text: Any) -> str | None:
    from accel.launch.config_file import FIELDS

    try:
        return FIELDS["gpu_ids"](text)
    except ValueError as exc:
        raise UsageError(f"--gpu_ids: {exc}") from None


def _check_target(args: argparse.Namespace) -> tuple[str, bool, bool]:
    target: str = args.training_script
    module, no_python = bool(args.module), bool(args.no_python)
    if module and no_python:
        raise UsageError("--module and --no_python cannot be used together")
    if module:
        if not target or target.startswith("-"):
            raise UsageError(f"--module needs a module name, got {target!r}")
        return target, False, True
    if no_python:
        if not (os.path.isfile(target) or shutil.which(target)):
            raise UsageError(f"executable not found: {target}")
        return target, True, False
    if os.path.isdir(target):
        raise UsageError(f"training script is a directory, not a file: {target} (use -m to run a package)")
    if not os.path.isfile(target):
        raise UsageError(f"training script not found: {target}")
    return target, False, False


def _precision_warnings(backend: Any, mixed_precision: str) -> list[str]:
    """Warn (not fail) when the backend says it cannot run ``mixed_precision``.

    Only host (cpu) backends are asked here: a device backend's probe runs a kernel on device 0,
    which would leave a device context (memory, and a runtime that cannot fork) in this launcher
    for the whole run; the ranks check on their own devices.
    """
    if mixed_precision == "no" or not backend.is_host:
        return []
    try:
        capability = {
            "fp16": lambda: backend.supports_fp16_amp,
            "bf16": lambda: backend.supports_bf16_amp,
            "fp8": lambda: backend.supports_fp8,
        }[mixed_precision]()
    except Exception as exc:
        return [f"could not check {mixed_precision} support on backend {backend.name!r}: {type(exc).__name__}: {exc}"]
    if capability:
        return []
    return [f"mixed precision {mixed_precision} may not work on backend {backend.name!r}: {capability.reason}"]


def _usable_cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    try:
        return len(affinity(0)) if affinity else (os.cpu_count() or 1)
    except OSError:
        return os.cpu_count() or 1
