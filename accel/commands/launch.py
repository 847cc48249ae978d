"""`accel launch`: start a script in N processes through torch elastic (the launcher behind torchrun).

``accel launch [options] script.py [script args]`` resolves every setting (command-line flag, else
the config file, else a default), checks it all before anything starts (a mistake is one line and
exit status 2), then builds torchrun's argument list and runs ``torch.distributed.run`` in this
process, so the elastic agent's failure report reaches us as a ``ChildFailedError`` rather than a
bare exit status 1. It starts exactly the processes asked for: ``--cpu --num_processes 2`` is two
ranks.

Each rank runs ``python -u -m accel.commands.launch [--module] TARGET ARGS``: a small bootstrap that
runs the script (or module) as ``__main__`` and, when it raises, records the exception in torch
elastic's per-rank error file. When a rank fails, ``accel launch`` prints which rank, its exit code
and the end of its traceback, and exits with that rank's exit code.

Environment given to every rank: ``ACCEL_USE_CPU``, ``ACCEL_MIXED_PRECISION``, ``ACCEL_DEBUG_MODE``,
``ACCEL_DEVICE`` (when the backend was chosen by flag or config), ``OMP_NUM_THREADS`` (unless set:
usable cores divided by local processes), the backend's visible-devices variable for ``--gpu_ids``,
and for single-node CPU runs ``GLOO_SOCKET_IFNAME`` bound to the loopback interface. Single-node
runs meet on 127.0.0.1 at a free port unless ``--main_process_ip/--main_process_port`` say otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

from accel.commands import UsageError
from accel.commands.config import add_flag
from accel.commands.config_file import (
    MIXED_PRECISIONS,
    RDZV_BACKENDS,
    ConfigError,
    LaunchConfig,
    default_config_path,
    load_config,
)

__all__ = ["LaunchPlan", "add_arguments", "add_launch_options", "build_plan", "execute", "loopback_interface", "run"]

DEFAULT_PORT = 29500
#: distributed types of an Accelerate config that need a launcher accel does not have
UNSUPPORTED_DISTRIBUTED_TYPES = ("DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM")
#: traceback lines shown for the failing rank
TRACEBACK_LINES = 15
_THIS_FILE = os.path.abspath(__file__)
_RUNPY_FILE = os.path.join(os.path.dirname(os.__file__), "runpy.py")


# ---------------------------------------------------------------------------- arguments
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start a script in several processes (torch elastic underneath). Flags override the config file, "
        "which overrides the defaults. Options may be spelled --num_processes or --num-processes."
    )
    add_launch_options(parser)
    parser.add_argument("training_script", metavar="TRAINING_SCRIPT",
                        help="the script (or module with -m) to run, followed by its own arguments")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, metavar="...",
                        help="arguments for the script, passed through unchanged")


def add_launch_options(parser: argparse.ArgumentParser) -> None:
    """Every launch flag (no script): shared with `accel test`, which launches its own script."""
    add_flag(parser, "--config_file", metavar="PATH", default=None,
             help="config file to read (default: $ACCEL_CONFIG_FILE, else ~/.cache/accel/default_config.yaml, if it exists)")
    add_flag(parser, "--module", "-m", action="store_true", default=None,
             help="run TRAINING_SCRIPT as a module, like `python -m`")
    add_flag(parser, "--no_python", action="store_true", default=None,
             help="run TRAINING_SCRIPT as an executable, without `python` in front")
    add_flag(parser, "--debug", action="store_true", default=None,
             help="set ACCEL_DEBUG_MODE in the ranks and print torch elastic's full failure report")

    hw = parser.add_argument_group("hardware")
    add_flag(hw, "--cpu", action="store_true", default=None, help="run on the CPU even if a device backend is available")
    add_flag(hw, "--backend", metavar="NAME", default=None,
             help="hardware backend for the ranks (cpu, cuda, xpu, mps, hpu or a plug-in); sets ACCEL_DEVICE")
    add_flag(hw, "--multi_gpu", action="store_true", default=None,
             help="Accelerate's flag: one process per device of the detected device backend")
    add_flag(hw, "--gpu_ids", metavar="IDS", default=None,
             help="devices to use, e.g. 0,1 (sets CUDA_VISIBLE_DEVICES, ZE_AFFINITY_MASK, ... for the backend)")
    add_flag(hw, "--mixed_precision", choices=MIXED_PRECISIONS, default=None, help="sets ACCEL_MIXED_PRECISION")
    add_flag(hw, "--num_processes", type=int, metavar="N", default=None,
             help="total number of processes over all machines (default: one per device; 1 on cpu)")
    add_flag(hw, "--num_cpu_threads_per_process", type=int, metavar="N", default=None,
             help="OMP_NUM_THREADS for each rank (default: usable cores / local processes)")

    dist = parser.add_argument_group("machines and rendezvous")
    add_flag(dist, "--num_machines", type=int, metavar="N", default=None, help="number of machines (nodes)")
    add_flag(dist, "--machine_rank", type=int, metavar="RANK", default=None, help="rank of this machine, from 0")
    add_flag(dist, "--main_process_ip", metavar="HOST", default=None, help="address of the machine of rank 0")
    add_flag(dist, "--main_process_port", type=int, metavar="PORT", default=None,
             help="port on the machine of rank 0 (single node default: a free port; 0: pick a free one)")
    add_flag(dist, "--rdzv_backend", choices=RDZV_BACKENDS, default=None, help="torch elastic rendezvous backend (default static)")
    add_flag(dist, "--rdzv_conf", metavar="K=V,...", default=None, help="extra rendezvous settings, passed to torch elastic")
    add_flag(dist, "--same_network", action="store_true", default=None,
             help="multi-node: all machines share a network (static rendezvous at the main process)")
    add_flag(dist, "--max_restarts", type=int, metavar="N", default=None, help="restarts of the whole group before failing (default 0)")
    add_flag(dist, "--monitor_interval", type=float, metavar="SECONDS", default=None,
             help="how often the agent checks the ranks (default 0.1)")
    add_flag(dist, "--main_training_function", metavar="NAME", default=None, help=argparse.SUPPRESS)


# ---------------------------------------------------------------------------- the plan
@dataclass
class LaunchPlan:
    """Everything decided before starting: torchrun's arguments and the environment for the ranks."""

    backend: str
    comm_backend: str | None
    num_machines: int
    machine_rank: int
    nproc_per_node: int
    mixed_precision: str
    debug: bool
    endpoint: str
    torchrun_args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def num_processes(self) -> int:
        return self.nproc_per_node * self.num_machines


