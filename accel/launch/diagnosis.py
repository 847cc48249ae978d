"""Who is to blame when a job started by ``accel launch`` fails or hangs: evidence and the rules that judge it.

The launcher gathers evidence about every rank of its node (:class:`RankEvidence`) and, on several
nodes, swaps it with the other launchers through the rendezvous store
(:class:`accel.launch.nodes.NodeExchange`), so every node judges the same evidence with the
same rule and prints the same verdict.

Evidence of a failure, per rank: its exit status (a signal included), the moment it recorded its own
failure (ranks write it before they exit), and the last moment the launcher saw it running
(:class:`ChildWatch` polls the ranks' processes; one that has begun to exit counts as gone, since
its sockets close -- and its peers fail -- while it is still listed). Rule (:func:`blame_failure`): the rank whose failure
came first wins, where a rank that recorded nothing (killed by a signal, or gone without raising)
counts from the last moment it was seen running -- it died after that, and a peer that failed because
of it can only have failed later. A rank ended by the launcher's own stop signal (SIGTERM) with no
record of its own comes after every other failure.

Evidence of a hang, per rank: its progress points, whether it answered the request for its Python
stack, its state read from the OS (``/proc/<pid>/stat``: ``T`` stopped, ``D`` uninterruptible), and
whether its stack shows it waiting for its peers. Rule (:func:`blame_hang`): a rank that is alive but
did not answer is the hung one (stopped ranks first); else the rank that is behind (fewest progress
points; among equals one not waiting in a collective; then the oldest progress; then the lowest rank).

Times that cross nodes are wall-clock seconds (``time.time()``); on one host every node shares one clock,
across hosts the comparison is as good as their clock synchronisation, so with several nodes a rank
killed by a signal is favoured by :data:`CLOCK_SKEW_MARGIN`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from accel.launch import heartbeat

__all__ = [
    "CLOCK_SKEW_MARGIN",
    "EVIDENCE_WAIT",
    "STACK_CHARS",
    "ChildWatch",
    "RankEvidence",
    "blame_failure",
    "blame_hang",
    "failure_order",
    "describe_state",
    "make_run_dir",
    "proc_state",
    "remove_orphaned_run_dirs",
    "signal_name",
    "waiting_in_collective",
]

#: seconds a launcher waits for the other nodes' evidence before judging its own alone (a dead node
#: must not hang the launcher); generous because the other nodes first collect their ranks' stacks
EVIDENCE_WAIT = 30.0
#: seconds by which a rank killed by a signal is favoured when the evidence comes from several nodes:
#: their wall clocks disagree a little (NTP keeps hosts within milliseconds of each other)
CLOCK_SKEW_MARGIN = 0.25
#: the signal torch elastic stops surviving ranks with once one rank failed
STOP_SIGNAL = "SIGTERM"
#: prefix of the launcher's private folders in the temporary directory, and the owner file inside
RUN_DIR_PREFIX = "accel_run_"
OWNER_FILE = "owner.pid"
#: characters of a rank's stack kept in its evidence (faulthandler writes the most recent call first)
STACK_CHARS = 20_000


# ---------------------------------------------------------------------------------------------- processes
def proc_state(pid: int) -> str | None:
    """The one-letter state of process ``pid`` from ``/proc/<pid>/stat`` (``R``, ``S``, ``D``, ``T``, ``Z``,
    ...), or None when the process is gone. Where there is no /proc, ``S`` for a live process."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:
        pass
    return "S"


_PF_EXITING = 0x4  # the kernel's per-task flag, set as a process starts to exit (before its sockets close)


