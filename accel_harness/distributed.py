"""A pool of ranks per (backend, world size) that runs test bodies inside a live process group.

Starting a process group costs about a second; a trivial collective costs a few milliseconds. So
ranks are started once per (backend, world size), join a process group on the backend's collective
backend, and then run test after test. The controller (the pytest process) sends each rank the
test function and its arguments and waits on all ranks' pipes and process sentinels at once, so:

- the first failing rank ends the test at once with that rank's traceback;
- a crashed rank (segfault, ``os._exit``) is reported with its exit code;
- a hang ends at the timeout with every rank's Python stack (faulthandler on SIGUSR1);
- after any of these the pool is torn down and rebuilt for the next test;
- ranks die with the controller (PR_SET_PDEATHSIG on Linux, EOF on their pipe otherwise).

Hygiene between the tests a pool runs, at a cost that does not grow with the host's process count:

- processes a test starts and leaves running are killed after it, and the test gets a
  ``LeftoverProcessWarning`` naming them (a warning, not a failure: the test's own result stands);
  a rank's remaining descendants are killed with it when the pool closes. On Linux each rank is a
  child subreaper, so a grandchild whose parent exits (a double fork, ``cmd &`` in a shell) is
  re-parented to the rank instead of escaping to init, and the rank finds its processes by reading
  its own subtree in ``/proc`` (``task/*/children``) instead of scanning every process on the host;
  children that ended without being waited for are reaped, not reported;
- before each test a rank gets back the state it started with: the default dtype and device,
  grad mode, deterministic-algorithms mode, the Python / NumPy / torch (host and the rank's device)
  random generators, the environment variables and the working directory. Each piece is compared
  with the baseline first and set again only when a test changed it, except the random generators,
  whose state is cheaper to put back than to compare;
- a rank that crashes on a fatal signal (segfault, abort) is reported with its faulthandler stack;
- each pool folder (``accel-pool-*`` under the temp dir) records its owner; folders whose owner
  is gone (a session killed with SIGKILL cannot clean up) are removed when the next pool starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

# kwargs the rank resolves itself instead of receiving them from the controller
RANK_LOCAL_ARGS = ("backend", "device", "rank", "world_size")

STACK_GRACE_S = 1.0  # time ranks get to write their stacks after SIGUSR1
PEER_DEATH_GRACE_S = 0.2  # a collective error right after a peer died is reported as that death
PEER_DEATH_ECHO_GRACE_S = 3.0  # ... and longer when the error itself says the peer went away
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "ProcessGroupNCCL is aborted",
              "gloo/transport", "Connection refused", "connection closed", "NCCL communicator was aborted")


@dataclass
class Task:
    """What a rank runs: a test function named by module and qualified name, with pickled kwargs."""

    module: str
    module_file: str | None
    qualname: str
    kwargs: bytes


@dataclass
class RankOutcome:
    rank: int
    status: str  # passed | failed | skipped | xfailed
    message: str = ""
    traceback: str = ""
    duration: float = 0.0
    #: processes the test left running (killed after it): "pid name: command line"
    leftovers: list[str] = field(default_factory=list)


@dataclass
class PoolResult:
    """The outcome of one test over all ranks."""

    status: str  # passed | failed | skipped | xfailed | crashed | timeout
    message: str = ""
    rank: int | None = None
    outcomes: list[RankOutcome] = field(default_factory=list)
    stacks: dict[int, str] = field(default_factory=dict)
    exitcode: int | None = None

    @property
    def leftovers(self) -> dict[int, list[str]]:
        """Per rank, the processes the test left running (they have been killed)."""
        return {o.rank: o.leftovers for o in self.outcomes if o.leftovers}


class PoolStartError(RuntimeError):
    """The ranks could not form a process group."""


class RankPool:
    """``world_size`` ranks of ``backend_name`` in one process group, reused across tests."""

    def __init__(self, backend_name: str, world_size: int, start_method: str, timeout: float,
                 env: dict[str, str] | None = None, start_timeout: float = 60.0):
        self.backend_name = backend_name
        self.world_size = world_size
        self.start_method = start_method
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.env = dict(env or {})
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self.tmpdir: str | None = None
        self.healthy = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        import multiprocessing as mp

        ctx = mp.get_context(self.start_method)
        remove_stale_pool_dirs()
        self.tmpdir = tempfile.mkdtemp(prefix=f"{POOL_DIR_PREFIX}{self.backend_name}-{self.world_size}-")
        _write_owner(self.tmpdir)
        store = os.path.join(self.tmpdir, "store")
        for rank in range(self.world_size):
            parent, child = ctx.Pipe()
            stack_file = os.path.join(self.tmpdir, f"stack-{rank}.txt")
            proc = ctx.Process(
                target=_rank_main,
                args=(rank, self.world_size, self.backend_name, store, child, stack_file, self.env, list(sys.path)),
                daemon=True,
                name=f"accel-rank-{self.backend_name}-{rank}/{self.world_size}",
            )
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        deadline = time.monotonic() + self.start_timeout
        ready: set[int] = set()
        while len(ready) < self.world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close(kill=True)
                raise PoolStartError(f"{self.world_size} {self.backend_name} ranks did not form a process group within {self.start_timeout:.0f}s")
            for obj in wait(self._waitables(), timeout=remaining):
                rank = self._rank_of(obj)
                if obj is self.procs[rank].sentinel:
                    code = self.procs[rank].exitcode
                    self.close(kill=True)
                    raise PoolStartError(f"rank {rank} of {self.backend_name} x{self.world_size} exited with code {code} while starting")
                message = self.conns[rank].recv()
                if message[0] == "ready":
                    ready.add(rank)
                else:
                    self.close(kill=True)
                    raise PoolStartError(f"rank {rank} failed to join the process group:\n{message[1]}")
        self.healthy = True

    def close(self, kill: bool = False) -> None:
        """Stop the ranks (politely unless ``kill``) and remove the rendezvous folder."""
        self.healthy = False
        if not kill:
            for conn in self.conns:
                try:
                    conn.send(("stop",))
                except (OSError, ValueError):
                    pass
            for proc in self.procs:
                proc.join(timeout=2)
        descendants = _descendants([p.pid for p in self.procs if p.is_alive()])
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        _end_processes(descendants)
        for proc in self.procs:
            proc.join(timeout=5)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def _waitables(self) -> list[Any]:
        return [*self.conns, *(p.sentinel for p in self.procs)]

    def _rank_of(self, obj: Any) -> int:
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs)):
            if obj is conn or obj is proc.sentinel:
                return rank
        raise KeyError(obj)

    # ------------------------------------------------------------------ running one test
    def run(self, task: Task, timeout: float | None = None) -> PoolResult:
        """Run ``task`` on every rank; return as soon as the outcome is known."""
        timeout = self.timeout if timeout is None else timeout
        for conn in self.conns:
            conn.send(("run", task))
        deadline = time.monotonic() + timeout
        outcomes: dict[int, RankOutcome] = {}
        while len(outcomes) < self.world_size:
            remaining = deadline - time.monotonic()
            ready = wait(self._waitables(), timeout=max(remaining, 0)) if remaining > 0 else []
            if not ready:
                return self._hang(outcomes, timeout)
            for obj in ready:
                rank = self._rank_of(obj)
                if rank in outcomes:
                    continue
                if obj is self.procs[rank].sentinel:
                    if self.conns[rank].poll():  # it sent its outcome, then died: read that first
                        continue
                    return self._crashed(rank, outcomes)
                try:
                    outcome: RankOutcome = self.conns[rank].recv()
                except (EOFError, OSError):
                    # its end of the pipe is gone: the rank died (the pipe can report it before the sentinel)
                    return self._crashed(rank, outcomes)
                outcomes[rank] = outcome
                if outcome.status == "failed":
                    # fail fast: other ranks may be blocked in a collective that will never complete
                    if len(outcomes) < self.world_size:
                        crashed = self._crashed_peer(outcomes, outcome)
                        stacks = self._crash_stacks([crashed[0]]) if crashed is not None else {}
                        self.close(kill=True)
                        if crashed is not None:  # this failure is the echo of a peer's death
                            peer, code = crashed
                            return PoolResult("crashed", f"rank {peer} died with exit code {code}{_signal_name(code)}",
                                              rank=peer, outcomes=list(outcomes.values()), exitcode=code, stacks=stacks)
                    return PoolResult("failed", outcome.message, rank=rank, outcomes=list(outcomes.values()))
        ordered = [outcomes[r] for r in range(self.world_size)]
        for status in ("xfailed", "skipped"):
            hit = next((o for o in ordered if o.status == status), None)
            if hit is not None:
                return PoolResult(status, hit.message, rank=hit.rank, outcomes=ordered)
        return PoolResult("passed", outcomes=ordered)

    def _crashed_peer(self, outcomes: dict[int, RankOutcome], failure: RankOutcome) -> tuple[int, int | None] | None:
        """A rank without an outcome that has died (or dies within a moment), with its exit code.

        A failure that reads like a lost connection is most likely the echo of a peer's death, which
        the kernel may report a little before the dying process can be reaped: wait longer then."""
        pending = [r for r in range(self.world_size) if r not in outcomes]
        echo = any(p in failure.message or p in failure.traceback for p in _PEER_LOST)
        grace = PEER_DEATH_ECHO_GRACE_S if echo else PEER_DEATH_GRACE_S
        wait([self.procs[r].sentinel for r in pending], timeout=grace)
        for r in pending:
            proc = self.procs[r]
            if not proc.is_alive() or self._pipe_closed(r) or _gone(proc.pid):
                proc.join(timeout=grace)  # a closed pipe means it is exiting: wait for its status
                return r, proc.exitcode
        return None

    def _crashed(self, rank: int, outcomes: dict[int, RankOutcome]) -> PoolResult:
        self.procs[rank].join(timeout=5)  # the sentinel or EOF comes before the exit code is known
        code = self.procs[rank].exitcode
        stacks = self._crash_stacks([rank])
        self.close(kill=True)
        return PoolResult("crashed", f"rank {rank} died with exit code {code}{_signal_name(code)}",
                          rank=rank, outcomes=list(outcomes.values()), exitcode=code, stacks=stacks)

    def _crash_stacks(self, ranks: list[int]) -> dict[int, str]:
        """The faulthandler stack each crashed rank wrote on its fatal signal (read before the folder goes)."""
        stacks = {}
        for rank in ranks:
            text = ""
            if self.tmpdir:
                try:
                    with open(os.path.join(self.tmpdir, f"stack-{rank}.txt"), errors="replace") as fh:
                        text = fh.read()
                except OSError:
                    pass
            head = text.rfind("Fatal Python error")
            stacks[rank] = text[head:].rstrip() if head >= 0 else "(no stack: the rank ended without a fatal signal, e.g. os._exit or SIGKILL)"
        return stacks

    def _pipe_closed(self, rank: int) -> bool:
        """True when ``rank``'s end of its pipe is gone (the process is exiting or has exited)."""
        conn = self.conns[rank]
        try:
            if not conn.poll():
                return False
            conn.recv()  # a late outcome: the rank is alive and talking
            return False
        except (EOFError, OSError):
            return True

    def _hang(self, outcomes: dict[int, RankOutcome], timeout: float) -> PoolResult:
        stuck = [r for r in range(self.world_size) if r not in outcomes]
        stacks: dict[int, str] = {}
        if self.tmpdir and hasattr(signal, "SIGUSR1"):
            for rank, proc in enumerate(self.procs):
                if proc.is_alive():
                    try:
                        os.kill(proc.pid, signal.SIGUSR1)
                    except OSError:
                        pass
            time.sleep(STACK_GRACE_S)
            for rank in range(self.world_size):
                path = os.path.join(self.tmpdir, f"stack-{rank}.txt")
                try:
                    with open(path) as fh:
                        stacks[rank] = _last_dump(fh.read())
                except OSError:
                    stacks[rank] = "(no stack written)"
        self.close(kill=True)
        return PoolResult("timeout", f"ranks {stuck} did not finish within {timeout:g}s", outcomes=list(outcomes.values()), stacks=stacks)


