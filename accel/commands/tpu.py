"""`accel tpu-config`: run set-up commands on every worker of a Cloud TPU pod through ``gcloud``.

It builds ``gcloud [alpha] compute tpus tpu-vm ssh NAME --zone ZONE --command "cd /usr/share; ..."
--worker all`` from the flags, else the config file's ``tpu_name``, ``tpu_zone``, ``commands`` and
``command_file``, and runs it; ``--debug`` prints the command instead. Without gcloud installed it
says so (exit status 2) instead of failing on a missing program. accel itself does not train on TPUs
(``accel launch --tpu`` is refused); this only prepares the pod, as ``accelerate tpu-config`` does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from typing import Any

__all__ = ["add_arguments", "run", "tpu_command_launcher", "tpu_command_parser"]

_DESCRIPTION = "Run commands on every worker of a Cloud TPU pod through gcloud (set-up before training)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`accel tpu-config`'s options (Accelerate's)."""
    parser.description = _DESCRIPTION
    config = parser.add_argument_group("Config Arguments", "Arguments that can be set in the config file.")
    config.add_argument("--config_file", type=str, default=None, help="config file with tpu_name, tpu_zone, commands, command_file")
    config.add_argument("--tpu_name", default=None, help="the TPU's name (default: the config file's tpu_name)")
    config.add_argument("--tpu_zone", default=None, help="the TPU's zone (default: the config file's tpu_zone)")
    pod = parser.add_argument_group("TPU Arguments", "What runs on the pod.")
    pod.add_argument("--use_alpha", action="store_true", help="use `gcloud alpha`")
    pod.add_argument("--command_file", default=None, help="file with the commands to run, one a line")
    pod.add_argument("--command", action="append", nargs="+", help="a command to run on every worker (repeatable)")
    pod.add_argument("--install_accelerate", action="store_true", help="pip install accelerate on the workers first")
    pod.add_argument("--accelerate_version", default="latest",
                     help="accelerate version to install: latest, dev (from GitHub) or a version number")
    pod.add_argument("--debug", action="store_true", help="print the gcloud command instead of running it")


def tpu_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's entry point: the `tpu-config` parser (added to ``subparsers`` when given)."""
    if subparsers is not None:
        parser = subparsers.add_parser("tpu-config", description=_DESCRIPTION)
    else:
        parser = argparse.ArgumentParser("accel tpu-config", description=_DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(func=tpu_command_launcher)
    return parser


def _install_spec(version: str) -> str:
    from packaging.version import InvalidVersion, Version

    if version == "dev":
        return "git+https://github.com/huggingface/accelerate.git"
    if version == "latest":
        return "accelerate -U"
    try:
        Version(version)
    except InvalidVersion:
        raise ValueError(f"--accelerate_version must be latest, dev or a version number, got {version!r}") from None
    return f"accelerate=={version}"


def build_gcloud_command(args: argparse.Namespace) -> list[str]:
    """The gcloud command for ``args`` (flags first, then the config file); ValueError when something is missing."""
    from accel.commands.config.config_args import load_config_from_file
    from accel.launch.config_file import CONFIG_ENV, default_config_path

    # a missing file named by --config_file or $ACCEL_CONFIG_FILE is an error (FileNotFoundError naming it)
    if args.config_file is not None or default_config_path().is_file() or os.environ.get(CONFIG_ENV):
        defaults = load_config_from_file(args.config_file)
        if not args.command_file and getattr(defaults, "command_file", None) and not args.command:
            args.command_file = defaults.command_file
        if not args.command and getattr(defaults, "commands", None):
            args.command = list(defaults.commands)
        args.tpu_name = args.tpu_name or getattr(defaults, "tpu_name", None)
        args.tpu_zone = args.tpu_zone or getattr(defaults, "tpu_zone", None)
    if not args.command_file and not args.command:
        raise ValueError("You must specify either a command file or a command to run on the pod.")
    for name in ("tpu_name", "tpu_zone"):
        if not getattr(args, name):
            raise ValueError(f"--{name} is needed (or {name} in the config file)")
    if args.command_file:
        if not os.path.isfile(args.command_file):
            raise FileNotFoundError(f"command file not found: {args.command_file}")
        with open(args.command_file, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    else:
        lines = [part for cmd in args.command for part in (cmd if isinstance(cmd, list) else [cmd])]
    steps = ["cd /usr/share"]
    if args.install_accelerate:
        steps.append(f"pip install {_install_spec(args.accelerate_version)}")
    steps += lines
    cmd = ["gcloud"] + (["alpha"] if args.use_alpha else [])
    return cmd + ["compute", "tpus", "tpu-vm", "ssh", args.tpu_name, "--zone", args.tpu_zone,
                  "--command", "; ".join(steps), "--worker", "all"]


def tpu_command_launcher(args: argparse.Namespace) -> None:
    """Accelerate's command function: build the command, then print it (``--debug``) or run it."""
    from accel.commands import UsageError

    cmd = build_gcloud_command(args)
    if args.debug:
        print(f"Running {' '.join(cmd)}")
        return
    if shutil.which("gcloud") is None:
        raise UsageError("gcloud is not installed (Google Cloud SDK: https://cloud.google.com/sdk/docs/install); "
                         f"the command would be: {' '.join(cmd)}")
    completed = subprocess.run(cmd, check=False)
    if completed.returncode:
        raise UsageError(f"gcloud failed with exit code {completed.returncode}")
    print("Successfully setup pod.")


def run(args: argparse.Namespace) -> int:
    """`accel tpu-config` through the `accel` entry point."""
    from accel.commands import UsageError

    try:
        tpu_command_launcher(args)
    except (ValueError, OSError) as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(str(exc)) from None
    return 0
