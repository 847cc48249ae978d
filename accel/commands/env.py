"""`accel env`: the facts a bug report or a qualification report needs, printed as text or JSON.

The facts are collected by the library (:func:`accel.sysinfo.collect_environment`, which the results
recorder and the reports use too); the text form is :mod:`accel.commands.env_render`.
"""

from __future__ import annotations

import argparse
import json
import sys
from shutil import which
from typing import Any

from accel.sysinfo import SCHEMA_VERSION, collect_environment, is_error as _is_error, torch_build

from .env_render import render_text

__all__ = ["SCHEMA_VERSION", "add_arguments", "collect_environment", "env_command", "env_command_parser", "render_text", "run",
           "selection_problem", "torch_build", "which"]


# ---------------------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`accel env`'s options."""
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--config_file", "--config-file", dest="config_file", metavar="PATH", default=None,
                        help="config file to report and print (default: $ACCEL_CONFIG_FILE, else ~/.cache/accel/default_config.yaml)")


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 2 (as `accel test` and `accel qualify` do), with the reason as the first line
    on stderr, when the backend a launch here would use is unavailable or unknown (the rest of the report
    still prints: it says why)."""
    env = collect_environment(config_file=getattr(args, "config_file", None))
    problem = selection_problem(env)
    if problem is not None:
        print(f"accel env: error: {problem}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(env, indent=2))
    else:
        print(render_text(env), end="")
    return 0 if problem is None else 2


def selection_problem(env: dict[str, Any]) -> str | None:
    """Why no backend can be selected here (a requested one unavailable or unknown), or None."""
    selected = env.get("selected_backend")
    if _is_error(selected):
        return f"choosing the backend failed: {selected['error']}"
    if isinstance(selected, dict) and selected.get("error"):
        return f"{selected['error']} (from {selected.get('source')})"
    return None


def env_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's entry point: the `env` parser (added to ``subparsers`` when given)."""
    parser = subparsers.add_parser("env") if subparsers is not None else argparse.ArgumentParser("accel env")
    add_arguments(parser)
    parser.set_defaults(func=env_command)
    return parser


def env_command(args: argparse.Namespace) -> dict[str, Any]:
    """Accelerate's command function: print the report and return its main facts as a flat dict
    (``"`accel` bash location"`` is where the `accel` executable is, or ``"Not found"``)."""
    env = collect_environment(include_deepspeed=False, config_file=getattr(args, "config_file", None))
    print(render_text(env), end="")
    torch_info = env.get("torch") or {}
    info = {
        "`accel` version": (env.get("accel") or {}).get("version"),
        "`accel` bash location": which("accel") or "Not found",
        "Platform": (env.get("platform") or {}).get("platform"),
        "Python version": (env.get("python") or {}).get("version"),
        "PyTorch version": torch_info.get("version") if isinstance(torch_info, dict) else None,
        "`accel` config": (env.get("config_file") or {}).get("contents") or "Not found",
    }
    return info