def _gone(pid: int | None) -> bool:
    """Dead or a zombie, asked of the OS (``is_alive`` cannot tell once someone else reaped it)."""
    try:
        import psutil

        return pid is None or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except Exception:  # NoSuchProcess: gone
        return True


def _signal_name(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f" ({signal.Signals(-code).name})"
        except ValueError:
            return ""
    return ""


def _last_dump(text: str) -> str:
    """faulthandler appends; keep only the most recent dump."""
    marker = "Thread 0x" if "Thread 0x" in text else "Current thread"
    head = text.find(marker)
    return text[head:] if head >= 0 else text


POOL_DIR_PREFIX = "accel-pool-"
_OWNER_FILE = "owner"
#: a pool folder without an owner file (written by an older harness) is stale after this long
_LEGACY_STALE_S = 3600.0


def _process_start(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def _write_owner(folder: str) -> None:
    """Record which process owns a pool folder (pid and its start time, so a reused pid is not mistaken).

    Written to a side file and renamed into place, so another session never reads half a record."""
    path = os.path.join(folder, _OWNER_FILE)
    with open(path + ".tmp", "w") as fh:
        fh.write(f"{os.getpid()} {_process_start(os.getpid())!r}\n")
    os.replace(path + ".tmp", path)


def _young(folder: str) -> bool:
    try:
        return time.time() - os.stat(folder).st_mtime < _LEGACY_STALE_S
    except OSError:
        return False


def _owner_alive(folder: str) -> bool:
    """Whether the session that made ``folder`` may still use it.

    No owner record (a folder just being made, or one from an older harness) or an unreadable one:
    judged by age instead."""
    try:
        with open(os.path.join(folder, _OWNER_FILE)) as fh:
            pid_text, started_text = fh.read().split()
        pid = int(pid_text)
        started = None if started_text == "None" else float(started_text)
    except (OSError, ValueError):
        return _young(folder)
    now_started = _process_start(pid)
    if now_started is None:
        return False
    return started is None or abs(now_started - started) < 1.0


def remove_stale_pool_dirs(root: str | None = None) -> list[str]:
    """Remove ``accel-pool-*`` folders under ``root`` (the temp dir) whose owning session is gone."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        entries = os.listdir(root)
    except OSError:
        return removed
    for entry in entries:
        if not entry.startswith(POOL_DIR_PREFIX):
            continue
        path = os.path.join(root, entry)
        if os.path.isdir(path) and not os.path.islink(path) and not _owner_alive(path):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                removed.append(path)
    return removed


def _read_children_file(path: str) -> list[int]:
    with open(path, "rb") as fh:
        return [int(pid) for pid in fh.read().split()]


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
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()  # the command name may hold spaces and brackets
    return fields[0].decode(), int(fields[19])  # fields 3 (state) and 22 (starttime) of proc(5)


def _subtree(roots: list[int]) -> dict[int, tuple[str, int]]:
    """Every process below ``roots`` with its (state, start time), read from the roots' own ``/proc`` entries.

    Costs a few file reads per process in the subtree, whatever else runs on the host."""
    found: dict[int, tuple[str, int]] = {}
    todo = list(roots)
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
    return found


def _descendants(pids: list[int]) -> dict[int, int]:
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


def _end_processes(procs: dict[int, Any], grace: float = 1.0) -> None:
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
    """:func:`_end_processes` where pidfds are missing (not Linux, or an old kernel)."""
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


# ---------------------------------------------------------------------- rank side
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` on Linux; False where it is missing or refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except Exception:
        return False


def _die_with_parent() -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _rank_main(rank: int, world_size: int, backend_name: str, store: str, conn: Connection, stack_file: str,
               env: dict[str, str], parent_path: list[str]) -> None:
    _die_with_parent()
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), ACCEL_DEVICE=backend_name)
    for entry in parent_path:
        if entry not in sys.path:
            sys.path.append(entry)
    import faulthandler

    stack_fh = open(stack_file, "w")
    faulthandler.enable(file=stack_fh, all_threads=True)  # a fatal signal writes the crashing stack
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=stack_fh, all_threads=True)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
        from accel.backends import get_backend, reset_registry

        reset_registry()
        backend = get_backend(backend_name)
        count = backend.device_count()
        if backend.device_type != "cpu" and count:
            backend.set_device(rank % count)
        if backend.comm_backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
            from accel.state import _loopback_interface

            iface = _loopback_interface()
            if iface:
                os.environ["GLOO_SOCKET_IFNAME"] = iface
        dist.init_process_group(backend.comm_backend, init_method=f"file://{store}", rank=rank, world_size=world_size)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    baseline = _RankBaseline.capture(backend)
    children = _ChildWatch()
    conn.send(("ready",))
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "stop":
                break
            baseline.restore()
            outcome = _run_task(message[1], rank, world_size, backend)
            outcome.leftovers = children.end_leftovers()
            conn.send(outcome)
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


class _ChildWatch:
    """The processes below this rank, and the ones a test left behind.

    The set of processes seen after the previous test (after its leftovers were ended) is the
    "before" of the next one, so each test costs one look at the subtree."""

    def __init__(self) -> None:
        # orphaned grandchildren come to this rank instead of init, where the subtree walk sees them
        self.subreaper = _PROC_CHILDREN and _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        self.known = self._look()

    def _look(self) -> dict[int, tuple[str, Any]]:
        """pid -> (state, start time) of every process below this rank."""
        if _PROC_CHILDREN:
            return _subtree([os.getpid()])
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
            _end_processes(running)
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
                _end_processes({pid: now[pid][1] for pid in left})
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


class _RankBaseline:
    """What a rank looked like before its first test, put back before every test.

    Each setting is compared with the baseline and set only if a test changed it; the random
    generators are put back every time (cheaper than comparing their state)."""

    def __init__(self, backend: Any = None) -> None:
        import random

        import torch

        self.backend = backend
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.dtype = torch.get_default_dtype()
        self.default_device = torch.get_default_device() if hasattr(torch, "get_default_device") else None
        self.grad = torch.is_grad_enabled()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.torch_seed = torch.initial_seed()
        self.torch_rng = torch.get_rng_state()
        self.device_rng = None
        if backend is not None:
            try:  # the generator of the rank's device (the host one again on a host backend)
                self.device_rng = backend.get_rng_state()
            except Exception:
                self.device_rng = None
        self.python_rng = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy_rng = numpy.random.get_state() if numpy is not None else None

    @classmethod
    def capture(cls, backend: Any = None) -> "_RankBaseline":
        return cls(backend)

    def restore(self) -> None:
        import random

        import torch

        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        try:
            here = os.getcwd()
        except OSError:  # the test removed its working directory
            here = None
        if here != self.cwd:
            try:
                os.chdir(self.cwd)
            except OSError:
                pass
        if torch.get_default_dtype() != self.dtype:
            torch.set_default_dtype(self.dtype)
        if self.default_device is not None and torch.get_default_device() != self.default_device:
            torch.set_default_device(self.default_device)
        if torch.is_grad_enabled() != self.grad:
            torch.set_grad_enabled(self.grad)
        if torch.are_deterministic_algorithms_enabled() != self.deterministic:
            torch.use_deterministic_algorithms(self.deterministic)
        if torch.initial_seed() != self.torch_seed:
            torch.manual_seed(self.torch_seed)  # the test reseeded: every device's generator, as in a fresh process
        torch.set_rng_state(self.torch_rng)
        if self.device_rng is not None:
            self.backend.set_rng_state(self.device_rng)
        random.setstate(self.python_rng)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            if self.numpy_rng is not None:
                numpy.random.set_state(self.numpy_rng)
            else:
                numpy.random.seed(None)


def _resolve(task: Task) -> Any:
    module = sys.modules.get(task.module)
    if module is None:
        try:
            module = importlib.import_module(task.module)
        except ImportError:
            if not task.module_file:
                raise
            spec = importlib.util.spec_from_file_location(task.module, task.module_file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[task.module] = module
            spec.loader.exec_module(module)
    target: Any = module
    parts = task.qualname.split(".")
    for i, part in enumerate(parts):
        target = getattr(target, part)
        if isinstance(target, type) and i < len(parts) - 1:
            target = target()  # test classes: call the method on a fresh instance
    return target


def _run_task(task: Task, rank: int, world_size: int, backend: Any) -> RankOutcome:
    import pytest

    start = time.perf_counter()
    try:
        from accel.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        fn = _resolve(task)
        kwargs = pickle.loads(task.kwargs)
        from accel.state import PartialState

        local = {"backend": backend, "device": PartialState().device, "rank": rank, "world_size": world_size}
        for name in RANK_LOCAL_ARGS:
            if name in kwargs:
                kwargs[name] = local[name]
        fn(**kwargs)
    except pytest.skip.Exception as exc:
        return RankOutcome(rank, "skipped", str(exc.msg), duration=time.perf_counter() - start)
    except pytest.xfail.Exception as exc:
        return RankOutcome(rank, "xfailed", str(exc.msg), duration=time.perf_counter() - start)
    except BaseException as exc:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        message = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        return RankOutcome(rank, "failed", message, tb, time.perf_counter() - start)
    return RankOutcome(rank, "passed", duration=time.perf_counter() - start)


class PoolManager:
    """Pools keyed by (backend, world size), rebuilt after a failure, closed at session end."""

    def __init__(self, timeout: float, env: dict[str, str] | None = None):
        self.timeout = timeout
        self.env = env or {}
        self.pools: dict[tuple[str, int], RankPool] = {}
        self.starts = 0

    def get(self, backend_name: str, world_size: int, start_method: str, env: dict[str, str] | None = None) -> RankPool:
        key = (backend_name, world_size)
        pool = self.pools.get(key)
        if pool is None or not pool.healthy:
            pool = RankPool(backend_name, world_size, start_method, self.timeout, env={**self.env, **(env or {})})
            self.pools[key] = pool
            pool.start()
            self.starts += 1
        return pool

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
