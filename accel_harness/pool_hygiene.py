"""Rank-pool hygiene: what a test leaves behind in a rank, found and undone at a cost that does not grow with the host.

Used by :mod:`accel_harness.distributed` on the rank side and when a pool closes:

- **processes.** On Linux each rank is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a
  grandchild whose parent exits (a double fork, ``cmd &`` in a shell) is re-parented to the rank
  instead of escaping to init, and the rank finds its processes by reading its own subtree in
  ``/proc`` (``task/*/children``) instead of scanning every process on the host
  (:class:`ChildWatch`). Processes a test leaves running are ended (SIGTERM, then SIGKILL, waited
  for on pidfds) and named; ones that ended without being waited for are reaped silently.
- **state** (:mod:`accel_harness.rank_state`). :class:`RankBaseline` keeps what a rank looked like
  before its first test (default dtype and device, grad and deterministic modes, the torch, Python
  and NumPy random generators, the environment variables, the working directory) and puts back
  only what a test changed.
- **folders** (:mod:`accel_harness.pool_dirs`). Each pool folder (``accel-pool-*`` in the temp dir)
  records its owner; folders whose owner is gone (a session killed with SIGKILL cannot clean up)
  are removed when the next pool starts.

The processes are this module's own; the state and folder names stay importable from here.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from accel.launch.lifetime import PR_SET_CHILD_SUBREAPER, prctl

from .pool_dirs import POOL_DIR_PREFIX, remove_stale_pool_dirs, write_owner  # noqa: F401
from .rank_state import EnvironSnapshot, NumpyGlobalRng, RankBaseline  # noqa: F401


def _read_proc(path: str) -> bytes:
    """The whole of a small ``/proc`` file, read with bare system calls (no buffered file object)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        chunks = [os.read(fd, 4096)]
        while len(chunks[-1]) == 4096:  # /proc files come in pages: read until a short one
            chunks.append(os.read(fd, 4096))
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_children_file(path: str) -> list[int]:
    """The pids listed in one thread's ``/proc/<pid>/task/<tid>/children``."""
    return [int(pid) for pid in _read_proc(path).split()]


def _proc_children_supported() -> bool:
    """Whether this kernel lists each thread's children in ``/proc/<pid>/task/<tid>/children``."""
    try:
        _read_children_file(f"/proc/self/task/{os.getpid()}/children")
        return True
    except (OSError, ValueError):
        return False


