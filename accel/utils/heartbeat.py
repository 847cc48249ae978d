"""Progress heartbeat of a rank started by ``accel launch``, read by the launcher's hang watchdog.

Each rank owns one 32-byte file ``rank-{RANK}.hb`` in the folder ``$ACCEL_LAUNCH_RUN_DIR`` (made by the
launcher), mapped into memory: its pid, how many progress points it has passed (optimizer steps,
accel collectives, checkpoint files) and the ``time.monotonic()`` of the last one. :func:`beat` is a
counter increment and one ``struct.pack_into`` into the mapping (no system call); outside ``accel
launch`` it is a single ``None`` check. Progress points must be passed by every rank alike (steps,
collectives), so the rank with fewer is the one behind; work only some ranks do (the main process writing
a checkpoint) calls :func:`alive`, which moves the time without counting. CLOCK_MONOTONIC is system-wide on Linux, so the launcher
compares the ranks' times with its own clock.

The launcher declares a hang when no rank has passed a progress point for ``--hang_timeout`` seconds,
asks every rank for its Python stack (``faulthandler`` on :data:`STACK_SIGNAL`, written to
``stack-{RANK}.txt``), names the rank that is behind, and ends the job.
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RUN_DIR_ENV", "STACK_SIGNAL", "Beat", "alive", "beat", "read", "start", "failure_path", "record_failure", "read_failure"]

#: the folder the launcher shares with its ranks (heartbeats, stacks, failure times)
RUN_DIR_ENV = "ACCEL_LAUNCH_RUN_DIR"
#: the signal on which a rank writes every thread's Python stack (SIGUSR1 is left to the user, e.g. SLURM requeue)
STACK_SIGNAL = getattr(signal, "SIGUSR2", None)

_HEADER = struct.Struct("<qqd")  # pid, progress points passed, monotonic time of the last one
_BEAT = struct.Struct("<qd")  # (count, time) at offset 8
_TIME = struct.Struct("<d")  # time only, at offset 16
_SIZE = 32

_map: mmap.mmap | None = None
_count = 0
_pack = _BEAT.pack_into
_now = time.monotonic


def beat() -> None:
    """Record that this rank made progress (a no-op unless the rank was started by ``accel launch``)."""
    global _count
    if _map is None:
        return
    _count += 1
    _pack(_map, 8, _count, _now())


def alive() -> None:
    """Record that this rank is busy with work of its own (a checkpoint file written): resets the hang clock
    without counting a progress point, since its peers may not do the same work (no-op outside ``accel launch``)."""
    if _map is None:
        return
    _TIME.pack_into(_map, 16, _now())


def _rank() -> str:
    return os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))


def start(run_dir: str | os.PathLike | None = None) -> bool:
    """Create this rank's heartbeat file and stack file in ``run_dir`` (default ``$ACCEL_LAUNCH_RUN_DIR``) and
    register the stack dump on :data:`STACK_SIGNAL`; False (and nothing done) when there is no such folder."""
    global _map, _count, _stack_file
    import faulthandler

    folder = run_dir or os.environ.get(RUN_DIR_ENV)
    if not folder or not os.path.isdir(folder):
        return False
    rank = _rank()
    path = Path(folder) / f"rank-{rank}.hb"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, _SIZE)
        _map = mmap.mmap(fd, _SIZE)
    finally:
        os.close(fd)
    _count = 0
    _HEADER.pack_into(_map, 0, os.getpid(), 0, time.monotonic())
    if STACK_SIGNAL is not None:
        _stack_file = open(Path(folder) / f"stack-{rank}.txt", "w")  # kept open: faulthandler writes to its fd
        faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    return True


_stack_file = None


@dataclass
class Beat:
    """One rank's heartbeat as the launcher reads it."""

    rank: int
    pid: int
    count: int
    last: float


def read(run_dir: str | os.PathLike) -> dict[int, Beat]:
    """Every rank's heartbeat in ``run_dir``, by global rank."""
    found: dict[int, Beat] = {}
    for path in Path(run_dir).glob("rank-*.hb"):
        try:
            data = path.read_bytes()
            rank = int(path.stem.split("-", 1)[1])
        except (OSError, ValueError):
            continue
        if len(data) >= _HEADER.size:
            pid, count, last = _HEADER.unpack_from(data, 0)
            found[rank] = Beat(rank, pid, count, last)
    return found


def failure_path(run_dir: str | os.PathLike, rank: int | str) -> Path:
    return Path(run_dir) / f"failed-{rank}"


def record_failure() -> None:
    """Write the monotonic time of this rank's failure (in ns) for the launcher, which names the earliest."""
    folder = os.environ.get(RUN_DIR_ENV)
    if not folder:
        return
    try:
        failure_path(folder, _rank()).write_text(str(time.monotonic_ns()))
    except OSError:
        pass


def read_failure(run_dir: str | os.PathLike, rank: int) -> int | None:
    """The monotonic time (ns) rank ``rank`` recorded when it failed, or None."""
    try:
        return int(failure_path(run_dir, rank).read_text().strip())
    except (OSError, ValueError):
        return None
