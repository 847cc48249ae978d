"""The crash-isolated sweep: worker processes run tasks; a crash or a hang costs one case, never the sweep.

Workers are forked from a ``forkserver`` that has already imported torch and the test databases,
so a worker starts in a fraction of a second and never inherits a device the parent touched (the
parent never imports torch). A worker that dies is replaced; the case it was in (read from its
shared-memory marker) is recorded as ``crash`` with the signal, or ``timeout`` when the parent
killed it for running past the per-sample limit, and its task goes back to the queue with that
case decided so nothing else is lost.
"""

from __future__ import annotations

import collections
import importlib.util
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable

from ..pool_preload import fork_server_modules
from . import outcomes as oc
from .fold import fold_task
from .plan import DATABASES, Row, SampleResult, Selection, Task
from .worker import MARKER_SLOTS, decode_marker, worker_main

__all__ = ["SweepError", "SweepResult", "run_sweep", "sweep_fork_server_modules"]

#: attempts of one task before its remaining rows are given up as crashes
MAX_ATTEMPTS = 25


class SweepError(RuntimeError):
    """The sweep itself could not run (the databases cannot be imported, the backend cannot be loaded)."""


@dataclass
class SweepResult:
    """Everything a sweep found: device facts, rows, census and trace, and what it cost."""

    backend: str
    device: str = ""
    device_type: str = ""
    torch: str = ""
    claims: dict[str, str] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    census: list[dict[str, Any]] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    census_error: str | None = None
    tasks: int = 0
    cases: int = 0
    workers: int = 0
    restarts: int = 0
    seconds: float = 0.0


class _Worker:
    def __init__(self, ctx: Any, backend: str, threads: int, log_path: str | None):
        self.marker = ctx.RawArray("d", MARKER_SLOTS)
        self.marker[0] = -2.0  # starting
        self.connection, child = ctx.Pipe()
        self.process = ctx.Process(target=worker_main, args=(child, self.marker, backend, threads, log_path), daemon=True)
        self.process.start()
        child.close()
        self.busy: Any = None  # a Task, "plan", "census", or None

    def stop(self) -> None:
        try:
            self.connection.send(None)
        except (OSError, ValueError):
            pass

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)


def _death(process: Any) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        try:
            return f"the process died with {signal.Signals(-code).name}"
        except ValueError:
            return f"the process died with signal {-code}"
    return f"the process exited with status {code}"


def check_requirements() -> None:
    """torch's databases import ``expecttest``: say so before any process starts."""
    if importlib.util.find_spec("expecttest") is None:
        raise SweepError("the operator sweep needs the 'expecttest' package (torch's OpInfo database imports it): "
                         "pip install expecttest")


