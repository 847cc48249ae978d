"""The first-use build: cache directory per torch version and sources, reuse, clear failure, and the
leftovers of a killed or damaged build (a stale lock, a truncated library) met without hanging or crashing."""

from __future__ import annotations

import shutil
import sys

import pytest
import torch

from accel_emu import _extension
from conftest import run_python

_LOAD = """
    import accel_emu
    accel_emu.load()
    import torch
    print("count", torch.emu.device_count())
"""


def test_build_dir_names_torch_python_and_sources(monkeypatch, tmp_path):
    monkeypatch.delenv("ACCEL_EMU_BUILD_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = _extension.build_dir()
    assert path.parent == tmp_path / "accel" / "emu-build"
    version = torch.__version__.replace("+", "_")
    assert path.name.startswith(f"{version}-py{sys.version_info.major}{sys.version_info.minor}-")
    assert path.name.endswith(_extension._source_hash())
    monkeypatch.setenv("ACCEL_EMU_BUILD_DIR", str(tmp_path / "mine"))
    assert _extension.build_dir() == (tmp_path / "mine").resolve()



def test_fingerprint_covers_every_source_of_the_driver_and_the_adapter(monkeypatch, tmp_path):
    """The build folder's name changes with any file under csrc/, nested ones included, and two sources
    with one file name (the build names objects by it) are refused with their name."""
    csrc = _extension.source_files()[0].parents[1]
    on_disk = sorted(p for p in csrc.rglob("*") if p.suffix in (".h", ".cpp"))
    assert sorted(_extension.source_files()) == on_disk
    assert {p.parent.name for p in on_disk} == {"driver", "adapter"}
    copy = tmp_path / "csrc"
    shutil.copytree(csrc, copy)
    monkeypatch.setattr(_extension, "_CSRC", copy)
    before = _extension._source_hash()
    memory = copy / "driver" / "memory.cpp"
    memory.write_text(memory.read_text() + "\n")
    assert _extension._source_hash() != before
    (copy / "adapter" / "memory.cpp").write_text("")
    with pytest.raises(RuntimeError, match="memory.cpp"):
        _extension.source_files()

@pytest.fixture(scope="module")
def current_build(tmp_path_factory):
    """The plug-in's build, in a folder whose objects are newer than the sources, so that a copy whose
    library is gone relinks in seconds. The shared cache is keyed by the sources' content, so its objects
    can be older than a later checkout's files (same content, newer times): ninja would then compile
    every object again in each copy; one build here pays that once."""
    source = _extension.build_dir()
    objects = list(source.glob("*.o"))
    if objects and min(p.stat().st_mtime for p in objects) >= max(p.stat().st_mtime for p in _extension.source_files()):
        return source
    target = tmp_path_factory.mktemp("fresh") / "build"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.lock", "lock", "complete", "*.so"))
    result = run_python(_LOAD, env={"ACCEL_EMU_BUILD_DIR": str(target)})
    assert result.returncode == 0, result.stderr[-3000:]
    return target


@pytest.fixture
def copy_of_current_build(current_build, tmp_path):
    """A private copy of the current build (the tests damage it)."""
    target = tmp_path / "build"
    shutil.copytree(current_build, target, ignore=shutil.ignore_patterns("*.lock", "lock"))
    return target


def test_a_complete_build_is_reused_without_a_compiler(copy_of_current_build, tmp_path):
    target = copy_of_current_build
    # no compiler and no ninja on PATH: loading must not try to build
    result = run_python(_LOAD, env={"ACCEL_EMU_BUILD_DIR": str(target), "PATH": str(tmp_path / "empty")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "count 2" in result.stdout


def test_a_failed_build_says_what_it_needs(copy_of_current_build, tmp_path):
    target = copy_of_current_build
    (target / "complete").unlink()  # an interrupted build: it must be built again
    result = run_python(_LOAD, env={"ACCEL_EMU_BUILD_DIR": str(target), "PATH": str(tmp_path / "empty")})
    assert result.returncode != 0
    assert "building the emu extension in" in result.stderr
    assert "It needs a C++17 compiler and ninja" in result.stderr


def _leftover_of_a_killed_build(target):
    """What a first build stopped by SIGKILL leaves: objects, torch's builder lock, no library and no record."""
    (target / "complete").unlink()
    (target / "accel_emu_C.so").unlink()
    (target / "lock").write_text("")
    return target


def test_a_lock_left_by_a_killed_build_is_cleared_not_waited_on(copy_of_current_build, tmp_path):
    target = _leftover_of_a_killed_build(copy_of_current_build)
    result = run_python(_LOAD, env={"ACCEL_EMU_BUILD_DIR": str(target)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "count 2" in result.stdout
    assert "removed lock, left by a build that was stopped" in result.stderr
    assert "an earlier build was interrupted" in result.stderr
    assert not (target / "lock").exists()


def test_a_truncated_library_is_rebuilt_with_the_reason(copy_of_current_build, tmp_path):
    target = copy_of_current_build
    library = target / "accel_emu_C.so"
    size = library.stat().st_size
    with open(library, "r+b") as fh:
        fh.truncate(size // 2)
    result = run_python(_LOAD, env={"ACCEL_EMU_BUILD_DIR": str(target)})
    assert result.returncode == 0, result.stderr[-3000:]  # it ended in SIGBUS when the record was trusted
    assert "count 2" in result.stdout
    assert f"accel_emu_C.so has {size // 2} bytes, the build recorded {size} (truncated or replaced)" in result.stderr
    assert library.stat().st_size == size
    assert _extension.build_problem(target) is None


def test_a_library_changed_in_place_is_caught_by_its_checksum(copy_of_current_build, tmp_path):
    target = copy_of_current_build
    library = target / "accel_emu_C.so"
    with open(library, "r+b") as fh:
        fh.seek(library.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0xFF]))
    assert "does not match the checksum its build recorded" in _extension.build_problem(target)


def test_a_finished_build_is_loaded_without_writing_to_its_folder(copy_of_current_build, tmp_path):
    """A shared, pre-built cache may be read-only: loading takes no lock and creates or changes no file."""
    target = copy_of_current_build

    def snapshot():
        return {p.name: p.stat().st_mtime_ns for p in target.iterdir()}

    before = snapshot()
    target.chmod(0o555)  # read-only for a user (root writes regardless: the snapshot is the check)
    try:
        result = run_python(_LOAD, env={"ACCEL_EMU_BUILD_DIR": str(target), "PATH": str(tmp_path / "empty")})
    finally:
        target.chmod(0o755)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "count 2" in result.stdout
    assert snapshot() == before


def test_an_unbuilt_folder_that_cannot_be_written_is_named(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    folder = blocker / "emu-build"
    result = run_python(_LOAD, env={"ACCEL_EMU_BUILD_DIR": str(folder)})
    assert result.returncode != 0
    assert f"the emu extension is not built in {folder} and that folder cannot be written" in result.stderr
    assert "set ACCEL_EMU_BUILD_DIR to a writable folder" in result.stderr
