"""The `accel launch` command: Accelerate's ``launch_command_parser``/``launch_command`` and the CLI's ``run``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from accel.launch.execution import execute
from accel.launch.nodes import NodeSetupError

from .options import HideDashedAliasesFormatter, add_arguments
from .plan import build_plan
from .settings import sagemaker_config


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's entry point: the `launch` parser (added to ``subparsers`` when given); the parsed
    namespace's ``func`` is :func:`launch_command`."""
    if subparsers is not None:
        parser = subparsers.add_parser("launch", help="run a script in several processes", allow_abbrev=False)
    else:
        parser = argparse.ArgumentParser("accel launch", allow_abbrev=False, formatter_class=HideDashedAliasesFormatter)
    add_arguments(parser)
    parser.set_defaults(func=launch_command)
    return parser


def launch_command(args: argparse.Namespace) -> None:
    """Accelerate's entry point: validate ``args`` and run the launch; raises on a usage mistake
    (UsageError, a ValueError) and exits with the failing rank's exit code when a rank fails."""
    code = run(args)
    if code:
        raise SystemExit(code)


def run(args: argparse.Namespace) -> int:
    """`accel launch`: build the plan (all checks) and run it; the exit code.

    A config file for Amazon SageMaker starts a SageMaker training job instead, as Accelerate does.
    """
    sagemaker = sagemaker_config(args)
    if sagemaker is not None:
        return _launch_on_sagemaker(sagemaker, args)
    plan = build_plan(args)
    if not plan.quiet:
        for warning in plan.warnings:
            print(f"accel launch: warning: {warning}", file=sys.stderr)
    return run_plan(plan)


def run_plan(plan: Any) -> int:
    """Carry out ``plan`` (:func:`accel.launch.execution.execute`); the nodes failing to meet as asked is a
    usage error of the command, printed on one line."""
    from accel.commands import UsageError

    try:
        return execute(plan)
    except NodeSetupError as exc:
        raise UsageError(str(exc)) from None


def _launch_on_sagemaker(sagemaker: Any, args: argparse.Namespace) -> int:
    """Start the SageMaker job; a missing SDK or missing AWS credentials is a usage error that says so."""
    from accel.commands import UsageError
    from accel.launch.sagemaker import SageMakerCredentialsError, sagemaker_launcher

    try:
        sagemaker_launcher(sagemaker, args)
    except (ImportError, OSError, SageMakerCredentialsError, ValueError) as exc:
        raise UsageError(f"compute_environment AMAZON_SAGEMAKER: {exc}") from None
    return 0
