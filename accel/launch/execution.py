"""Running a launch plan (:class:`accel.launch.plan.LaunchPlan`): torch elastic's agent in this process,
with the launcher's private folder, the watch on the ranks' processes, the hang watchdog and, on several
nodes, the evidence exchange; or mpirun / DeepSpeed's runner when the plan names a command instead."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any, Iterator

from . import diagnosis, heartbeat
from .bootstrap import LAUNCHER_PID_ENV
from .nodes import NodeExchange, NodeSetupError
from .report import exit_code, failure_report
from .watchdog import HangWatchdog

if TYPE_CHECKING:
    from .plan import LaunchPlan

__all__ = ["execute", "patched_environ"]


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


def _exchange_for(plan: LaunchPlan) -> Any:
    """The channel between the nodes' launchers (several nodes, static rendezvous); else None."""
    if plan.num_machines <= 1 or plan.command is not None or plan.rdzv_backend != "static":
        return None
    host, _, port = plan.endpoint.rpartition(":")
    return NodeExchange(host, int(port), plan.machine_rank, plan.num_machines, nproc_per_node=plan.nproc_per_node)


def execute(plan: LaunchPlan) -> int:
    """Run the plan through ``torch.distributed.run``; return 0 or the failing rank's exit code."""
    import logging

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
    if plan.command is not None:
        return _run_command(plan)
    exchange = _exchange_for(plan)
    api_logger = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    quiet = _DropElasticFailureLine()
    if not plan.debug:
        api_logger.addFilter(quiet)
    # the private folder shared with the ranks (heartbeats, stacks, failure times) and, without --log_dir,
    # torch elastic's per-rank error files; an owner file lets the next launcher remove it if this one is killed
    diagnosis.remove_orphaned_run_dirs()
    run_dir = diagnosis.make_run_dir()
    log_dir = plan.log_dir or os.path.join(run_dir, "logs")
    watch = diagnosis.ChildWatch(run_dir)
    watchdog = HangWatchdog(run_dir, plan.hang_timeout, exchange=exchange, node=plan.machine_rank, nnodes=plan.num_machines)
    try:
        with patched_environ({**plan.env, heartbeat.RUN_DIR_ENV: run_dir, LAUNCHER_PID_ENV: str(os.getpid())}):
            if exchange is not None:
                try:
                    exchange.open()  # node 0 serves the store; the others check that it is node 0's
                except NodeSetupError:
                    raise
                except Exception as exc:  # the store cannot be served or reached: torch elastic will say so itself
                    print(f"accel launch: warning: no evidence exchange between the nodes ({type(exc).__name__}: {exc})", file=sys.stderr)
                    exchange = watchdog.exchange = None
            watch.start()
            watchdog.start()
            try:
                targs = torchrun.parse_args(["--log-dir", log_dir, *plan.torchrun_args])
                torchrun.run(targs)
            except ChildFailedError as err:
                watchdog.stop()
                if watchdog.report is not None:
                    print(watchdog.report, file=sys.stderr)
                    return watchdog.exit_code
                report, code = failure_report(err, plan.debug, run_dir, watch=watch, exchange=exchange,
                                              node=plan.machine_rank, nnodes=plan.num_machines)
                if plan.quiet:
                    report = report.splitlines()[0]
                print(report, file=sys.stderr)
                return code
            except SignalException as exc:
                watchdog.stop()
                if watchdog.report is not None:  # the watchdog stopped the agent (no restart of a hung job)
                    print(watchdog.report, file=sys.stderr)
                    return watchdog.exit_code
                print(f"accel launch: stopped by signal {exc.sigval.name}; the ranks were terminated", file=sys.stderr)
                return 128 + int(exc.sigval)
            except Exception as exc:
                print(f"accel launch: the launch failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                return 1
            finally:
                watchdog.stop()
                watch.stop()
                api_logger.removeFilter(quiet)
            if watchdog.report is not None:  # ended as hung, though every rank's exit looked clean to the agent
                print(watchdog.report, file=sys.stderr)
                return watchdog.exit_code
            return 0
    finally:
        api_logger.removeFilter(quiet)
        if exchange is not None:
            exchange.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def _run_command(plan: LaunchPlan) -> int:
    """Run mpirun or DeepSpeed's multi-node runner with the ranks' environment; its exit code."""
    import subprocess

    if plan.debug:
        print(f"accel launch: {' '.join(plan.command)}", file=sys.stderr)
    try:
        completed = subprocess.run(plan.command, env={**os.environ, **plan.env}, check=False)
    except FileNotFoundError as exc:
        print(f"accel launch: cannot start {plan.command[0]}: {exc}", file=sys.stderr)
        return 1
    if completed.returncode:
        print(f"accel launch: {plan.command[0]} failed with exit code {completed.returncode}", file=sys.stderr)
    return exit_code(completed.returncode) if completed.returncode else 0
