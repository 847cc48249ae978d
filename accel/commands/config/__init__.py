"""`accel config`, laid out as ``accelerate.commands.config`` is.

``config`` (the command: questions, value flags, ``show``), ``config_args`` (Accelerate's config
dataclasses and ``load_config_from_file``), ``default`` (``write_basic_config``), ``update``,
``cluster`` (the questions), ``sagemaker`` and ``config_utils``. The checks behind all of them live
once, in :mod:`accel.launch.config_file`.
"""

from __future__ import annotations

import argparse
from typing import Any

from accel.commands.config.config import add_arguments, add_flag, ask_questions, changed_config, default_config, run

__all__ = [
    "add_arguments",
    "add_flag",
    "ask_questions",
    "changed_config",
    "default_config",
    "default_config_file",
    "get_config_parser",
    "load_config_from_file",
    "main",
    "run",
]


def __getattr__(name: str) -> Any:
    # config_args imports yaml; keep `accel config --help` from paying for it until it is asked for
    if name in ("default_config_file", "load_config_from_file"):
        from accel.commands.config import config_args

        return getattr(config_args, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_config_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's entry: the `config` parser (with its `default`, `show` and `update` actions),
    added to ``subparsers`` when given; the parsed namespace's ``func`` runs it."""
    if subparsers is not None:
        parser = subparsers.add_parser("config", help="write the config file `accel launch` reads")
    else:
        parser = argparse.ArgumentParser("accel config", allow_abbrev=False)
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def main() -> int:
    """`python -m accel.commands.config`: the same as `accel config`."""
    from accel.commands.cli import main as cli_main

    import sys

    return cli_main(["config", *sys.argv[1:]])
