"""The sweep's hang detection: a worker is killed for running past the limit, never for a clock it has not started."""

from __future__ import annotations

import time
from types import SimpleNamespace

from accel_harness.ops import catalog, execute
from accel_harness.ops.plan import Task
from accel_harness.ops.runner import _hung
from accel_harness.ops.worker import MARKER_SLOTS, _run_task


def _task(tid: int = 3) -> Task:
    return Task(tid=tid, kind="op", index=0, name="abs", dtype="bfloat16", variants=("function",),
                directions=("forward",), limit=1)


def _worker(marker: list[float], task: Task) -> SimpleNamespace:
    return SimpleNamespace(busy=task, marker=marker, process=SimpleNamespace(is_alive=lambda: True))


def test_a_worker_past_the_limit_on_its_case_is_hung_and_one_within_it_is_not():
    task = _task()
    assert _hung(_worker([3.0, 0.0, 0.0, 0.0, time.monotonic() - 300.0], task), timeout=120.0)
    assert not _hung(_worker([3.0, 0.0, 0.0, 0.0, time.monotonic()], task), timeout=120.0)
    assert not _hung(_worker([2.0, 0.0, 0.0, 0.0, time.monotonic() - 300.0], task), timeout=120.0)  # another task


def test_a_worker_that_named_its_first_task_before_its_clock_started_is_not_hung():
    # a fresh marker's start slot is zero: read against the machine's uptime it looked hours late
    assert not _hung(_worker([3.0, -1.0, 0.0, 0.0, 0.0], _task()), timeout=120.0)


class _RecordingMarker(list):
    def __init__(self):
        super().__init__([0.0] * MARKER_SLOTS)
        self.writes: list[int] = []

    def __setitem__(self, slot, value):
        self.writes.append(slot)
        super().__setitem__(slot, value)


def test_the_worker_starts_a_tasks_clock_before_it_names_the_task(monkeypatch):
    marker = _RecordingMarker()
    monkeypatch.setattr(catalog, "database", lambda kind, source: [object()])
    monkeypatch.setattr(execute, "run_op_task", lambda task, entry, device, begin: [])

    def begin(sample, variant, direction):
        marker[1] = float(sample)
        marker[4] = time.monotonic()

    assert _run_task(_task(), "cpu", begin, marker) == []
    assert marker[0] == 3.0
    assert marker.writes.index(4) < marker.writes.index(0), marker.writes
