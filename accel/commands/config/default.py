"""`accel config default` as a function: ``write_basic_config`` (Accelerate's name, used in notebooks)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["write_basic_config"]


def write_basic_config(mixed_precision: str = "no", save_location: str | os.PathLike[str] | None = None) -> Any:
    """Write the default config for this machine (one process per device, one on cpu) with
    ``mixed_precision``; returns the path written, or False (with a message) when a file is already
    there, as Accelerate does. ``save_location`` defaults to the default config file."""
    from accel.commands.config.config import default_config
    from accel.launch.config_file import MIXED_PRECISIONS, default_config_path, save_config

    path = Path(save_location) if save_location is not None else default_config_path()
    if path.exists():
        print(f"Configuration already exists at {path}, will not override. Run `accel config` to change it, "
              "or pass another save_location.")
        return False
    precision = str(mixed_precision).lower()
    if precision not in MIXED_PRECISIONS:
        raise ValueError(f"`mixed_precision` should be one of {', '.join(map(repr, MIXED_PRECISIONS))}, got {mixed_precision!r}")
    return save_config(default_config(mixed_precision=precision), path)
