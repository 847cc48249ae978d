"""Builds (once per torch version and source) and loads the emu C++ extension.

The extension is compiled at first use against the torch that is installed, with
``torch.utils.cpp_extension.load``, into ``$ACCEL_EMU_BUILD_DIR`` or
``~/.cache/accel/emu-build/<torch version>-<source hash>``. The rules, which a vendor's plug-in that
builds at first use needs as well:

- **A build is trusted only through its record.** The last step of a build writes ``complete``: the
  library's size and SHA-256. A load checks the library against it before importing it, so a truncated
  or replaced library (a full disk, a killed copy) is rebuilt with a message saying why instead of
  ending the process with SIGBUS.
- **A verified build is read, never written**: loading it takes no lock and creates no file, so a
  finished cache in a read-only folder (shared, pre-built) is used as it is.
- **One builder at a time, and a dead one never blocks.** Builds run under the plug-in's own file lock
  (an OS lock, released when its holder dies). Holding it proves nobody else is building here, so the
  ``lock`` file torch's builder leaves when it is killed is cleared instead of waited on forever.
- A build that cannot write its folder is an error naming the folder and ``ACCEL_EMU_BUILD_DIR``.

Once loaded, ``ACCEL_EMU_BUILD_DIR`` is set in this process's environment (unless already set), so
child processes reuse the build even when they run with another home or cache folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

__all__ = ["BUILD_DIR_ENV", "build_dir", "build_problem", "load_extension", "source_files"]

#: environment variable naming the build folder; set by :func:`load_extension` for child processes
BUILD_DIR_ENV = "ACCEL_EMU_BUILD_DIR"

#: the folder of the C++ sources: the driver (driver/) and the PyTorch adapter (adapter/)
_CSRC = Path(__file__).resolve().parent / "csrc"
_NAME = "accel_emu_C"
#: the build's record, written last: the library's size and checksum
_RECORD = "complete"
#: the lock file torch's extension builder creates and removes (left behind when it is killed)
_TORCH_BATON = "lock"
#: seconds between the "still compiling" lines of a build
_PROGRESS_EVERY_S = 30.0
_module: ModuleType | None = None


def source_files() -> list[Path]:
    """Every C++ source and header of the extension (headers first), so that the build's fingerprint
    covers each of them; an error when two sources share a file name (the build names objects by it)."""
    headers = sorted(_CSRC.rglob("*.h"))
    sources = sorted(_CSRC.rglob("*.cpp"))
    names = [path.name for path in sources]
    clashes = sorted({name for name in names if names.count(name) > 1})
    if clashes:
        raise RuntimeError(f"emu's C++ sources must have distinct file names; these repeat: {', '.join(clashes)}")
    return headers + sources


def _source_hash() -> str:
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(path.relative_to(_CSRC).as_posix().encode())
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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_problem(directory: Path) -> str | None:
    """Why the build in ``directory`` cannot be loaded (None: it can): never built, interrupted, or a
    library that does not match the build's record."""
    library, record_path = directory / f"{_NAME}.so", directory / _RECORD
    if not record_path.exists():
        started = library.exists() or (directory / _TORCH_BATON).exists() or any(directory.glob("*.o"))
        return "an earlier build was interrupted" if started else "it was never built here"
    try:
        record = json.loads(record_path.read_text())
        size, checksum = int(record["size"]), str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"its record ({record_path.name}) is unreadable or from an older accel-emu"
    if not library.exists():
        return f"{library.name} is missing"
    actual = library.stat().st_size
    if actual != size:
        return f"{library.name} has {actual} bytes, the build recorded {size} (truncated or replaced)"
    if _sha256(library) != checksum:
        return f"{library.name} does not match the checksum its build recorded (damaged or replaced)"
    return None


