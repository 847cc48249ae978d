"""Pinning a benchmark process to one CPU core while it measures, so the scheduler does not move it
between cores mid-benchmark (part of :mod:`timing`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator


def _allowed_cores() -> list[int] | None:
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None:
        return None
    try:
        return sorted(getter(0))
    except OSError:
        return None


@contextlib.contextmanager
def pinned_to_core(slot: int = 0, slots: int = 1) -> Iterator[dict[str, Any]]:
    """Pin this process to one core of its allowed set while measuring; restore the mask afterwards.

    ``slot`` of ``slots`` (a rank of a world size, or 0 of 1 for a single process) gets core
    ``allowed[slot]``, counted from the *last* allowed core down, so slot 0 of a single process
    keeps off core 0 (where the kernel tends to take interrupts) when it can. With fewer allowed
    cores than ``slots`` nothing is pinned: ranks would share cores anyway and a pin would only
    serialise them. Yields what went into ``extra_info["cpu_pinning"]``.
    """
    allowed = _allowed_cores()
    if allowed is None:
        yield {"pinned": False, "reason": "os.sched_setaffinity unavailable"}
        return
    if len(allowed) < slots:
        yield {"pinned": False, "reason": f"{len(allowed)} allowed cores < {slots} processes",
               "allowed_cores": allowed}
        return
    core = allowed[len(allowed) - 1 - slot] if slots == 1 else allowed[slot]
    try:
        os.sched_setaffinity(0, {core})
    except OSError as exc:
        yield {"pinned": False, "reason": f"sched_setaffinity failed: {exc}", "allowed_cores": allowed}
        return
    try:
        yield {"pinned": True, "core": core, "allowed_cores": allowed, "processes": slots}
    finally:
        try:
            os.sched_setaffinity(0, set(allowed))
        except OSError:
            pass