def _running(pid: int) -> bool:
    """Whether ``pid`` is alive and not exiting: a process killed by a signal closes its sockets (its peers
    see "connection reset") while still listed, so an exiting process counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return fields[0] not in ("Z", "X", "x") and not int(fields[6]) & _PF_EXITING
    except FileNotFoundError:
        return False
    except (OSError, IndexError, ValueError):
        return proc_state(pid) is not None


def describe_state(state: str | None) -> str:
    """Words for a process state: how a rank that did not answer is shown (never "exited" while alive)."""
    if state is None or state in ("Z", "X", "x"):
        return "exited"
    if state in ("T", "t"):
        return "stopped (SIGSTOP?)"
    if state == "D":
        return "not responding (uninterruptible: stuck in the kernel or a driver call)"
    return "not responding"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a reused pid from the original)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@dataclass
class _Seen:
    pid: int
    last_alive: float | None = None
    died_at: float | None = None


class ChildWatch:
    """A thread that watches the ranks' processes (pids from their heartbeat files) and keeps, per rank,
    the last wall-clock moment it was seen running and the first moment it was seen gone.

    A rank killed by a signal cannot record its own failure; the launcher's observation gives it a time.
    """

    def __init__(self, run_dir: str, poll: float = 0.05):
        self.run_dir = run_dir
        self.poll = poll
        self._seen: dict[int, _Seen] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="accel-child-watch", daemon=True)

    def start(self) -> None:
        """Start watching (a daemon thread)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _rescan(self) -> None:
        for rank, beat in heartbeat.read(self.run_dir).items():
            with self._lock:
                old = self._seen.get(rank)
                if old is None or old.pid != beat.pid:  # a new rank, or a restarted attempt
                    self._seen[rank] = _Seen(beat.pid)

    def _run(self) -> None:
        next_scan = 0.0
        while not self._stop.is_set():
            now_mono = time.monotonic()
            if now_mono >= next_scan:
                self._rescan()
                next_scan = now_mono + 0.5
            with self._lock:
                items = list(self._seen.values())
            for seen in items:
                if seen.died_at is not None:
                    continue
                now = time.time()
                if not _running(seen.pid):
                    seen.died_at = now
                    next_scan = 0.0  # a restart may bring new pids
                else:
                    seen.last_alive = now
            self._stop.wait(self.poll)

    def seen(self, rank: int) -> tuple[float | None, float | None]:
        """(last moment seen running, first moment seen gone) of ``rank``, wall-clock seconds."""
        self._rescan()
        with self._lock:
            s = self._seen.get(rank)
            return (s.last_alive, s.died_at) if s else (None, None)


