"""The first-use build: cache directory per torch version and sources, reuse, clear failure."""

from __future__ import annotations

import shutil
import sys

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


def _copy_of_current_build(tmp_path):
    source = _extension.build_dir()
    target = tmp_path / "build"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.lock", "lock"))
    return target


def test_a_complete_build_is_reused_without_a_compiler(tmp_path):
    target = _copy_of_current_build(tmp_path)
    # no compiler and no ninja on PATH: loading must not try to build
    result = run_python(_LOAD, env={"ACCEL_EMU_BUILD_DIR": str(target), "PATH": str(tmp_path / "empty")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "count 2" in result.stdout


def test_a_failed_build_says_what_it_needs(tmp_path):
    target = _copy_of_current_build(tmp_path)
    (target / "complete").unlink()  # an interrupted build: it must be built again
    result = run_python(_LOAD, env={"ACCEL_EMU_BUILD_DIR": str(target), "PATH": str(tmp_path / "empty")})
    assert result.returncode != 0
    assert "building the emu extension in" in result.stderr
    assert "It needs a C++17 compiler and ninja" in result.stderr
