"""Progress heartbeat of a rank started by ``accel launch``, read by the launcher's hang watchdog.

Each rank owns one 32-byte file ``rank-{RANK}.hb`` in the folder ``$ACCEL_LAUNCH_RUN_DIR`` (made by the
launcher), mapped into memory as four 64-bit integers: its pid, how many progress points it has passed
(optimizer steps, accel's ``gather``) and how many times it marked itself busy with work of its own
(checkpoint files). :func:`beat` is a counter increment and one store into the mapping (no system
call, no clock read); outside ``accel launch`` it is a single ``None`` check. The launcher polls the
files and keeps, per rank, the time it last saw a counter move.

Progress points must be passed by every rank alike (steps, collectives), so the rank with fewer is
the one behind; work only some ranks do (the main process writing a checkpoint) calls :func:`alive`,
which keeps the job from looking hung without counting as progress.

The launcher declares a hang when no rank has moved for ``--hang_timeout`` seconds, asks every rank
for its Python stack (``faulthandler`` on :data:`STACK_SIGNAL`, written to ``stack-{RANK}.txt``),
names the rank that is behind, and ends the job. Ranks also record the moment they fail
(:func:`record_failure`), so the launcher names the first to fail.
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "RUN_DIR_ENV", "STACK_SIGNAL", "Beat", "active", "alive", "beat", "failure_path", "read", "read_failure",
    "record_failure", "start", "stop",
]

#: the folder the launcher shares with its ranks (heartbeats, stacks, failure times)
RUN_DIR_ENV = "ACCEL_LAUNCH_RUN_DIR"
#: the signal on which a rank writes every thread's Python stack (SIGUSR1 is left to the user, e.g. SLURM requeue)
STACK_SIGNAL = getattr(signal, "SIGUSR2", None)

_RECORD = struct.Struct("<qqqq")  # pid, progress points passed, busy marks, spare
_SIZE = _RECORD.size

_map: mmap.mmap | None = None
_view: memoryview | None = None  # the mapping as int64 slots
#: whether this rank beats (it was started by ``accel launch``): the training step's hot paths test this
#: before calling :func:`beat`, so outside ``accel launch`` a step makes no call at all
active = False
_count = 0
_busy = 0
_stack_file = None


def beat() -> None:
    """Record that this rank passed a progress point (a no-op unless the rank was started by ``accel launch``)."""
    global _count
    if _view is None:
        return
    _count += 1
    _view[1] = _count


def alive() -> None:
    """Record that this rank is busy with work of its own (a checkpoint file written): keeps the job from
    looking hung without counting a progress point, since its peers may not do the same work."""
    global _busy
    if _view is None:
        return
    _busy += 1
    _view[2] = _busy


def _rank() -> str:
    return os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))


def start(run_dir: str | os.PathLike | None = None) -> bool:
    """Create this rank's heartbeat file and stack file in ``run_dir`` (default ``$ACCEL_LAUNCH_RUN_DIR``) and
    register the stack dump on :data:`STACK_SIGNAL`; False (and nothing done) when there is no such folder."""
    global _map, _view, _count, _busy, _stack_file, active
    import faulthandler

    folder = run_dir or os.environ.get(RUN_DIR_ENV)
    if not folder or not os.path.isdir(folder):
        return False
    rank = _rank()
    try:
        failure_path(folder, rank).unlink()  # a failure of an earlier attempt (--max_restarts) is not this one's
    except OSError:
        pass
    fd = os.open(Path(folder) / f"rank-{rank}.hb", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, _SIZE)
        _map = mmap.mmap(fd, _SIZE)
    finally:
        os.close(fd)
    _count = _busy = 0
    _RECORD.pack_into(_map, 0, os.getpid(), 0, 0, 0)
    _view = memoryview(_map).cast("q")
    if STACK_SIGNAL is not None:
        _stack_file = open(Path(folder) / f"stack-{rank}.txt", "w")  # kept open: faulthandler writes to its fd
        faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    active = True
    return True


def stop() -> None:
    """Undo :func:`start`: stop beating, release the mapping and the stack dump (the files stay)."""
    global _map, _view, _stack_file, active
    import faulthandler

    active = False
    if _view is not None:
        _view.release()
        _view = None
    if _map is not None:
        _map.close()
        _map = None
    if _stack_file is not None:
        if STACK_SIGNAL is not None:
            faulthandler.unregister(STACK_SIGNAL)
        _stack_file.close()
        _stack_file = None


@dataclass
class Beat:
    """One rank's heartbeat as the launcher reads it; ``last`` is the launcher's own ``time.monotonic()``
    when it first saw the current counters (set by the launcher; 0.0 from :func:`read`)."""

    rank: int
    pid: int
    count: int
    busy: int
    last: float = 0.0


def read(run_dir: str | os.PathLike) -> dict[int, Beat]:
    """Every rank's heartbeat in ``run_dir``, by global rank."""
    found: dict[int, Beat] = {}
    for path in Path(run_dir).glob("rank-*.hb"):
        try:
            data = path.read_bytes()
            rank = int(path.stem.split("-", 1)[1])
        except (OSError, ValueError):
            continue
        if len(data) >= _RECORD.size:
            pid, count, busy, _ = _RECORD.unpack_from(data, 0)
            found[rank] = Beat(rank, pid, count, busy)
    return found


def failure_path(run_dir: str | os.PathLike, rank: int | str) -> Path:
    """Where rank ``rank`` records the moment it failed."""
    return Path(run_dir) / f"failed-{rank}"


def record_failure() -> None:
    """Write the monotonic time of this rank's failure (ns; CLOCK_MONOTONIC is system-wide, so the
    launcher compares ranks on one machine) for the launcher, which names the earliest."""
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
