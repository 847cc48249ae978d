"""Crash-safe file writes shared by checkpoints, trackers and the config file.

A file is written into a temporary sibling, fsynced, then renamed onto its name (``os.replace`` is
atomic on POSIX and Windows), and the folder is fsynced so the rename itself survives a power
cut. A process killed at any point leaves either the old file or the new one, never a torn mix.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write", "fsync_dir", "fsync_file"]


def fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a folder (its entries); a no-op where the platform cannot (Windows): the rename is still atomic."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None], *, keep_mode: int | None = None) -> Path:
    """``write(tmp)`` into a temporary file beside ``path``, fsync it, then ``os.replace`` it onto ``path``.

    ``keep_mode``: give the new file the mode of the file it replaces, or this mode when there is
    none (``mkstemp``-style temporary files are otherwise private to the owner). On any error the
    temporary file is removed and the error raised; ``path`` is untouched.
    """
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        write(tmp)
        fsync_file(tmp)
        if keep_mode is not None:
            try:
                mode = path.stat().st_mode & 0o777
            except OSError:
                mode = keep_mode
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
    return path