def run(args: argparse.Namespace) -> int:
    plan = build_plan(args)
    for warning in plan.warnings:
        print(f"accel launch: warning: {warning}", file=sys.stderr)
    return execute(plan)


def _config_for(args: argparse.Namespace) -> LaunchConfig:
    if args.config_file:
        path = os.path.expanduser(args.config_file)
        if not os.path.isfile(path):
            raise UsageError(f"config file not found: {args.config_file}")
    else:
        path = str(default_config_path())
        if not os.path.isfile(path):
            return LaunchConfig()
    try:
        return load_config(path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _pick(cli: Any, config: LaunchConfig, key: str) -> Any:
    return cli if cli is not None else getattr(config, key)


def build_plan(args: argparse.Namespace) -> LaunchPlan:
    """Resolve flags > config file > defaults and check everything; UsageError on any mistake."""
    target, no_python, module = _check_target(args)  # first: the cheapest check and the commonest slip
    config = _config_for(args)
    warnings: list[str] = []
    where = f" (config file {config.path})" if config.path else ""

    if config.distributed_type in UNSUPPORTED_DISTRIBUTED_TYPES:
        raise UsageError(f"distributed_type {config.distributed_type}{where} is not supported by accel launch")
    used = sorted(k for k, v in config.ignored.items() if v not in (None, False, "", [], {}))
    if used:
        warnings.append(f"ignoring config keys accel does not use{where}: {', '.join(used)}")

    backend = _resolve_backend(args, config, where)
    comm = _comm_backend(backend)

    num_machines = _pick(args.num_machines, config, "num_machines")
    machine_rank = _pick(args.machine_rank, config, "machine_rank")
    if num_machines < 1:
        raise UsageError(f"--num_machines must be at least 1, got {num_machines}")
    if not 0 <= machine_rank < num_machines:
        raise UsageError(f"--machine_rank must be from 0 to num_machines - 1 ({num_machines - 1}), got {machine_rank}")

    gpu_ids = _gpu_ids(args.gpu_ids) if args.gpu_ids is not None else config.gpu_ids
    specific_ids = gpu_ids.split(",") if gpu_ids not in (None, "all") else None

    num_processes = _pick(args.num_processes, config, "num_processes")
    if num_processes is None:
        if specific_ids:
            per_machine = len(specific_ids)
        elif comm is not None and backend.device_type != "cpu":
            per_machine = max(backend.device_count(), 1)
        else:
            per_machine = 1
        num_processes = per_machine * num_machines
    if num_processes < 1:
        raise UsageError(f"--num_processes must be at least 1, got {num_processes}")
    if num_processes % num_machines:
        raise UsageError(f"--num_processes ({num_processes}) is the total over all machines and must be a multiple of --num_machines ({num_machines})")
    nproc_per_node = num_processes // num_machines
    if num_processes > 1 and comm is None:
        reason = backend.comm_backend_reason() or "it has no collective backend"
        raise UsageError(f"backend {backend.name!r} cannot run {num_processes} processes: {reason}")

    main_ip = _pick(args.main_process_ip, config, "main_process_ip")
    port = _pick(args.main_process_port, config, "main_process_port")
    if port is not None and not 0 <= port <= 65535:
        raise UsageError(f"--main_process_port must be from 0 to 65535, got {port}")
    if num_machines > 1 and not main_ip:
        raise UsageError(f"--num_machines {num_machines} needs --main_process_ip (the address of the machine of rank 0)")

    mixed_precision = _pick(args.mixed_precision, config, "mixed_precision")
    debug = bool(_pick(args.debug, config, "debug"))
    rdzv_backend = _pick(args.rdzv_backend, config, "rdzv_backend")
    same_network = bool(_pick(args.same_network, config, "same_network"))
    max_restarts = 0 if args.max_restarts is None else args.max_restarts
    monitor_interval = 0.1 if args.monitor_interval is None else args.monitor_interval
    if max_restarts < 0:
        raise UsageError(f"--max_restarts must be 0 or more, got {max_restarts}")
    if not monitor_interval > 0:
        raise UsageError(f"--monitor_interval must be above 0 seconds, got {monitor_interval}")
    threads = args.num_cpu_threads_per_process
    if threads is not None and threads < 1:
        raise UsageError(f"--num_cpu_threads_per_process must be at least 1, got {threads}")

    warnings += _precision_warnings(backend, mixed_precision)

    # ---- environment of the ranks
    env = {
        "ACCEL_USE_CPU": "true" if backend.name == "cpu" else "false",
        "ACCEL_MIXED_PRECISION": mixed_precision,
        "ACCEL_DEBUG_MODE": "true" if debug else "false",
    }
    if _backend_was_chosen(args, config):
        env["ACCEL_DEVICE"] = backend.name
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    elif not os.environ.get("OMP_NUM_THREADS"):
        env["OMP_NUM_THREADS"] = str(max(_usable_cores() // nproc_per_node, 1))
    if specific_ids:
        if backend.visible_devices_env:
            env[backend.visible_devices_env] = ",".join(specific_ids)
            if len(specific_ids) < nproc_per_node:
                warnings.append(f"--gpu_ids {gpu_ids} lists {len(specific_ids)} device(s) for {nproc_per_node} processes per machine: ranks will share devices")
        else:
            warnings.append(f"--gpu_ids {gpu_ids} is ignored: backend {backend.name!r} has no visible-devices variable")

    # ---- rendezvous
    if num_machines == 1:
        host = main_ip or "127.0.0.1"
        if not port:
            port = _free_port(host)
        elif _port_in_use(host, port):
            raise UsageError(f"port {port} on {host} is in use; choose another --main_process_port, or leave it out to get a free one")
        if comm == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and _is_loopback(host):
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
        "--rdzv-backend", rdzv_backend,
        "--max-restarts", str(max_restarts),
        "--monitor-interval", str(monitor_interval),
    ]
    if rdzv_backend == "static" and (num_machines == 1 or same_network):
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
        targs += ["--module", "accel.commands.launch"] + (["--module"] if module else []) + [target]
    targs += list(args.training_script_args)

    return LaunchPlan(
        backend=backend.name,
        comm_backend=comm,
        num_machines=num_machines,
        machine_rank=machine_rank,
        nproc_per_node=nproc_per_node,
        mixed_precision=mixed_precision,
        debug=debug,
        endpoint=f"{host}:{port}",
        torchrun_args=targs,
        env=env,
        warnings=warnings,
    )


def _backend_was_chosen(args: argparse.Namespace, config: LaunchConfig) -> bool:
    return bool(args.cpu or args.backend or config.use_cpu or config.backend or config.distributed_type == "MULTI_CPU")


def _resolve_backend(args: argparse.Namespace, config: LaunchConfig, where: str) -> Any:
    """The hardware backend: --cpu/--backend, else the config's use_cpu/backend, else detection."""
    from accel.backends import BackendUnavailableError, UnknownBackendError, get_backend

    cli_name = args.backend.strip().lower() if args.backend else None
    if args.cpu and cli_name not in (None, "cpu"):
        raise UsageError(f"--cpu contradicts --backend {args.backend}")
    if args.cpu or cli_name:
        name = cli_name or "cpu"
    else:
        if config.use_cpu and config.backend not in (None, "cpu"):
            raise UsageError(f"use_cpu: true contradicts backend: {config.backend}{where}")
        if config.use_cpu or config.distributed_type == "MULTI_CPU":
            name = config.backend or "cpu"
        else:
            name = config.backend
    try:
        backend = get_backend(name)
    except (UnknownBackendError, BackendUnavailableError) as exc:
        raise UsageError(str(exc)) from None
    if args.multi_gpu and backend.device_type == "cpu":
        raise UsageError("--multi_gpu asks for a device backend, but the selected backend is cpu (see `accel env`)")
    return backend


def _comm_backend(backend: Any) -> str | None:
    try:
        return backend.comm_backend
    except Exception as exc:  # e.g. ACCEL_CPU_COMM_BACKEND names a backend that is not installed
        raise UsageError(f"backend {backend.name!r}: {exc}") from None


def _gpu_ids(text: str) -> str:
    from accel.commands.config_file import FIELDS

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
    if mixed_precision == "no" or backend.device_type != "cpu":
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


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError:
            sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def _is_loopback(host: str) -> bool:
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def loopback_interface() -> str | None:
    """Name of the network interface that carries 127.0.0.1 (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        import psutil

        for name, addresses in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and str(a.address).startswith("127.") for a in addresses):
                return name
    except Exception:
        return None
    return None


# ---------------------------------------------------------------------------- running
@contextlib.contextmanager
def patched_environ(updates: dict[str, str]) -> Iterator[None]:
    """Set ``updates`` in ``os.environ`` for the block, then restore what was there."""
    saved = {name: os.environ.get(name) for name in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _DropElasticFailureLine:
    """Logging filter for the agent's one-line failure log, which our own summary replaces."""

    def filter(self, record: Any) -> bool:
        return not str(record.msg).startswith("failed (exitcode")


def execute(plan: LaunchPlan) -> int:
    """Run the plan through ``torch.distributed.run``; return 0 or the failing rank's exit code."""
    import logging
    import tempfile

    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if plan.debug:
        print(
            f"accel launch: {plan.num_processes} process(es) ({plan.nproc_per_node} per machine x {plan.num_machines}) "
            f"on backend {plan.backend} ({plan.comm_backend or 'no collectives'}), mixed precision {plan.mixed_precision}, "
            f"rendezvous at {plan.endpoint}\naccel launch: torchrun {' '.join(plan.torchrun_args)}",
            file=sys.stderr,
        )
    api_logger = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    quiet = _DropElasticFailureLine()
    if not plan.debug:
        api_logger.addFilter(quiet)
    # a private log folder for torch elastic's per-rank error files, removed afterwards
    with tempfile.TemporaryDirectory(prefix="accel_launch_") as log_dir, patched_environ(plan.env):
        try:
            targs = torchrun.parse_args(["--log-dir", log_dir, *plan.torchrun_args])
            torchrun.run(targs)
        except ChildFailedError as err:
            report, code = failure_report(err, plan.debug)
            print(report, file=sys.stderr)
            return code
        except SignalException as exc:
            print(f"accel launch: stopped by signal {exc.sigval.name}; the ranks were terminated", file=sys.stderr)
            return 128 + int(exc.sigval)
        except Exception as exc:
            print(f"accel launch: the launch failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        finally:
            api_logger.removeFilter(quiet)
    return 0


def _exit_code(exitcode: int) -> int:
    if exitcode > 0:
        return exitcode
    if exitcode < 0:
        return 128 + (-exitcode)  # killed by a signal: the shell's convention
    return 1


def _root_failure(failures: dict[int, Any]) -> tuple[int, Any]:
    """The rank that failed first. Ranks the agent killed afterwards (negative exit codes) come
    last; among the rest, the earliest recorded failure in the agent's order."""
    order = list(failures)
    return min(failures.items(), key=lambda item: (item[1].exitcode <= 0, item[1].timestamp, order.index(item[0])))


def _error_details(failure: Any) -> tuple[str | None, str | None]:
    """(one-line message, traceback) from the rank's error file, when it wrote one."""
    data = getattr(failure, "error_file_data", None) or {}
    message = data.get("message")
    if isinstance(message, dict):
        extra = message.get("extraInfo") or {}
        return message.get("message"), extra.get("py_callstack")
    if isinstance(message, str) and message and message != "<NONE>":  # torch's "no error file" marker
        return message, None
    return None, None


def _is_bootstrap_frame(line: str) -> bool:
    text = line.strip()
    return text.startswith("File ") and (
        f'"{_THIS_FILE}"' in text or '"<frozen runpy>"' in text or f'"{_RUNPY_FILE}"' in text
    )


def clean_traceback(callstack: str) -> list[str]:
    """The lines of a formatted traceback without the bootstrap's and runpy's frames."""
    out: list[str] = []
    lines = callstack.rstrip().splitlines()
    i = 0
    while i < len(lines):
        if _is_bootstrap_frame(lines[i]):
            indent = len(lines[i]) - len(lines[i].lstrip())
            i += 1
            while i < len(lines) and len(lines[i]) - len(lines[i].lstrip()) > indent:  # its source lines
                i += 1
            continue
        out.append(lines[i])
        i += 1
    return out


def failure_report(err: Any, debug: bool = False) -> tuple[str, int]:
    """A short summary of a ChildFailedError: the failing rank, its exit code and the end of its
    traceback; returns (text, exit code for `accel launch`)."""
    failures: dict[int, Any] = dict(err.failures)
    if not failures:
        return f"accel launch: {err}", 1
    rank, root = _root_failure(failures)
    exitcode = root.exitcode
    how = f"exit code {exitcode}"
    if exitcode < 0:
        how = f"signal {-exitcode} ({root.signal_name()})"
    lines = [f"accel launch: rank {rank} (local rank {root.local_rank}, pid {root.pid}) failed with {how}"]
    message, callstack = _error_details(root)
    if callstack:
        tail = clean_traceback(callstack)[-TRACEBACK_LINES:]
        lines.append(f"accel launch: end of rank {rank}'s traceback:")
        lines += [f"  {line}" for line in tail]
    elif message:
        lines.append(f"accel launch: rank {rank}: {message}")
    else:
        lines.append(f"accel launch: rank {rank} recorded no traceback (it exited without raising, or was killed); its own output is above")
    others = [f"rank {r} ({'signal ' + f.signal_name() if f.exitcode < 0 else 'exit code ' + str(f.exitcode)})"
              for r, f in failures.items() if r != rank]
    if others:
        lines.append(f"accel launch: also stopped: {', '.join(others)}")
    if debug:
        lines.append(err.format_msg() if hasattr(err, "format_msg") else str(err))
    return "\n".join(lines), _exit_code(exitcode)


# ---------------------------------------------------------------------------- rank bootstrap
def _trim(tb: Any) -> Any:
    """Drop the bootstrap's and runpy's frames from the front of a traceback."""
    def bootstrap(filename: str) -> bool:
        return filename == "<frozen runpy>" or os.path.abspath(filename) in (_THIS_FILE, _RUNPY_FILE)

    while tb is not None and bootstrap(tb.tb_frame.f_code.co_filename) and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _record_error(exc: BaseException) -> None:
    """Write ``exc`` to torch elastic's error file for this rank (TORCHELASTIC_ERROR_FILE)."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    try:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(exc)
    except Exception as record_exc:  # the report must not hide the real error
        print(f"accel launch: could not record the error: {record_exc}", file=sys.stderr)


def worker_main(argv: list[str]) -> None:
    """Run ``[--module] TARGET ARGS...`` as ``__main__`` the way python would, recording failures."""
    import runpy
    import traceback

    module = bool(argv) and argv[0] == "--module"
    if module:
        argv = argv[1:]
    if not argv:
        sys.exit("accel.commands.launch: nothing to run (this module is the bootstrap of `accel launch`)")
    target, rest = argv[0], argv[1:]
    sys.argv = [target, *rest]
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python script.py` does
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        _finish(_exit_status(exc.code))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        _record_error(exc)
        traceback.print_exception(type(exc), exc, _trim(exc.__traceback__))
        _finish(1)
    _finish(0)


def _exit_status(code: Any) -> int:
    """``sys.exit``'s argument as a process status, as the interpreter would turn it into one."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _finish(status: int) -> None:
    """End the rank: close the process group, run the script's atexit handlers, flush, and leave
    without the interpreter's C++ teardown. With torch 2.13, gloo's threads can still be joinable
    when static destructors run, which aborts a rank that already succeeded ("terminate called
    without an active exception", SIGABRT) and fails the whole launch."""
    import atexit

    _close_process_group()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(status)


def _close_process_group() -> None:
    """Destroy a process group the script left open.

    A process that exits with a live gloo group can abort in torch's C++ teardown ("terminate called
    without an active exception", SIGABRT) long after the script succeeded; scripts written for
    Accelerate rarely destroy their group. Only looked at when the script imported torch.distributed.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_available() and dist.is_initialized():
            import gc

            # objects such as a DDP reducer keep the C++ group alive past destroy_process_group;
            # free them first so the group's threads are joined now, not in interpreter teardown
            gc.collect()
            dist.destroy_process_group()
    except Exception as exc:
        print(f"accel launch: could not destroy the process group at exit: {type(exc).__name__}: {exc}", file=sys.stderr)

if __name__ == "__main__":
    worker_main(sys.argv[1:])