def _import_built(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(_NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import the emu extension from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _writable_folder(directory: Path) -> None:
    """Create ``directory`` and prove a file can be written there; else an error naming it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise RuntimeError(
            f"the emu extension is not built in {directory} and that folder cannot be written ({exc.strerror or exc}). "
            f"Build it once where it can be written, or set {BUILD_DIR_ENV} to a writable folder."
        ) from exc


def _say(message: str) -> None:
    print(f"accel-emu: {message}", file=sys.stderr, flush=True)


def _compile(directory: Path, verbose: bool) -> None:
    """Compile into ``directory`` (the caller holds the build lock), with a line every so often."""
    from torch.utils.cpp_extension import load

    started = time.monotonic()
    done = threading.Event()

    def progress() -> None:
        while not done.wait(_PROGRESS_EVERY_S):
            _say(f"still compiling ({time.monotonic() - started:.0f} s)")

    ticker = threading.Thread(target=progress, name="accel-emu-build-progress", daemon=True)
    ticker.start()
    # the C++ sources carry their own header; nothing else may leak into the build
    sources = [str(p) for p in source_files() if p.suffix == ".cpp"]
    try:
        from torch.utils.cpp_extension import include_paths

        # Kineto's headers (adapter/profiler.cpp's activity profiler) include each other by bare name
        kineto = [str(Path(path) / "kineto") for path in include_paths() if (Path(path) / "kineto").is_dir()]
        load(name=_NAME, sources=sources, extra_cflags=["-O2", "-std=c++17"], build_directory=str(directory),
             extra_include_paths=kineto, verbose=verbose, is_python_module=True)
    except Exception as exc:
        raise RuntimeError(
            f"building the emu extension in {directory} failed: {exc}. "
            "It needs a C++17 compiler and ninja (pip install ninja)."
        ) from exc
    finally:
        done.set()
        ticker.join()
    _say(f"built in {time.monotonic() - started:.0f} s")


def _build(directory: Path, verbose: bool) -> None:
    """Build under the plug-in's lock, unless another process finished a good build meanwhile."""
    from filelock import FileLock

    _writable_folder(directory)
    with FileLock(str(directory / "build.lock")):
        problem = build_problem(directory)
        if problem is None:
            return
        import torch

        compiled = any(directory.glob("*.o"))  # ninja recompiles only what changed since then
        _say(f"compiling the emu extension for torch {torch.__version__} in {directory} ({problem}); "
             + ("what an earlier build compiled is reused, so this takes seconds" if compiled
                else "this happens once per torch version and takes one to a few minutes"))
        baton = directory / _TORCH_BATON
        if baton.exists():  # our lock is held: the builder that left it is gone
            _say(f"removed {baton.name}, left by a build that was stopped (no other build can be running)")
            baton.unlink()
        for stale in (directory / _RECORD, directory / f"{_NAME}.so"):
            stale.unlink(missing_ok=True)  # the library is linked again, not trusted by its age
        _compile(directory, verbose)
        library = directory / f"{_NAME}.so"
        record = {"size": library.stat().st_size, "sha256": _sha256(library), "torch": torch.__version__}
        partial = directory / f"{_RECORD}.{os.getpid()}.tmp"
        partial.write_text(json.dumps(record) + "\n")
        os.replace(partial, directory / _RECORD)


def load_extension(verbose: bool = False) -> ModuleType:
    """The loaded extension module; compiles it first when no verified build exists."""
    global _module
    if _module is not None:
        return _module
    import torch  # noqa: F401 - the extension links against the loaded torch

    directory = build_dir()
    if build_problem(directory) is not None:
        _build(directory, verbose)
        problem = build_problem(directory)
        if problem is not None:
            raise RuntimeError(f"the emu extension built in {directory} cannot be loaded: {problem}")
    _module = _import_built(directory / f"{_NAME}.so")
    # children of this process (ranks, launched scripts, isolated runs with another home or cache
    # folder) find this build instead of compiling their own
    os.environ.setdefault(BUILD_DIR_ENV, str(directory))
    return _module
