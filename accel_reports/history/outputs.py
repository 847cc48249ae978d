"""Output folders checked before any work is done: made if absent, and proven writable.

``accel report -o``, ``accel report --history`` (the folder of an SQLite history) and ``accel
qualify --output`` write files into a folder. Where that folder cannot be made (a part of its path
is a file, a read-only file system, no permission) the command must say so in one line and exit 2
before it has imported, run or rendered anything, instead of failing with a traceback at the end.

Importing this module imports nothing beyond the standard library.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["OutputPathError", "writable_folder"]


class OutputPathError(ValueError):
    """An output folder that cannot be made or written; the message names the path and the reason."""


def _shown(path: str | os.PathLike[str]) -> str:
    """A path that prints (bytes that are not UTF-8 shown as U+FFFD)."""
    return os.fsdecode(path).encode("utf-8", "replace").decode("utf-8")


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def writable_folder(path: str | os.PathLike[str], *, label: str = "-o", purpose: str = "") -> Path:
    """Make the folder ``path`` (and its parents) if absent and check that a file can be created in
    it; return it. Raises :class:`OutputPathError` naming ``label`` (the option, e.g. ``-o``), the
    path and the reason. ``purpose`` is added to the message (what goes into the folder)."""
    folder = Path(path)
    note = f" ({purpose})" if purpose else ""
    for part in (folder, *folder.parents):  # the deepest part that exists must be a folder
        if part.exists() or part.is_symlink():
            if not part.is_dir():
                what = "is a file" if part == folder else f"cannot be made: {_shown(part)} is a file"
                raise OutputPathError(f"{label} {_shown(folder)}: {what}, not a folder{note}")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"{label} {_shown(folder)}: the folder cannot be made: {_reason(exc)}{note}") from None
    try:
        handle, probe = tempfile.mkstemp(prefix=".accel-write-check-", dir=folder)
    except OSError as exc:
        raise OutputPathError(f"{label} {_shown(folder)}: the folder cannot be written: {_reason(exc)}{note}") from None
    os.close(handle)
    os.unlink(probe)
    return folder
