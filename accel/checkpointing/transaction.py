"""The atomic side of ``save_state``: which process writes, hidden working folders, the rename into
place (moving an existing folder aside first), clean-up of interrupted saves, ``total_limit`` rotation."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import warnings
from pathlib import Path
from typing import Callable

from ..io.files import fsync_dir, remove_tree
from .context import CheckpointContext
from .layout import CHECKPOINT_DIR, LEFTOVER, STATE_FILE, CheckpointError

logger = logging.getLogger(__name__)


def is_writer(ctx: CheckpointContext) -> bool:
    """The process that writes shared files: the main one, or each node's local main with save_on_each_node."""
    if ctx.project_configuration.save_on_each_node:
        return ctx.is_local_main_process
    return ctx.is_main_process


def shared_token(ctx: CheckpointContext) -> str:
    """A token every process agrees on (the main process's, broadcast), naming this save's hidden working folders."""
    token = [f"{os.getpid():x}-{secrets.token_hex(4)}"]
    if ctx.use_distributed:
        from ..utils.operations import broadcast_object_list

        broadcast_object_list(token, from_process=0)
    return token[0]


def clean_leftovers(parent: Path, names: Callable[[str], bool]) -> None:
    """Remove temp dirs of interrupted saves; put back a moved-aside checkpoint whose replacement never landed."""
    if not parent.is_dir():
        return
    for entry in sorted(parent.iterdir()):
        match = LEFTOVER.fullmatch(entry.name)
        if match is None or not names(match.group("name")) or not entry.is_dir():
            continue
        original = parent / match.group("name")
        if match.group("kind") == "old" and not original.exists():
            logger.warning("restoring %s, moved aside by a save that did not finish", original)
            os.replace(entry, original)
            continue
        remove_or_warn(entry, "left by an interrupted save")


def remove_or_warn(path: Path, why: str) -> None:
    """Delete a hidden working folder; one that cannot be deleted is named in a warning, never left silently."""
    if not remove_tree(path):
        warnings.warn(f"could not delete {path} ({why}); remove it by hand to free its space", stacklevel=4)


def carry_user_files(old: Path, new: Path) -> None:
    """Hard-link (or copy) files a user kept in an existing checkpoint directory into its replacement."""
    for entry in old.iterdir():
        target = new / entry.name
        if target.exists() or STATE_FILE.fullmatch(entry.name):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, target, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, target)


def _link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def commit(tmp: Path, target: Path, token: str, carry: bool = True) -> None:
    """Rename the finished ``tmp`` onto ``target``; an existing ``target`` is moved aside, then deleted
    (read-only parts included). ``carry``: keep the user's own files of the replaced ``target``."""
    if not tmp.exists():
        if target.is_dir():
            return  # another node's local main already renamed it (shared file system)
        raise CheckpointError(f"the checkpoint being written at {tmp} disappeared before it could be renamed to {target}")
    aside = None
    if target.exists():
        if carry:
            carry_user_files(target, tmp)
            fsync_dir(tmp)
        aside = target.parent / f".{target.name}.old-{token}"
        os.replace(target, aside)
    os.replace(tmp, target)
    fsync_dir(target.parent)
    if aside is not None:
        remove_or_warn(aside, f"the previous {target.name}, replaced")


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``checkpoint_N`` directories under ``root``, oldest first by N (hidden temp dirs never match)."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = CHECKPOINT_DIR.fullmatch(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def retired_by_limit(root: Path, limit: int) -> list[Path]:
    """The checkpoints ``total_limit`` retires to make room for the next one, as Accelerate picks them:
    of the ``checkpoint_N`` folders present *before* the save, the lowest N first, so many that the new
    one makes ``limit``. The checkpoint being written is never among them (it does not exist yet, or it
    is the folder it replaces)."""
    existing = list_checkpoints(root)
    return [path for _, path in existing[: max(0, len(existing) + 1 - limit)]]


def retire(doomed: list[Path], keep: Path, limit: int, token: str) -> None:
    """Delete the checkpoints ``retired_by_limit`` chose, each first renamed out of sight; ``keep`` is never touched."""
    for path in doomed:
        if path.name == keep.name or not path.is_dir():
            continue
        hidden = path.parent / f".{path.name}.del-{token}"
        os.replace(path, hidden)  # gone from view at once; a crash mid-delete leaves only a hidden dir
        remove_or_warn(hidden, f"checkpoint {path.name} retired by total_limit={limit}")
        logger.info("total_limit=%d: deleted %s", limit, path)
