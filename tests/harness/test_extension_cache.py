"""torch's extension cache before DeepSpeed's op builds: a killed build's lock is removed, a live or young
one is left alone, and one whose builder cannot be checked is side-stepped with a fresh folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from accel_harness import extension_cache
from accel_harness.extension_cache import StaleExtensionLockWarning, stale_locks

settle = extension_cache.settle_extension_cache.__wrapped__  # the once-per-process cache left out


def _lock(root, name="deepspeed_shm_comm", age_s=3600.0):
    folder = root / name  # $TORCH_EXTENSIONS_DIR/<extension>, as torch lays it out
    folder.mkdir(parents=True)
    lock = folder / "lock"
    lock.write_text("")
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


@pytest.fixture
def root(tmp_path, monkeypatch):
    root = tmp_path / "torch_extensions"
    root.mkdir()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return root


def test_a_lock_no_process_works_under_is_removed_with_a_warning(root):
    lock = _lock(root)
    assert extension_cache.extension_root() == root
    with pytest.warns(StaleExtensionLockWarning, match="a torch extension build was stopped there"):
        settle()
    assert not lock.exists()
    assert lock.parent.is_dir()  # the built objects stay: only the lock goes


def test_a_young_lock_is_left_to_its_build(root):
    lock = _lock(root, age_s=1.0)
    assert stale_locks(root) == ([], [])
    settle()
    assert lock.exists()


def test_a_lock_whose_folder_a_live_process_works_in_is_kept(root):
    lock = _lock(root)
    builder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], cwd=lock.parent,
                               stdin=subprocess.PIPE)
    try:
        assert extension_cache.builder_alive(lock.parent) is True
        assert stale_locks(root) == ([], [])
    finally:
        builder.stdin.close()
        builder.wait(timeout=60)
    assert extension_cache.builder_alive(lock.parent) is False
    assert stale_locks(root) == ([lock], [])


def test_a_lock_that_cannot_be_checked_moves_the_builds_to_a_fresh_folder(root, tmp_path):
    lock = _lock(root)
    no_proc = tmp_path / "no-proc"
    no_proc.mkdir()
    assert extension_cache.builder_alive(lock.parent, no_proc) is None
    with pytest.warns(StaleExtensionLockWarning, match="this run builds in"):
        settle(no_proc)
    assert lock.exists()  # not ours to remove: its builder may be running
    fresh = os.environ["TORCH_EXTENSIONS_DIR"]
    assert fresh != str(root)
    assert fresh.startswith(str(tmp_path / "cache" / "accel" / "torch-extensions"))
    assert os.path.isdir(fresh)


def test_no_extension_folder_is_no_work(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "absent"))
    settle()
    assert not (tmp_path / "absent").exists()


def test_the_default_root_has_a_folder_per_python_and_device(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setattr(extension_cache, "extension_root", lambda: tmp_path)
    lock = _lock(tmp_path / "py311_cpu")
    assert stale_locks(tmp_path) == ([lock], [])
    with pytest.warns(StaleExtensionLockWarning, match="removed"):
        settle()
    assert not lock.exists()
