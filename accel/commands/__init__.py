"""The `accel` command line. Commands are listed once, in `cli.COMMANDS`, and loaded on demand."""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["RESULTS_DIR", "UsageError", "default_output"]

#: the one folder, under the current directory, that commands write into when no -o is given
RESULTS_DIR = "accel-results"


def default_output(name: str) -> Path:
    """A fresh folder for a command's results: ``accel-results/<name>-<UTC time>``."""
    return Path(RESULTS_DIR) / f"{name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"


class UsageError(ValueError):
    """A mistake in how the user invoked a command; `accel` prints it on one line and exits 2."""
