"""The manifest's checks: per-file checksums (written at save, verified at load), entries that must
stay inside the checkpoint folder, and the manifest an Accelerate-written folder implies."""

from __future__ import annotations

import os
import re
from pathlib import Path, PureWindowsPath
from typing import Any

from ..facts.environment import env_flag
from ..launch import heartbeat
from ..io.files import file_digest
from .context import CheckpointContext
from .layout import (
    CHECKSUM_ALGORITHM,
    CHECKSUM_ENV,
    CUSTOM_NAME,
    MANIFEST_NAME,
    MODEL_NAME,
    OPTIMIZER_NAME,
    SAFE_MODEL_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    CheckpointError,
    index_suffix,
)


def checksums_enabled() -> bool:
    """Whether checksums are written and verified (the yes/no ``CHECKSUM_ENV`` switch, on when unset)."""
    return env_flag(CHECKSUM_ENV, default=True)


def compute_checksums(folder: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {CHECKSUM_ALGORITHM: hex digest, "size": bytes}}`` for every file under ``folder``
    (the strategy's own files, e.g. DeepSpeed engine folders, included); files hashed on a few threads."""
    from concurrent.futures import ThreadPoolExecutor

    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and p.name != MANIFEST_NAME)
    workers = max(1, min(4, len(files), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(lambda p: (file_digest(p, CHECKSUM_ALGORITHM), heartbeat.alive())[0], files))
    return {p.relative_to(folder).as_posix(): {CHECKSUM_ALGORITHM: d, "size": p.stat().st_size}
            for p, d in zip(files, digests)}


def verify_checksums(folder: Path, checksums: Any) -> str | None:
    """None when every file listed in the manifest has its recorded size and digest; else the problem, naming the file."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    if not isinstance(checksums, dict):
        return f"{folder / MANIFEST_NAME}: 'checksums' is not a mapping"
    jobs = []
    for name, entry in sorted(checksums.items()):
        path = entry_path(folder, name, "the manifest's 'checksums'")  # never a file outside the folder
        if not isinstance(entry, dict):
            return f"{folder / MANIFEST_NAME}: the checksum entry of {name} is malformed"
        algorithm = next((a for a in entry if a != "size"), None)
        if algorithm not in hashlib.algorithms_available:
            return f"{path}: checksum algorithm {algorithm!r} is not available in this Python's hashlib"
        if not path.is_file():
            return f"{path} is missing (it is listed in {MANIFEST_NAME})"
        size = path.stat().st_size
        if "size" in entry and size != entry["size"]:
            return f"{path} has {size} bytes but {entry['size']} were saved (truncated or replaced)"
        jobs.append((path, algorithm, entry[algorithm]))
    workers = max(1, min(4, len(jobs), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        found = list(pool.map(lambda job: (file_digest(job[0], job[1]), heartbeat.alive())[0], jobs))
    for (path, algorithm, expected), actual in zip(jobs, found):
        if actual != expected:
            return (f"{path} does not match its {algorithm} checksum in {MANIFEST_NAME} (saved {expected[:16]}..., "
                    f"found {actual[:16]}...): the file changed or is corrupt since it was saved")
    return None


def check_integrity(ctx: CheckpointContext, folder: Path, manifest: dict[str, Any], verify: bool) -> None:
    """Verify the manifest's checksums on each node's local main process; a mismatch is raised on every process."""
    checksums = manifest.get("checksums")
    if not verify or checksums is None:
        return
    problem = verify_checksums(folder, checksums) if ctx.is_local_main_process else None
    if ctx.use_distributed:
        from ..utils.operations import gather_object

        problem = next((p for p in gather_object([problem]) if p), None)
    if problem:
        raise CheckpointError(
            f"checkpoint {folder} failed verification: {problem}. To load it anyway, pass "
            f"load_state(..., verify_checksums=False) or set {CHECKSUM_ENV}=0"
        )


def accel_version() -> str:
    """The running accel's version, recorded in the manifest."""
    from .. import __version__

    return __version__


#: the manifest fields that name files or folders of the checkpoint (each a list of names, or one name, or None)
_ENTRY_FIELDS = ("models", "optimizers", "schedulers", "dataloaders", "custom_objects", "scaler", "random_states",
                 "accelerate_random_states")


_MAX_LINK_HOPS = 40


def _stays_inside(root: str, name: str) -> bool:
    """Whether ``name`` (relative, POSIX) resolves to something strictly inside the real folder ``root``.

    Resolved one component at a time, following symbolic links by reading them, and stopping as soon as
    a step would leave ``root``: nothing outside the folder is ever looked at, so the answer cannot
    depend on (or reveal) what exists there.
    """
    pending = name.split("/")
    current = root
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if current == root:
                return False
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        if not os.path.islink(candidate):
            current = candidate
            continue
        hops += 1
        if hops > _MAX_LINK_HOPS:
            return False  # a loop of links
        target = os.readlink(candidate)
        if os.path.isabs(target):
            target = os.path.normpath(target)
            if target != root and not target.startswith(root.rstrip(os.sep) + os.sep):
                return False
            pending = os.path.relpath(target, root).split(os.sep) + pending
            current = root
        else:
            pending = target.split("/") + pending
    return current != root


def entry_path(folder: Path, name: Any, what: str) -> Path:
    """``folder / name`` for an entry of the manifest, after refusing one that could leave ``folder``.

    Refused: a name that is not a non-empty string, an absolute path (POSIX or Windows style), a ``..``
    component, a NUL byte, the folder itself, and a path that a symbolic link inside the folder leads out
    of. The error names the entry and says nothing about the place it points to.
    """
    where = f"checkpoint {folder} was refused: {what} entry {name!r}"
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{where} is not a file name (a non-empty string)")
    if "\x00" in name:
        raise CheckpointError(f"{where} contains a NUL byte")
    if "\\" in name or name.startswith("/") or PureWindowsPath(name).anchor or os.path.isabs(name):
        raise CheckpointError(f"{where} is an absolute path or uses backslashes; entries are paths relative to the "
                              "checkpoint folder, with '/' between components")
    parts = name.split("/")
    if ".." in parts:
        raise CheckpointError(f"{where} goes up a folder with '..'; a checkpoint's files lie inside its folder")
    if not any(p not in ("", ".") for p in parts):
        raise CheckpointError(f"{where} names the checkpoint folder itself, not a file in it")
    if not _stays_inside(os.path.realpath(folder), name):
        raise CheckpointError(f"{where} leads out of the checkpoint folder through a symbolic link; a checkpoint's "
                              "files lie inside its folder")
    return folder / name


def check_entries(folder: Path, manifest: dict[str, Any]) -> None:
    """Refuse a manifest any of whose entries (files, checksum keys, the strategy's files) leaves ``folder``.

    Runs before any file the manifest names is opened.
    """
    for key in _ENTRY_FIELDS:
        value = manifest.get(key)
        if value is None:
            continue
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list):
            raise CheckpointError(f"checkpoint {folder} was refused: the manifest's {key!r} is a "
                                  f"{type(value).__name__}, not a list of file names")
        for name in names:
            entry_path(folder, name, f"the manifest's {key!r}")
    checksums = manifest.get("checksums")
    if isinstance(checksums, dict):
        for name in checksums:
            entry_path(folder, name, "the manifest's 'checksums'")
    elif checksums is not None:
        raise CheckpointError(f"checkpoint {folder} was refused: the manifest's 'checksums' is a "
                              f"{type(checksums).__name__}, not a mapping")
    strategy = manifest.get("strategy")
    if strategy is not None:
        if not isinstance(strategy, dict) or not isinstance(strategy.get("files", []), list):
            raise CheckpointError(f"checkpoint {folder} was refused: the manifest's 'strategy' is malformed")
        for name in strategy.get("files", []):
            entry_path(folder, name, "the manifest's 'strategy' files")


def accelerate_manifest(folder: Path, models: list[Any], num_optimizers: int, num_schedulers: int) -> dict[str, Any]:
    """What an Accelerate-written checkpoint (no manifest) should hold, from what was prepared."""
    names = []
    for i in range(len(models)):
        safe = f"{SAFE_MODEL_NAME}{index_suffix(i)}.safetensors"
        names.append(safe if os.path.lexists(folder / safe) else f"{MODEL_NAME}{index_suffix(i)}.bin")
    customs = sorted(p.name for p in folder.iterdir() if re.fullmatch(rf"{CUSTOM_NAME}_\d+\.pkl", p.name))
    return {
        "format": "accelerate",
        "models": names,
        "optimizers": [f"{OPTIMIZER_NAME}{index_suffix(i)}.bin" for i in range(num_optimizers)],
        "schedulers": [f"{SCHEDULER_NAME}{index_suffix(i)}.bin" for i in range(num_schedulers)],
        "dataloaders": None,  # Accelerate pickles whole sampler objects: not loadable safely, skipped
        "custom_objects": customs,
        "scaler": SCALER_NAME if os.path.lexists(folder / SCALER_NAME) else None,
        "num_processes": None,
    }
