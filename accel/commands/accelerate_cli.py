"""Accelerate's entry-point module name (``accelerate.commands.accelerate_cli:main``), for code and
scripts that call it by that name: the same as the `accel` command (:mod:`accel.commands.cli`)."""

from __future__ import annotations

import sys

from accel.commands.cli import main as _cli_main

__all__ = ["main"]


def main() -> None:
    """Run `accel` with the process arguments and exit with its status, as Accelerate's ``main`` does."""
    sys.exit(_cli_main())


if __name__ == "__main__":
    main()
