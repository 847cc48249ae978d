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

Hygiene between the tests a pool runs (:mod:`accel_harness.pool_hygiene`), at a cost that does not
grow with the host's process count:

- processes a test starts and leaves running are killed after it, and the test gets a
  ``LeftoverProcessWarning`` naming them (a warning, not a failure: the test's own result stands);
  a rank's remaining descendants are killed with it when the pool closes. Each rank is a child
  subreaper on Linux and finds its processes in its own ``/proc`` subtree, not by scanning the host;
- after each test, once its outcome is sent (so off the test's own path), a rank gets back the
  state it started with (default dtype and device, grad and deterministic modes, random generators,
  environment variables, working directory), each piece set again only when a test changed it; a
  rank whose state cannot be put back fails its next test with the reason;
- a rank that crashes on a fatal signal (segfault, abort) is reported with its faulthandler stack;
- each pool folder (``accel-pool-*`` under the temp dir) records its owner; folders whose owner
  is gone (a session killed with SIGKILL cannot clean up) are removed when the next pool starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import contextlib
import os
import pickle
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler as _ForkingPickler
from typing import Any

from accel.launch.forking import garbage_frozen_for_fork
from accel.launch.lifetime import die_with_parent

from .pool_hygiene import (POOL_DIR_PREFIX, ChildWatch, RankBaseline, descendants, end_processes, remove_stale_pool_dirs,
                           write_owner)
from .pool_preload import fork_server_modules
from .session_freeze import freeze_new_imports

# kwargs the rank resolves itself instead of receiving them from the controller
RANK_LOCAL_ARGS = ("backend", "device", "rank", "world_size")

STACK_GRACE_S = 10.0  # the most ranks get to write their stacks after SIGUSR1 (they usually take milliseconds)
STACK_SETTLED_S = 0.1  # a stack file that has grown and then not changed for this long is taken as written
#: how long a rank that is going away may take to be reaped on a loaded host. It is only waited for
#: after a failure or a crash and ends as soon as the rank is gone, so being generous costs nothing
#: on the happy path (and only the wait, never the verdict, when the rank does not go away)
RANK_EXIT_GRACE_S = 30.0
PEER_DEATH_GRACE_S = 0.2  # a collective error right after a peer died is reported as that death
PEER_DEATH_ECHO_GRACE_S = RANK_EXIT_GRACE_S  # ... and longer when the error itself says the peer went away
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
    """What one rank reports for one test."""

    rank: int
    status: str  # passed | failed | skipped | xfailed
    message: str = ""
    traceback: str = ""
    duration: float = 0.0
    #: processes the test left running (killed after it): "pid name: command line"
    leftovers: list[str] = field(default_factory=list)
    #: the rank cannot serve another test (its state could not be put back): the pool is replaced
    retire: bool = False


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
        self._poller: Any = None  # select.poll over the pipes and sentinels, see _ready()
        self._by_fd: dict[int, Any] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        import multiprocessing as mp

        ctx = mp.get_context(self.start_method)
        if self.start_method == "forkserver":  # the server imports once what every rank needs; ranks fork from it
            ctx.set_forkserver_preload(fork_server_modules())
        remove_stale_pool_dirs()
        self.tmpdir = tempfile.mkdtemp(prefix=f"{POOL_DIR_PREFIX}{self.backend_name}-{self.world_size}-")
        write_owner(self.tmpdir)
        store = os.path.join(self.tmpdir, "store")
        # a rank forked from the server inherits the server's environment, which is the one this process had
        # when the server started; it gets this process's environment of now, as a spawned rank would
        env = {**os.environ, **self.env} if self.start_method == "forkserver" else self.env
        with garbage_frozen_for_fork() if self.start_method == "fork" else contextlib.nullcontext():
            for rank in range(self.world_size):
                parent, child = ctx.Pipe()
                stack_file = os.path.join(self.tmpdir, f"stack-{rank}.txt")
                proc = ctx.Process(
                    target=_rank_main,
                    args=(rank, self.world_size, self.backend_name, store, child, stack_file, env, list(sys.path),
                          self.start_method == "forkserver"),
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
        below = descendants([p.pid for p in self.procs if p.is_alive()])
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        end_processes(below)
        for proc in self.procs:
            proc.join(timeout=5)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        self._poller, self._by_fd = None, {}
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def _waitables(self) -> list[Any]:
        return [*self.conns, *(p.sentinel for p in self.procs)]

    def _ready(self, timeout: float) -> list[Any]:
        """The pipes and process sentinels that are ready within ``timeout`` seconds.

        One ``poll`` object per pool, registered once, instead of ``multiprocessing.connection.wait``,
        which builds and fills a new selector on every call (a tens-of-microseconds cost per test)."""
        if timeout <= 0:
            timeout = 0.0
        if not hasattr(select, "poll"):  # Windows: the portable way
            return wait(self._waitables(), timeout=timeout)
        if self._poller is None:
            self._poller, self._by_fd = select.poll(), {}
            for obj in self._waitables():
                fd = obj if isinstance(obj, int) else obj.fileno()
                self._poller.register(fd, select.POLLIN)
                self._by_fd[fd] = obj
        while True:
            try:
                events = self._poller.poll(math.ceil(timeout * 1000))
                break
            except InterruptedError:  # a signal arrived: poll again (PEP 475 covers this on 3.5+)
                continue
        return [self._by_fd[fd] for fd, _ in events]

    def _rank_of(self, obj: Any) -> int:
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs)):
            if obj is conn or obj is proc.sentinel:
                return rank
        raise KeyError(obj)

    # ------------------------------------------------------------------ running one test
    def run(self, task: Task, timeout: float | None = None) -> PoolResult:
        """Run ``task`` on every rank; return as soon as the outcome is known."""
        result = self._run(task, timeout)
        if self.healthy and any(o.retire for o in result.outcomes):
            self.close(kill=True)  # the next test gets fresh ranks
        return result

    def _run(self, task: Task, timeout: float | None) -> PoolResult:
        timeout = self.timeout if timeout is None else timeout
        message = _ForkingPickler.dumps(("run", task))  # pickled once for every rank
        for conn in self.conns:
            conn.send_bytes(message)
        deadline = time.monotonic() + timeout
        outcomes: dict[int, RankOutcome] = {}
        while len(outcomes) < self.world_size:
            remaining = deadline - time.monotonic()
            ready = self._ready(remaining) if remaining > 0 else []
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
                proc.join(timeout=RANK_EXIT_GRACE_S)  # a closed pipe means it is exiting: wait for its status
                return r, proc.exitcode
        return None

    def _crashed(self, rank: int, outcomes: dict[int, RankOutcome]) -> PoolResult:
        self.procs[rank].join(timeout=RANK_EXIT_GRACE_S)  # the sentinel or EOF comes before the exit code is known
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
            paths = {rank: os.path.join(self.tmpdir, f"stack-{rank}.txt") for rank in range(self.world_size)}
            signalled = {}
            for rank, proc in enumerate(self.procs):
                if proc.is_alive():
                    before = _size(paths[rank])
                    try:
                        os.kill(proc.pid, signal.SIGUSR1)
                        signalled[rank] = before
                    except OSError:
                        pass
            _await_dumps({paths[rank]: before for rank, before in signalled.items()}, STACK_GRACE_S)
            for rank in range(self.world_size):
                path = paths[rank]
                try:
                    with open(path) as fh:
                        stacks[rank] = _last_dump(fh.read())
                except OSError:
                    stacks[rank] = "(no stack written)"
        self.close(kill=True)
        return PoolResult("timeout", f"ranks {stuck} did not finish within {timeout:g}s", outcomes=list(outcomes.values()), stacks=stacks)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _await_dumps(files: dict[str, int], limit: float) -> None:
    """Wait until each file has grown past its size in ``files`` and then stayed the same for
    ``STACK_SETTLED_S`` (faulthandler writes a dump in one go once the rank gets the CPU), or
    ``limit`` seconds have passed: a loaded host may take a while to run a signalled rank."""
    deadline = time.monotonic() + limit
    last: dict[str, tuple[int, float]] = {}
    while files and time.monotonic() < deadline:
        now = time.monotonic()
        for path, before in list(files.items()):
            size = _size(path)
            if size <= before:
                continue
            seen = last.get(path)
            if seen is None or seen[0] != size:
                last[path] = (size, now)
            elif now - seen[1] >= STACK_SETTLED_S:
                del files[path]
        if files:
            time.sleep(0.01)


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


# ---------------------------------------------------------------------- rank side
def _rank_main(rank: int, world_size: int, backend_name: str, store: str, conn: Connection, stack_file: str,
               env: dict[str, str], parent_path: list[str], whole_env: bool = False) -> None:
    die_with_parent()
    if whole_env:  # ``env`` is the parent's whole environment: what the fork server had is dropped
        os.environ.clear()
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
        if not backend.is_host and count:
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
    baseline = RankBaseline.capture(backend)
    children = ChildWatch()
    conn.send(("ready",))
    restore_error = ""  # why putting the baseline back failed after the previous test
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "stop":
                break
            if restore_error:
                outcome = RankOutcome(rank, "failed", "the rank's state could not be put back after the previous test",
                                      restore_error, retire=True)
            else:
                outcome = _run_task(message[1], rank, world_size, backend)
            outcome.leftovers = children.end_leftovers()
            conn.send(outcome)
            # off the test's path: the controller reports this test while the rank gets ready for the next
            try:
                baseline.restore()
                restore_error = ""
            except BaseException:
                restore_error = traceback.format_exc()
            freeze_new_imports()  # the test's modules, out of the rank's later collections
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


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
        local = {"backend": backend, "rank": rank, "world_size": world_size}
        for name in RANK_LOCAL_ARGS:
            if name in kwargs:
                kwargs[name] = local[name] if name != "device" else _rank_device()
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


def _rank_device() -> Any:
    """The rank's own device (asked of a fresh ``PartialState`` only by tests that take ``device``)."""
    from accel.state import PartialState

    return PartialState().device


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
