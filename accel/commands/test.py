"""`accel test`: the quick check after installing — launch a short script and verify what it got.

It takes the same flags as `accel launch` (``accel test --cpu --num_processes 2``), launches
``accel.test_utils.scripts.smoke`` through the same launcher, and first checks that the world size
the launcher started is the one that was asked for (Accelerate's smoke test passes with one process
when two were asked). Then state, process control, RNG sync, data-loader sharding, collectives, a
short training-equivalence run, mixed precision where the backend supports it and a checkpoint round
trip. It prints a table of checks, exits non-zero on any failure, and never hangs: collectives carry
a timeout and a watchdog stops the ranks when ``--timeout`` runs out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

from accel.commands import UsageError

__all__ = ["TEST_LAUNCH_OPTIONS", "add_arguments", "run", "test_command", "test_command_parser"]

SMOKE_MODULE = "accel.test_utils.scripts.smoke"
EXPECTED_ENV = "ACCEL_TEST_EXPECTED_WORLD_SIZE"
_MARK = {"pass": "PASS", "fail": "FAIL", "skip": "skip"}


#: the `accel launch` options `accel test` takes (it launches its own script, so no -m/--no_python, and
#: the smoke checks use neither DeepSpeed, FSDP, compile nor the refused TPU/SageMaker/Megatron-LM options)
TEST_LAUNCH_OPTIONS = (
    "config_file", "debug", "backend", "cpu", "multi_gpu", "gpu_ids", "mixed_precision", "num_processes",
    "num_machines", "machine_rank", "num_cpu_threads_per_process", "main_process_ip", "main_process_port",
    "same_network", "rdzv_backend", "rdzv_conf", "max_restarts", "monitor_interval",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`accel test`'s options: the launch options it uses, ``--timeout`` and ``--json``."""
    from accel.commands.launch import LAUNCH_OPTIONS, add_launch_options, option_dest

    parser.description = (
        "Launch accel's smoke checks with the same flags as `accel launch` (config file, then flags) and "
        "print a table of checks; exit status 1 on any failure."
    )
    every = {option_dest(flags, kw) for _, options in LAUNCH_OPTIONS for flags, kw in options}
    add_launch_options(parser, skip=tuple(sorted(every - set(TEST_LAUNCH_OPTIONS))))
    parser.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                        help="stop the ranks and fail after this long (default 120); collectives time out at a quarter of it")
    parser.add_argument("--json", metavar="FILE", help="also write the per-rank results here")


def test_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's entry point: the `test` parser (added to ``subparsers`` when given)."""
    parser = subparsers.add_parser("test") if subparsers is not None else argparse.ArgumentParser("accel test")
    add_arguments(parser)
    parser.set_defaults(func=test_command)
    return parser


def test_command(args: argparse.Namespace) -> None:
    """Accelerate's command function: run the smoke checks; raises SystemExit(1) when one fails."""
    code = run(args)
    if code:
        raise SystemExit(code)


def _with_launch_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` completed with `accel launch`'s defaults for the options `accel test` does not take."""
    from accel.commands.launch import launch_command_parser

    defaults = launch_command_parser().parse_args(["-m", SMOKE_MODULE])
    for name, value in vars(defaults).items():
        if not hasattr(args, name):
            setattr(args, name, value)
    return args


def run(args: argparse.Namespace) -> int:
    from accel.commands.launch import build_plan, run_plan

    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    args = _with_launch_defaults(args)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="accel_test_") as tmp:
        out = os.path.join(tmp, "results.json")
        args.module, args.no_python = True, False
        args.training_script = SMOKE_MODULE
        args.training_script_args = ["--out", out, "--timeout", f"{max(args.timeout / 4, 5):g}"]
        plan = build_plan(args)
        for warning in plan.warnings:
            print(f"accel test: warning: {warning}", file=sys.stderr)
        plan.env[EXPECTED_ENV] = str(plan.num_processes)
        print(f"accel test: {plan.num_processes} process(es) on backend {plan.backend} "
              f"({plan.comm_backend or 'no collectives'}), mixed precision {plan.mixed_precision}, launched through accel launch",
              flush=True)
        watchdog = _Watchdog(args.timeout)
        watchdog.start()
        try:
            code = run_plan(plan)
        finally:
            watchdog.cancel()
        payload = _read(out)
    elapsed = time.perf_counter() - started
    if watchdog.fired:
        print(f"accel test: FAILED: no result within {args.timeout:g}s; the ranks were stopped "
              "(a collective never completed: check the network interface, e.g. GLOO_SOCKET_IFNAME, and firewalls)",
              file=sys.stderr)
        return 1
    if payload is None:
        print(f"accel test: FAILED: the launch ended with exit code {code} before reporting results", file=sys.stderr)
        return code or 1
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=1)
    failed = _print_table(payload, plan.num_processes, elapsed)
    return 1 if failed or code else 0


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _merge(ranks: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per check: failed if any rank failed (naming the ranks), else the main rank's answer."""
    rows = []
    for i, main in enumerate(ranks[0]):
        row = dict(main)
        failures = [(r, rank[i]) for r, rank in enumerate(ranks) if rank[i]["status"] == "fail"]
        if failures:
            row["status"] = "fail"
            first_rank, first = failures[0]
            where = f"rank {first_rank}" if len(failures) == 1 else f"ranks {[r for r, _ in failures]}"
            row["detail"] = f"{where}: {first['detail']}"
        row["seconds"] = max(rank[i]["seconds"] for rank in ranks)
        rows.append(row)
    return rows


def _print_table(payload: dict[str, Any], asked: int, elapsed: float) -> bool:
    rows = _merge(payload["ranks"])
    width = max(len(r["check"]) for r in rows)
    print(f"backend {payload['backend']}, device {payload['device']}, world size {payload['world_size']} "
          f"(asked {asked}), collectives {payload['collectives'] or 'none'}")
    print(f"  {'check':<{width}}  result  time    detail")
    for row in rows:
        print(f"  {row['check']:<{width}}  {_MARK[row['status']]:<6}  {row['seconds']:5.2f}s  {row['detail']}")
    counts = {s: sum(r["status"] == s for r in rows) for s in _MARK}
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped in {elapsed:.1f}s")
    return counts["fail"] > 0


class _Watchdog:
    """Stops the ranks (this process's children) when the run exceeds its time."""

    def __init__(self, seconds: float):
        self.fired = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()

    def _fire(self) -> None:
        import psutil

        self.fired = True
        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