# ---------------------------------------------------------------------------------------------- evidence
@dataclass
class RankEvidence:
    """What one launcher knows about one of its ranks when a job failed or hung (JSON-safe, for the store)."""

    rank: int
    node: int
    pid: int | None = None
    local_rank: int | None = None
    #: exit status as torch elastic reports it (negative: killed by that signal); None: still running
    exitcode: int | None = None
    signal: str | None = None
    #: wall-clock moment the rank recorded its own failure (None: it recorded nothing)
    failed_at: float | None = None
    #: wall-clock moment the launcher last saw it running / first saw it gone
    last_alive: float | None = None
    died_at: float | None = None
    #: the agent's timestamp of the failure (whole seconds), the last resort for ordering
    agent_time: float | None = None
    message: str | None = None
    traceback: list[str] = field(default_factory=list)
    # ---- hang evidence
    count: int | None = None
    idle: float | None = None  # seconds since its last progress point
    state: str | None = None  # /proc state letter, None when gone
    answered: bool | None = None  # wrote its stack when asked
    stack: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The evidence as a plain dict (published in the store as JSON)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RankEvidence":
        """Evidence read back from another node (unknown keys, from a newer launcher, are left out)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def alive(self) -> bool:
        """Whether the process was still there (running, sleeping, stopped) when the evidence was taken."""
        return self.state is not None and self.state not in ("Z", "X", "x")

    @property
    def in_collective(self) -> bool:
        """Whether its stack shows it waiting for its peers (:func:`waiting_in_collective`)."""
        return waiting_in_collective(self.stack)


def _failure_key(e: RankEvidence, margin: float = 0.0) -> tuple[int, float, int]:
    stopped_by_us = e.failed_at is None and e.signal == STOP_SIGNAL
    when = next((t for t in (e.failed_at, e.last_alive, e.agent_time) if t is not None), float("inf"))
    if margin and e.failed_at is None and e.signal and not stopped_by_us:
        when -= margin  # killed by a signal: favoured by the clock margin between hosts
    return (1 if stopped_by_us else 0, when, e.rank)


def failure_order(evidence: Iterable[RankEvidence]) -> list[RankEvidence]:
    """The failed ranks in the order their failures came (see the module's rule): the first is to blame.
    With evidence from several nodes, a rank killed by a signal (no record of its own) is favoured by
    :data:`CLOCK_SKEW_MARGIN` seconds, since the wall clocks of different hosts disagree a little."""
    failed = list(evidence)
    margin = CLOCK_SKEW_MARGIN if len({e.node for e in failed}) > 1 else 0.0
    return sorted(failed, key=lambda e: _failure_key(e, margin))


def blame_failure(evidence: Iterable[RankEvidence]) -> RankEvidence:
    """The rank whose failure came first (:func:`failure_order`); ``evidence`` lists the failed ranks."""
    ordered = failure_order(evidence)
    if not ordered:
        raise ValueError("blame_failure needs at least one failed rank")
    return ordered[0]


_STATE_ORDER = {"T": 0, "t": 0, "D": 1}


def blame_hang(evidence: Iterable[RankEvidence]) -> tuple[RankEvidence, str]:
    """(the rank a hang is blamed on, why): an alive rank that did not answer first, else the one behind."""
    ranks = list(evidence)
    if not ranks:
        raise ValueError("blame_hang needs at least one rank")
    silent = [e for e in ranks if e.alive and not e.answered]
    if silent:
        e = min(silent, key=lambda e: (_STATE_ORDER.get(e.state or "", 2), e.count or 0, e.rank))
        return e, f"it is {describe_state(e.state)} and did not answer the request for its stack"
    counted = [e for e in ranks if e.count is not None] or ranks
    least = min(e.count or 0 for e in counted)
    behind = [e for e in counted if (e.count or 0) == least]
    outside = [e for e in behind if not e.in_collective]
    e = min(outside or behind, key=lambda e: (-(e.idle or 0.0), e.rank))
    others = ", ".join(f"rank {o.rank}: {o.count}" for o in sorted(counted, key=lambda o: o.rank) if o.rank != e.rank)
    why = f"rank {e.rank} is behind: {e.count} progress point(s), last {e.idle or 0:.0f} s ago" + (f" (others: {others})" if others else "")
    return e, why


# ---------------------------------------------------------------------------------------------- stacks
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+ in (?P<func>\S+)')
_COLLECTIVE_TOP = tuple(p.replace("/", os.sep) for p in ("/torch/distributed/", "/torch/autograd/", "/torch/nn/parallel/distributed.py"))


def _threads(stack: str) -> list[list[tuple[str, str]]]:
    """Each thread's frames (file, function), innermost first, from a faulthandler dump."""
    threads: list[list[tuple[str, str]]] = []
    for line in stack.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append([])
            continue
        match = _FRAME.match(line)
        if match and threads:
            threads[-1].append((match.group("file"), match.group("func")))
    return threads


def waiting_in_collective(stack: str | None) -> bool:
    """Whether a rank's stack shows it waiting for its peers: a thread whose innermost frame is in
    torch.distributed, in autograd's engine (a backward blocked in DDP's gradient allreduce, which runs
    in C++ hooks under ``Variable._execution_engine``) or in DDP's module, or any frame of c10d."""
    if not stack:
        return False
    for frames in _threads(stack):
        if not frames:
            continue
        if any(part in frames[0][0] for part in _COLLECTIVE_TOP):
            return True
        if any(os.path.basename(path) == "distributed_c10d.py" for path, _ in frames):
            return True
    return False


# ---------------------------------------------------------------------------------------------- private folders
def _owner_alive(folder: Path) -> bool:
    try:
        pid_text, _, started = (folder / OWNER_FILE).read_text().strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return True  # no readable owner: not ours to judge
    if proc_state(pid) in (None, "Z"):
        return False
    return not started or _start_time(pid) in (None, started)


def remove_orphaned_run_dirs(parent: str | None = None) -> list[str]:
    """Remove the private folders of launchers that died without cleaning up (SIGKILL, out of memory):
    folders named :data:`RUN_DIR_PREFIX`... of this user whose owner file names a process that is gone.
    Returns the folders removed."""
    base = Path(parent or tempfile.gettempdir())
    removed = []
    uid = os.getuid() if hasattr(os, "getuid") else None
    for folder in base.glob(RUN_DIR_PREFIX + "*"):
        try:
            if not folder.is_dir() or folder.is_symlink() or (uid is not None and folder.stat().st_uid != uid):
                continue
        except OSError:
            continue
        if not _owner_alive(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def make_run_dir() -> str:
    """A new private folder for this launcher, with an owner file (pid and start time) that lets a later
    launcher remove it if this one is killed before it cleans up."""
    folder = tempfile.mkdtemp(prefix=RUN_DIR_PREFIX)
    started = _start_time(os.getpid()) or ""
    (Path(folder) / OWNER_FILE).write_text(f"{os.getpid()} {started}".strip())
    return folder


def signal_name(exitcode: int | None) -> str | None:
    """``SIGKILL`` for exit status -9 (torch elastic's convention for a death by signal); else None."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"
