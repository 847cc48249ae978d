"""Builds (once per torch version and source) and loads the emu C++ extension.

The extension is compiled at first use against the torch that is installed, with
``torch.utils.cpp_extension.load``, into ``$ACCEL_EMU_BUILD_DIR`` or
``~/.cache/accel/emu-build/<torch version>-<source hash>``. A file lock serialises concurrent
builds (several ranks starting at once); a finished build whose torch version and sources match
is reused without compiling. Once loaded, ``ACCEL_EMU_BUILD_DIR`` is set in this process's
environment (unless already set), so child processes reuse the build even when they run with another
home or cache folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["BUILD_DIR_ENV", "build_dir", "load_extension", "source_files"]

#: environment variable naming the build folder; set by :func:`load_extension` for child processes
BUILD_DIR_ENV = "ACCEL_EMU_BUILD_DIR"

_SOURCES = ("emu_runtime.h", "emu_runtime.cpp", "emu_aten.cpp", "emu_module.cpp")
_NAME = "accel_emu_C"
_module: ModuleType | None = None


def source_files() -> list[Path]:
    """The C++ sources of the extension, header first."""
    here = Path(__file__).resolve().parent / "csrc"
    return [here / name for name in _SOURCES]


def _source_hash() -> str:
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    """Where the extension for this torch and these sources is (or will be) built."""
    import torch

    override = os.environ.get(BUILD_DIR_ENV, "").strip()
    if override:
        return Path(override).expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    tag = f"{torch.__version__.replace('+', '_')}-py{sys.version_info.major}{sys.version_info.minor}-{_source_hash()}"
    return Path(cache) / "accel" / "emu-build" / tag


def _import_built(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(_NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import the emu extension from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_extension(verbose: bool = False) -> ModuleType:
    """The loaded extension module; compiles it first when no matching build exists."""
    global _module
    if _module is not None:
        return _module
    import torch  # noqa: F401 - the extension links against the loaded torch
    from filelock import FileLock

    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    built = directory / f"{_NAME}.so"
    stamp = directory / "complete"
    with FileLock(str(directory / "build.lock")):
        if not (built.exists() and stamp.exists()):
            from torch.utils.cpp_extension import load

            # the C++ sources carry their own header; nothing else may leak into the build
            sources = [str(p) for p in source_files() if p.suffix == ".cpp"]
            try:
                load(
                    name=_NAME,
                    sources=sources,
                    extra_cflags=["-O2", "-std=c++17"],
                    build_directory=str(directory),
                    verbose=verbose,
                    is_python_module=True,
                )
            except Exception as exc:
                raise RuntimeError(
                    f"building the emu extension in {directory} failed: {exc}. "
                    "It needs a C++17 compiler and ninja (pip install ninja)."
                ) from exc
            stamp.write_text("ok\n")
    _module = _import_built(built)
    # children of this process (ranks, launched scripts, isolated runs with another home or cache
    # folder) find this build instead of compiling their own
    os.environ.setdefault(BUILD_DIR_ENV, str(directory))
    return _module
