"""torch's C++ extension cache, checked before a test that builds into it (DeepSpeed's ops).

torch's builder marks a build in progress with a ``lock`` file in the extension's folder and removes it
when done. A builder that is killed leaves the file behind, and from then on every build of that
extension waits for it forever: a DeepSpeed suite test sits until its timeout with nothing saying why.
The file holds no process id, so a lock counts as stale when no process works in its folder (ninja and
the compiler run there) and it is older than a build's first steps. A stale lock is removed with a
warning naming it; one whose builder cannot be checked (no ``/proc``) is side-stepped with a fresh
extension folder (under accel's cache folder) for this process and its children, also named.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
import warnings
from pathlib import Path

__all__ = ["StaleExtensionLockWarning", "builder_alive", "extension_root", "settle_extension_cache", "stale_locks"]

#: the file torch's builder creates for the length of a build
LOCK_NAME = "lock"
#: a younger lock may belong to a build that has not started its compiler yet
MIN_AGE_S = 60.0
_PROC = Path("/proc")


class StaleExtensionLockWarning(UserWarning):
    """A killed build's lock in torch's extension cache was removed or side-stepped."""


def extension_root() -> Path:
    """Where torch builds C++ extensions: ``$TORCH_EXTENSIONS_DIR`` (one folder per extension), else torch's
    default folder (one folder per python and device tag, each with one folder per extension)."""
    override = os.environ.get("TORCH_EXTENSIONS_DIR")
    if override is not None:
        return Path(override)
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


def _locks(root: Path) -> list[Path]:
    pattern = f"*/{LOCK_NAME}" if "TORCH_EXTENSIONS_DIR" in os.environ else f"*/*/{LOCK_NAME}"
    return sorted(root.glob(pattern))


def builder_alive(folder: Path, proc: Path = _PROC) -> bool | None:
    """Whether a process works in ``folder`` (its current directory is there); None where processes
    cannot be listed."""
    if not (proc / "self" / "cwd").exists():
        return None
    target = os.path.realpath(folder)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.path.realpath(entry / "cwd") == target:
                return True
        except OSError:  # gone meanwhile, or another user's
            continue
    return False


def stale_locks(root: Path, min_age_s: float = MIN_AGE_S, proc: Path = _PROC) -> tuple[list[Path], list[Path]]:
    """The build locks under ``root`` (see :func:`extension_root`): those proven stale, and those whose
    builder cannot be checked. A young lock or one with a live builder is neither."""
    stale, unknown = [], []
    now = time.time()
    for lock in _locks(root):
        try:
            age = now - lock.stat().st_mtime
        except OSError:  # removed meanwhile: its build finished
            continue
        if age < min_age_s:
            continue
        alive = builder_alive(lock.parent, proc)
        if alive is None:
            unknown.append(lock)
        elif not alive:
            stale.append(lock)
    return stale, unknown


@functools.lru_cache(maxsize=None)
def settle_extension_cache(proc: Path = _PROC) -> None:
    """Remove the stale locks of torch's extension cache, or move this process's builds to a fresh folder
    when a lock's builder cannot be checked; each case is a warning naming the lock. Once per process
    (``proc``: where processes are listed)."""
    root = extension_root()
    if not root.is_dir():
        return
    stale, unknown = stale_locks(root, proc=proc)
    for lock in stale:
        lock.unlink(missing_ok=True)
        warnings.warn(StaleExtensionLockWarning(
            f"removed {lock}: a torch extension build was stopped there and left its lock (no process works in "
            "that folder), which would have made every later build of it wait forever"))
    if unknown:
        from accel.io.paths import cache_dir

        parent = cache_dir() / "torch-extensions"
        parent.mkdir(parents=True, exist_ok=True)
        fresh = tempfile.mkdtemp(prefix="run-", dir=parent)
        os.environ["TORCH_EXTENSIONS_DIR"] = fresh
        warnings.warn(StaleExtensionLockWarning(
            f"{', '.join(map(str, unknown))}: a torch extension build lock whose builder cannot be checked on this "
            f"system; this run builds in {fresh} instead (remove the lock if no build is running)"))
