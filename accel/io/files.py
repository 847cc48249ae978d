"""Crash-safe file writes shared by checkpoints, trackers and the config file.

A file is written into a temporary sibling, fsynced, then renamed onto its name (``os.replace`` is
atomic on POSIX and Windows), and the folder is fsynced so the rename itself survives a power
cut. A process killed at any point leaves either the old file or the new one, never a torn mix.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import sys
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write", "file_digest", "fsync_dir", "fsync_file", "remove_tree"]


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


def remove_tree(path: str | os.PathLike) -> bool:
    """Delete the folder ``path`` with everything in it, read-only parts included.

    ``shutil.rmtree`` cannot unlink entries of a folder without write permission (a checkpoint a user
    made read-only); such folders are made writable by their owner and the removal is retried. Returns
    True when ``path`` is gone, False when something could not be removed (the caller reports it).
    """
    path = Path(path)

    def retry_writable(function: Callable, name: str, exc: BaseException) -> None:
        parent = os.path.dirname(name)
        try:
            for folder in (parent, name):
                if os.path.isdir(folder) and not os.path.islink(folder):
                    os.chmod(folder, stat.S_IMODE(os.lstat(folder).st_mode) | stat.S_IRWXU)
            function(name)
        except FileNotFoundError:
            pass
        except OSError:
            pass  # left for the final check

    if not os.path.lexists(path):
        return True
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return True
    try:
        os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IRWXU)
    except OSError:
        pass
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry_writable)
    else:
        shutil.rmtree(path, onerror=lambda f, n, info: retry_writable(f, n, info[1]))
    if os.path.lexists(path):  # a folder made writable only after rmtree listed it: one more pass
        shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


#: bytes read per call while hashing a file
_CHUNK = 8 << 20


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of the file at ``path`` with ``hashlib``'s ``algorithm``, read in 8 MiB chunks (the hash
    releases the GIL, so several files can be hashed on threads at once)."""
    import hashlib

    digest = hashlib.new(algorithm)
    view = memoryview(bytearray(_CHUNK))
    with open(path, "rb", buffering=0) as handle:
        while True:
            n = handle.readinto(view)
            if not n:
                break
            digest.update(view[:n])
    return digest.hexdigest()
