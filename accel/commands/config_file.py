"""Where accel's config file lives, in one place, so `accel env` and `accel config` agree."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CONFIG_ENV", "config_file_in_use", "default_config_path"]

#: environment variable naming the config file explicitly
CONFIG_ENV = "ACCEL_CONFIG_FILE"


def default_config_path() -> Path:
    """``$ACCEL_CONFIG_FILE`` if set, else ``${XDG_CACHE_HOME:-~/.cache}/accel/default_config.yaml``."""
    override = os.environ.get(CONFIG_ENV)
    if override:
        return Path(override).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    if not cache or not os.path.isabs(cache):  # the XDG spec says to ignore relative paths
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "accel" / "default_config.yaml"


def config_file_in_use() -> tuple[Path, bool]:
    """The config path accel would read and whether a file is there."""
    path = default_config_path()
    return path, path.is_file()
