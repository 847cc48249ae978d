"""A run's fingerprint: what must match for two runs to be comparable.

The header's ``extra["fingerprint"]`` holds the versions known at start-up (torch, accel, each
installed backend plug-in, the device profile's version and file hash) and one hash over them; the
``run_end`` line's ``fingerprint_tests`` holds the number and a hash of the selected test ids,
known only once collection is done (the results file is append-only). Versions are read from
installed distributions' metadata, so nothing here imports torch.

The header's ``extra["command_line"]`` is the command that started the run (:func:`command_line`):
the ``accel`` command a person typed when ``accel qualify`` started the harness (handed down in
:data:`COMMAND_LINE_ENV`), else the pytest command itself. It identifies the run for a reader; it is
not part of the hash (two runs started with different options can still be compared).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
from importlib import metadata
from typing import Any, Iterable, Mapping, Sequence

import pytest

__all__ = ["COMMAND_LINE_ENV", "TestSelection", "command_line", "environment_fingerprint", "tests_fingerprint"]

#: the command line an accel command hands down to the pytest runs it starts, for their headers
COMMAND_LINE_ENV = "ACCEL_COMMAND_LINE"

_PLUGIN_GROUP = "accel.backends"


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def environment_fingerprint(profile: Any = None) -> dict[str, Any]:
    """Versions of torch, accel, the backend plug-ins and the profile, with a hash over them all."""
    plugins: dict[str, str | None] = {}
    try:
        for ep in metadata.entry_points(group=_PLUGIN_GROUP):
            dist = getattr(ep, "dist", None)
            label = dist.name if dist is not None else ep.value
            plugins[label] = dist.version if dist is not None else None
    except Exception:  # a broken distribution must not cost the run its header
        plugins = {}
    data: dict[str, Any] = {
        "torch": _version("torch"),
        "accel": _version("accel"),
        "plugins": dict(sorted(plugins.items())),
        "profile": None if profile is None else {"name": profile.name, "version": profile.version,
                                                 "sha256": profile.sha256},
    }
    data["sha256"] = _digest(data)
    return data


def command_line(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The command that started this process, as a shell would take it back (``shlex.join``): the one
    in :data:`COMMAND_LINE_ENV` when an accel command set it, else ``argv`` (default ``sys.argv``) with
    the program named as typed (``accel``, ``pytest``; ``python -m pytest`` for a package's
    ``__main__.py``) instead of its installed path."""
    environ = os.environ if environ is None else environ
    handed_down = environ.get(COMMAND_LINE_ENV)
    if handed_down:
        return handed_down
    args = list(sys.argv if argv is None else argv)
    if not args:
        return ""
    program = os.path.basename(args[0]) or args[0]
    head = ["python", "-m", os.path.basename(os.path.dirname(args[0]))] if program == "__main__.py" else [program]
    return shlex.join(head + args[1:])


def tests_fingerprint(nodeids: Iterable[str]) -> dict[str, Any]:
    """How many tests were selected and a hash of their sorted ids (order-independent)."""
    ids = sorted(set(nodeids))
    return {"count": len(ids), "sha256": _digest(ids)}


class TestSelection:
    """Remembers the selected test ids: the session's items, or under xdist the first worker's list."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self) -> None:
        self.ids: list[str] | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if session.items or self.ids is None:
            self.ids = [item.nodeid for item in session.items]

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self.ids:
            self.ids = list(ids)

    def summary(self) -> dict[str, Any]:
        """The selection's count and hash (see :func:`tests_fingerprint`)."""
        return tests_fingerprint(self.ids or [])
