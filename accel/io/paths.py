"""Where accel keeps its own files on a machine: one cache folder, following the XDG convention."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """accel's cache folder: ``${XDG_CACHE_HOME:-~/.cache}/accel`` (config file, upstream environments, builds)."""
    cache = os.environ.get("XDG_CACHE_HOME")
    if not cache or not os.path.isabs(cache):  # the XDG spec says to ignore relative paths
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "accel"