_PROC_CHILDREN = sys.platform.startswith("linux") and _proc_children_supported()


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of ``pid`` from ``/proc/<pid>/stat``; None when it is gone."""
    try:
        data = _read_proc(f"/proc/{pid}/stat")
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()  # the command name may hold spaces and brackets
    return fields[0].decode(), int(fields[19])  # fields 3 (state) and 22 (starttime) of proc(5)


def _subtree(roots: list[int]) -> dict[int, tuple[str, int]]:
    """Every process below ``roots`` with its (state, start time), read from the roots' own ``/proc`` entries.

    Costs a few file reads per process in the subtree, whatever else runs on the host."""
    found: dict[int, tuple[str, int]] = {}
    _walk(list(roots), found)
    return found


def _walk(todo: list[int], found: dict[int, tuple[str, int]], skip_first: bool = False) -> None:
    """Add to ``found`` every process below the pids in ``todo`` (and, unless ``skip_first``, those pids' children)."""
    if skip_first:  # ``todo`` holds children already listed: note them, then go below them
        for child in list(todo):
            info = _stat(child)
            if info is None:
                todo.remove(child)
            else:
                found[child] = info
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                children = _read_children_file(f"/proc/{pid}/task/{tid}/children")
            except OSError:  # the thread ended meanwhile
                continue
            for child in children:
                if child in found:
                    continue
                info = _stat(child)
                if info is not None:
                    found[child] = info
                    todo.append(child)


class _OwnChildrenFiles:
    """This process's ``/proc/<pid>/task/<tid>/children`` files, kept open and re-read with one ``pread`` each.

    Opening, reading and closing each thread's file on every test costs three system calls and a
    path lookup per thread; a kept file re-reads in one. Each file is remembered with its device and
    inode, so one that a test closed (and whose number now names another file) is opened again
    instead of being read."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.files: dict[str, tuple[int, int, int]] = {}  # tid -> (fd, st_dev, st_ino)

    def children(self) -> list[int]:
        """The pids of this process's children (of every one of its threads)."""
        tids = os.listdir(f"/proc/{self.pid}/task")
        found: list[int] = []
        for tid in tids:
            found.extend(int(pid) for pid in self._read(tid).split())
        for tid in set(self.files).difference(tids):  # threads that ended
            self._forget(tid)
        return found

    def _read(self, tid: str) -> bytes:
        entry = self.files.get(tid)
        if entry is not None:
            if self._still_ours(entry):
                try:
                    return _pread_all(entry[0])
                except OSError:
                    pass
            self._forget(tid)
        try:
            fd = os.open(f"/proc/{self.pid}/task/{tid}/children", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:  # the thread ended meanwhile
            return b""
        stat = os.fstat(fd)
        self.files[tid] = (fd, stat.st_dev, stat.st_ino)
        try:
            return _pread_all(fd)
        except OSError:
            self._forget(tid)
            return b""

    @staticmethod
    def _still_ours(entry: tuple[int, int, int]) -> bool:
        fd, dev, ino = entry
        try:
            stat = os.fstat(fd)
        except OSError:
            return False
        return (stat.st_dev, stat.st_ino) == (dev, ino)

    def _forget(self, tid: str) -> None:
        entry = self.files.pop(tid, None)
        if entry is not None and self._still_ours(entry):  # a number the test reused is not ours to close
            os.close(entry[0])

    def close(self) -> None:
        """Close every kept file."""
        for tid in list(self.files):
            self._forget(tid)


def _pread_all(fd: int) -> bytes:
    """The whole content of a ``/proc`` file from its start, through an open descriptor."""
    chunks = [os.pread(fd, 4096, 0)]
    while len(chunks[-1]) == 4096:  # a long list: read on (the kernel makes the list again, from the offset)
        chunks.append(os.pread(fd, 4096, 4096 * len(chunks)))
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def descendants(pids: list[int]) -> dict[int, int]:
    """pid -> start time of the processes below ``pids`` (collected before they die and their children are re-parented)."""
    if _PROC_CHILDREN:
        return {pid: info[1] for pid, info in _subtree(pids).items()}
    try:
        import psutil
    except ImportError:
        return {}
    found = {}
    for pid in pids:
        try:
            for child in psutil.Process(pid).children(recursive=True):
                found[child.pid] = child.create_time()
        except Exception:
            pass
    return found


def _describe(pid: int) -> str:
    """``pid N: command line`` of a live process (its name when the command line is empty)."""
    command = ""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            command = fh.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
        if not command:
            with open(f"/proc/{pid}/comm", "rb") as fh:
                command = fh.read().strip().decode(errors="replace")
    except OSError:
        try:
            import psutil

            proc = psutil.Process(pid)
            command = " ".join(proc.cmdline()) or proc.name()
        except Exception:
            pass
    return f"pid {pid}: {(command or '?')[:200]}"


def _same_process(pid: int, started: Any) -> bool:
    """Whether ``pid`` is still the process first seen with start time ``started`` (not a reused pid)."""
    if _PROC_CHILDREN:
        info = _stat(pid)
        return info is not None and info[1] == started
    try:
        import psutil

        return psutil.Process(pid).create_time() == started
    except Exception:
        return False


def end_processes(procs: dict[int, Any], grace: float = 1.0) -> None:
    """Terminate the processes ``pid -> start time``, give them ``grace`` seconds, then kill what is left.

    Waits on a pidfd per process (no polling), so a process that is not this one's child can be
    waited for too; then reaps the ones that are (or became, as a subreaper's orphans) its children."""
    if not procs:
        return
    if not hasattr(os, "pidfd_open"):
        _end_processes_psutil(list(procs), grace)
        return
    import select

    fds: dict[int, int] = {}
    try:
        for pid, started in procs.items():
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:  # already gone
                continue
            except OSError:  # no pidfds in this kernel (or refused): the portable way, for all of them
                for opened in fds.values():
                    os.close(opened)
                fds = {}
                _end_processes_psutil(list(procs), grace)
                return
            if _same_process(pid, started):  # checked after opening: the fd now pins this very process
                fds[pid] = fd
            else:
                os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for fd in fds.values():
                try:
                    signal.pidfd_send_signal(fd, sig)
                except OSError:
                    pass
            poller = select.poll()
            for fd in fds.values():
                poller.register(fd, select.POLLIN)
            pending, deadline = set(fds.values()), time.monotonic() + grace
            while pending and (remaining := deadline - time.monotonic()) > 0:
                for fd, _ in poller.poll(remaining * 1000):
                    pending.discard(fd)
                    poller.unregister(fd)
            if not pending:
                break
            for pid, fd in list(fds.items()):
                if fd not in pending:  # ended: done with it
                    os.close(fds.pop(pid))
    finally:
        for fd in fds.values():
            os.close(fd)
    for pid in procs:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not ours to reap
            pass


def _end_processes_psutil(pids: list[int], grace: float) -> None:
    """:func:`end_processes` where pidfds are missing (not Linux, or an old kernel)."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except Exception:
            pass
    for proc in procs:
        try:
            proc.terminate()
        except Exception:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except Exception:
            pass
    psutil.wait_procs(alive, timeout=grace)


class ChildWatch:
    """The processes below this rank, and the ones a test left behind.

    The set of processes seen after the previous test (after its leftovers were ended) is the
    "before" of the next one, so each test costs one look at the subtree."""

    def __init__(self) -> None:
        # orphaned grandchildren come to this rank instead of init, where the subtree walk sees them
        self.subreaper = _PROC_CHILDREN and prctl(PR_SET_CHILD_SUBREAPER, 1)
        self.own = _OwnChildrenFiles() if _PROC_CHILDREN else None
        self.known = self._look()

    def _look(self) -> dict[int, tuple[str, Any]]:
        """pid -> (state, start time) of every process below this rank."""
        if self.own is not None:
            if self.own.pid != os.getpid():  # used in a forked copy of the rank: its own files
                self.own.files.clear()  # the parent's descriptors (inherited) are the parent's to close
                self.own = _OwnChildrenFiles()
            found: dict[int, tuple[str, int]] = {}
            _walk(self.own.children(), found, skip_first=True)
            return found
        import psutil

        found = {}
        for child in psutil.Process().children(recursive=True):
            try:
                found[child.pid] = ("Z" if child.status() == psutil.STATUS_ZOMBIE else "R", child.create_time())
            except Exception:
                pass
        return found

    def end_leftovers(self) -> list[str]:
        """Kill the processes started during the test that still run and describe them; reap those that ended."""
        now = self._look()
        keep = _multiprocessing_helpers()
        new = {pid: info for pid, info in now.items()
               if pid not in keep and (pid not in self.known or self.known[pid][1] != info[1])}
        described: list[str] = []
        if new:
            running = {pid: info[1] for pid, info in new.items() if info[0] != "Z"}
            described = [_describe(pid) for pid in running]
            end_processes(running)
            multiprocessing = sys.modules.get("multiprocessing")
            if multiprocessing is not None:
                multiprocessing.active_children()  # multiprocessing reaps its own ended children, keeping their exit codes
            for pid, info in new.items():
                if info[0] == "Z":  # ended without being waited for (or an orphan that came to this subreaper)
                    try:
                        os.waitpid(pid, os.WNOHANG)
                    except ChildProcessError:
                        pass
            now = self._look()
            left = [pid for pid, info in now.items()
                    if pid not in keep and pid not in self.known and pid not in new and info[0] != "Z"]
            if left:  # started while the others were being ended (a parent restarting its child)
                described += [_describe(pid) for pid in left]
                end_processes({pid: now[pid][1] for pid in left})
                now = self._look()
        self.known = now
        return described


def _multiprocessing_helpers() -> set[int]:
    """multiprocessing's own long-lived helpers (resource tracker, fork server): not a test's leftovers."""
    pids = set()
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    pid = getattr(getattr(tracker, "_resource_tracker", None), "_pid", None)
    if pid:
        pids.add(pid)
    forkserver = sys.modules.get("multiprocessing.forkserver")
    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if pid:
        pids.add(pid)
    return pids
