"""Rank-pool folders: each ``accel-pool-*`` folder in the temp dir records its owner, and stale ones go.

A session killed with SIGKILL cannot clean up after itself, so the next pool to start removes the
folders whose owning process is gone (judged by pid and start time, so a reused pid is not mistaken).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time


POOL_DIR_PREFIX = "accel-pool-"
_OWNER_FILE = "owner"
#: a pool folder without an owner file (written by an older harness) is stale after this long
_LEGACY_STALE_S = 3600.0


def _process_start(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def write_owner(folder: str) -> None:
    """Record which process owns a pool folder (pid and its start time, so a reused pid is not mistaken).

    Written to a side file and renamed into place, so another session never reads half a record."""
    path = os.path.join(folder, _OWNER_FILE)
    with open(path + ".tmp", "w") as fh:
        fh.write(f"{os.getpid()} {_process_start(os.getpid())!r}\n")
    os.replace(path + ".tmp", path)


def _young(folder: str) -> bool:
    try:
        return time.time() - os.stat(folder).st_mtime < _LEGACY_STALE_S
    except OSError:
        return False


def _owner_alive(folder: str) -> bool:
    """Whether the session that made ``folder`` may still use it.

    No owner record (a folder just being made, or one from an older harness) or an unreadable one:
    judged by age instead."""
    try:
        with open(os.path.join(folder, _OWNER_FILE)) as fh:
            pid_text, started_text = fh.read().split()
        pid = int(pid_text)
        started = None if started_text == "None" else float(started_text)
    except (OSError, ValueError):
        return _young(folder)
    now_started = _process_start(pid)
    if now_started is None:
        return False
    return started is None or abs(now_started - started) < 1.0


def remove_stale_pool_dirs(root: str | None = None) -> list[str]:
    """Remove ``accel-pool-*`` folders under ``root`` (the temp dir) whose owning session is gone."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        entries = os.listdir(root)
    except OSError:
        return removed
    for entry in entries:
        if not entry.startswith(POOL_DIR_PREFIX):
            continue
        path = os.path.join(root, entry)
        if os.path.isdir(path) and not os.path.islink(path) and not _owner_alive(path):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                removed.append(path)
    return removed
