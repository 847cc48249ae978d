"""A sweep worker: loads the backend, then answers the parent's requests until told to stop.

Requests: ``("plan", selection)`` -> the device's facts, tasks and rows decided by torch's metadata;
``("census", None)`` -> the dispatcher census and the training-step trace; ``("task", Task)`` -> the
task's sample results. Before each sample the worker writes into ``marker`` (shared memory, no
message) which task, sample, variant and direction it is in and when it started, so the parent can
name the case that killed or hung it.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

from .plan import DIRECTIONS, VARIANTS, Selection, Task

__all__ = ["MARKER_SLOTS", "decode_marker", "worker_main"]

#: marker layout: task id (-1: idle), sample index (-1: making samples), variant index, direction index, start time
MARKER_SLOTS = 5


def decode_marker(marker: Any) -> tuple[int, int, str, str, float]:
    """(task id, sample, variant, direction, started) from a worker's marker."""
    tid, sample, variant, direction, started = list(marker[:MARKER_SLOTS])
    return int(tid), int(sample), VARIANTS[int(variant)], DIRECTIONS[int(direction)], float(started)


def worker_main(connection: Any, marker: Any, backend_name: str, threads: int, log_path: str | None = None) -> None:
    """The worker process's body (started by :mod:`accel_harness.ops.runner`); its output goes to ``log_path``."""
    if log_path:  # torch's C++ warnings about samples would flood the parent's console
        with open(log_path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
    import torch

    warnings.simplefilter("ignore")  # torch's deprecation warnings on samples would flood the parent's output
    torch.set_num_threads(max(1, threads))
    from accel.backends import get_registry

    try:
        backend = get_registry().select(backend_name)
        device = backend.device(0)
        from .seeding import use_backend

        use_backend(backend)
    except Exception as exc:
        connection.send(("error", None, f"backend {backend_name!r} could not be used: {type(exc).__name__}: {exc}"))
        return
    marker[4] = time.monotonic()
    marker[0] = -1.0

    def begin(sample: int, variant: str, direction: str) -> None:
        marker[1] = float(sample)
        marker[2] = float(VARIANTS.index(variant))
        marker[3] = float(DIRECTIONS.index(direction))
        marker[4] = time.monotonic()

    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        if request is None:
            return
        what, payload = request
        try:
            if what == "plan":
                connection.send(("plan", None, _plan(backend, device, payload)))
            elif what == "census":
                from .census import census, trace_training_step

                trace = trace_training_step(device, backend.device_type)
                connection.send(("census", None, {"census": census(backend.device_type), "trace": trace}))
            elif what == "task":
                results = _run_task(payload, device, begin, marker)
                marker[0] = -1.0
                connection.send(("result", payload.tid, results))
            else:
                connection.send(("error", None, f"unknown request {what!r}"))
        except Exception as exc:  # a bug of the sweep itself: reported to the parent, which stops
            import traceback

            marker[0] = -1.0
            connection.send(("error", getattr(payload, "tid", None), f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _plan(backend: Any, device: Any, selection: Selection) -> dict[str, Any]:
    import torch

    from .catalog import claimed_dtypes, make_plan
    from .profile_rules import apply_tolerances

    claims = claimed_dtypes(backend, device)
    claimed = [name for name, why in claims.items() if not why]
    # the host swept as a device runs its side with twice the threads: the two must agree across thread counts
    device_threads = 2 * torch.get_num_threads() if backend.is_host else 0
    tasks, rows = make_plan(selection, backend.device_type, claimed, device_threads)
    apply_tolerances(tasks, selection.tolerance_rules)
    return {"device": str(device), "device_type": backend.device_type, "claims": claims, "tasks": tasks, "rows": rows,
            "torch": torch.__version__, "pid": os.getpid()}


def _run_task(task: Task, device: Any, begin: Any, marker: Any) -> list[Any]:
    from .catalog import database

    entry = database(task.kind, task.source)[task.index]  # importing a database is not the task's time
    # the start time first: the parent reads a marker naming this task as a clock already running for it
    begin(-1, task.variants[0], task.directions[0])
    marker[0] = float(task.tid)
    if task.kind == "op":
        from .execute import run_op_task

        return run_op_task(task, entry, device, begin)
    from .nn_entries import run_module_task, run_optim_task

    runner = run_module_task if task.kind == "module" else run_optim_task
    return runner(task, entry, device, begin)
