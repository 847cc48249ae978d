"""The marker lines the plugin registers, and which marker names a project registered itself.

Backend markers (``-m xpu``) come from accel's torch-free name table and the backend plug-ins' entry
points, so configuring pytest imports no torch. A line the plugin registers is remembered as its
own, so a project's marker of the same name stays the project's.
"""

from __future__ import annotations

import re

import pytest

from accel.names import BUILTIN_BACKENDS

STASH_MARKER_LINES = pytest.StashKey[set]()


#: accel's built-in backends, from accel's torch-free name table (configuring pytest imports no torch)
BUILTIN_BACKEND_NAMES = BUILTIN_BACKENDS
PLUGIN_GROUP = "accel.backends"


def marker_backend_names() -> list[str]:
    """Backend names for marker registration, without importing torch: built-ins and plug-in entry points."""
    from importlib import metadata

    try:
        plugins = [ep.name.strip().lower() for ep in metadata.entry_points(group=PLUGIN_GROUP)]
    except Exception:  # a broken distribution must not break pytest's start-up
        plugins = []
    return list(dict.fromkeys([*BUILTIN_BACKEND_NAMES, *plugins]))


def backend_marker_line(name: str) -> str:
    """The marker line of a backend's instances (``-m <name>`` selects them)."""
    return f"{name}: test instances that run on the {name} backend"


def add_marker_line(config: pytest.Config, line: str) -> None:
    """Register a marker line, remembering it as ours (a project's own line of that name stays the project's)."""
    config.stash.setdefault(STASH_MARKER_LINES, set()).add(line)
    config.addinivalue_line("markers", line)


def project_markers(config: pytest.Config) -> set[str]:
    """Marker names the project registered itself (ini ``markers`` or its conftest), not this plugin."""
    ours = config.stash.get(STASH_MARKER_LINES, set())
    names = set()
    for line in config.getini("markers"):
        if line in ours:
            continue
        name = re.split(r"[:(]", line, maxsplit=1)[0].strip()
        if name:
            names.add(name)
    return names
