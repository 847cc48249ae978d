"""`accel config update`: rewrite an existing config file in today's format, keeping its values.

Old Accelerate keys are upgraded (``fp16: true`` -> ``mixed_precision: fp16``, a top-level
``dynamo_backend`` -> ``dynamo_config``, ``command`` -> ``commands``, YAML's ``NO``/``no`` read as
false -> ``'NO'``/``'no'``); what changed is printed. Unknown keys stay an error naming file and line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_update_arguments", "run_update", "update_command_parser", "update_config", "update_config_command"]


def add_update_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `accel config update`."""
    parser.add_argument("--config_file", "--config-file", dest="config_file", metavar="PATH", default=argparse.SUPPRESS,
                        help="the file to update (default: $ACCEL_CONFIG_FILE, else ~/.cache/accel/default_config.yaml)")


def update_config(args: argparse.Namespace) -> str:
    """Accelerate's function: update ``args.config_file`` (None: the default file) in place; returns its path."""
    from accel.launch.config_file import default_config_path

    path = Path(args.config_file) if getattr(args, "config_file", None) else default_config_path()
    if not path.exists():
        raise ValueError(f"The passed config file located at {path} doesn't exist.")
    _rewrite(path)
    return str(path)


def _rewrite(path: Path) -> list[str]:
    """Load ``path`` (upgrading old keys), write it back; the list of changes made."""
    from accel.launch.config_file import load_config, save_config
    from accel.facts import yaml_safe
    from accel.facts.yaml_safe import preview

    config = load_config(path)  # checks the file (size, aliases) before it is read again below
    before = yaml_safe.read(path) or {}
    save_config(config, path)
    after = yaml_safe.read(path) or {}
    changes = [f"removed {key} (was {preview(before[key], 200)})" for key in before if key not in after]
    changes += [f"{key}: {preview(before[key], 200)} -> {preview(after[key], 200)}" for key in after
                if key in before and before[key] != after[key]]
    changes += [f"added {key}: {preview(after[key], 200)}" for key in after if key not in before]
    return changes


def run_update(path: Path) -> int:
    """`accel config update`: rewrite ``path`` and print what changed."""
    from accel.commands import UsageError
    from accel.launch.config_file import ConfigError

    if not path.is_file():
        raise UsageError(f"no config file at {path} to update (create one with `accel config` or `accel config default`)")
    try:
        changes = _rewrite(path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    for change in changes:
        print(f"  {change}")
    print(f"accel config updated {path}" + ("" if changes else " (it was already up to date)"))
    return 0


def update_command_parser(parser: Any, parents: Any = None) -> argparse.ArgumentParser:
    """Accelerate's signature: add the `update` sub-command to ``parser`` (a subparsers object)."""
    sub = parser.add_parser("update", parents=parents or [], help="rewrite an existing config file in today's format")
    add_update_arguments(sub)
    sub.set_defaults(func=update_config_command)
    return sub


def update_config_command(args: argparse.Namespace) -> None:
    """Accelerate's command function: update and say where."""
    path = update_config(args)
    print(f"Successfully updated the configuration file at {path}.", file=sys.stdout)