def run_sweep(backend: str, selection: Selection, *, workers: int = 2, timeout: float = 60.0, census: bool = True,
              log_path: str | None = None, on_progress: Callable[[int, int, int], None] | None = None) -> SweepResult:
    """Run ``selection`` on ``backend`` with ``workers`` processes; ``timeout`` is per sample (seconds).

    The workers' own output (torch's warnings) goes to ``log_path`` (None: inherited).
    ``on_progress(done, total, failed)`` is called as tasks finish."""
    check_requirements()
    started = time.monotonic()
    ctx = multiprocessing.get_context("forkserver")
    # one fork server per process serves the sweep and the rank pools, and whichever starts it sets what it
    # imports: the pools' list first, so a rank forked from a server the sweep started has it too
    ctx.set_forkserver_preload(fork_server_modules(*sweep_fork_server_modules(selection)))
    workers = max(1, workers)
    threads = max(1, (os.cpu_count() or 1) // workers)
    result = SweepResult(backend=backend, workers=workers)
    pool = [_Worker(ctx, backend, threads, log_path) for _ in range(workers)]
    queue: collections.deque[Task] = collections.deque()
    results: dict[int, list[SampleResult]] = {}
    attempts: collections.Counter[int] = collections.Counter()
    tasks: dict[int, Task] = {}
    failed = 0
    try:
        pool[0].connection.send(("plan", selection))
        pool[0].busy = "plan"
        if census and len(pool) > 1:
            pool[1].connection.send(("census", None))
            pool[1].busy = "census"
        census_pending = census
        planned = False
        while True:
            for worker in pool:  # hand out work
                if worker.busy is None:
                    if census_pending and planned and not any(w.busy == "census" for w in pool):
                        worker.connection.send(("census", None))
                        worker.busy = "census"
                    elif queue:
                        task = queue.popleft()
                        attempts[task.tid] += 1
                        worker.connection.send(("task", task))
                        worker.busy = task
            if planned and not queue and all(w.busy is None for w in pool) and not census_pending:
                break
            ready = wait([w.connection for w in pool] + [w.process.sentinel for w in pool], timeout=0.5)
            for worker in list(pool):
                if worker.connection in ready:
                    try:
                        message = worker.connection.recv()
                    except (EOFError, OSError):
                        message = None
                    if message is not None:
                        kind, tid, payload = message
                        if kind == "error":
                            raise SweepError(f"the sweep's worker failed: {payload}")
                        if kind == "plan":
                            result.device, result.device_type = payload["device"], payload["device_type"]
                            result.torch, result.claims = payload["torch"], payload["claims"]
                            result.rows.extend(payload["rows"])
                            for task in payload["tasks"]:
                                tasks[task.tid] = task
                                queue.append(task)
                            result.tasks = len(tasks)
                            planned = True
                        elif kind == "census":
                            result.census, result.trace = payload["census"], payload["trace"]
                            census_pending = False
                        elif kind == "result":
                            task = tasks[tid]
                            results[tid] = payload
                            rows = fold_task(task, payload)
                            failed += sum(r.outcome == "failed" for r in rows)
                            result.rows.extend(rows)
                            if on_progress:
                                on_progress(len(results), len(tasks), failed)
                        worker.busy = None
                        continue
                dead = worker.process.sentinel in ready and not worker.process.is_alive()
                hung = _hung(worker, timeout)
                if not dead and not hung:
                    continue
                if hung:
                    worker.kill()
                cause = (oc.TIMEOUT, f"no answer after {timeout:g} s (killed)") if hung else (oc.CRASH, _death(worker.process))
                busy = worker.busy
                pool.remove(worker)
                worker.kill()
                result.restarts += 1
                if busy == "plan" or worker.marker[0] == -2.0 and busy is None:
                    raise SweepError(f"the sweep's worker for {backend} could not start or plan: {cause[1]}")
                if busy == "census":
                    result.census_error = cause[1]
                    census_pending = False
                elif isinstance(busy, Task):
                    done = _settle(busy, worker.marker, cause, attempts[busy.tid])
                    if done is None:
                        queue.appendleft(busy)
                    else:
                        results[busy.tid] = done
                        rows = fold_task(busy, done)
                        failed += sum(r.outcome == "failed" for r in rows)
                        result.rows.extend(rows)
                pool.append(_Worker(ctx, backend, threads, log_path))
    finally:
        for worker in pool:
            worker.stop()
        for worker in pool:
            worker.process.join(5)
            worker.kill()
    result.cases = sum(len(r) for r in results.values())
    result.seconds = time.monotonic() - started
    return result


def sweep_fork_server_modules(selection: Selection) -> list[str]:
    """What a sweep of ``selection`` has its fork server import besides the rank pools' list: the backends,
    the plan and the databases it reads (a session running a sweep names them with ``fork_server_imports``)."""
    return ["accel_harness.ops.catalog", "accel.backends", *sorted({m for m, _ in _databases(selection)}),
            *sorted({spec.partition(":")[0] for spec in selection.extra_opinfos})]


def _databases(selection: Selection) -> list[tuple[str, str]]:
    return [DATABASES[kind] for kind in selection.kinds]


def _hung(worker: _Worker, timeout: float) -> bool:
    """Whether the worker has run its current case past ``timeout`` (a start never written is no start)."""
    if worker.busy is None or not isinstance(worker.busy, Task) or not worker.process.is_alive():
        return False
    tid, _, _, _, started = decode_marker(worker.marker)
    return tid == worker.busy.tid and started > 0.0 and time.monotonic() - started > timeout


def _settle(task: Task, marker: Any, cause: tuple[str, str], attempt: int) -> list[SampleResult] | None:
    """Record the case a dead worker was in; None: run the task again, else the task's final results."""
    tid, sample, variant, direction, _ = decode_marker(marker)
    reason, message = cause
    if tid != task.tid or sample < 0 or attempt >= MAX_ATTEMPTS:
        # died while making the samples (or too often): every row of the task ends here
        where = "while making the samples" if sample < 0 else f"after {attempt} attempts"
        return [SampleResult(v, d, max(sample, 0), reason, message=f"{message} {where}") for v, d in task.pairs]
    task.decided[(sample, variant, direction)] = (reason, message)
    return None
