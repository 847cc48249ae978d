"""Freezing a process's long-lived objects out of Python's garbage collections.

A test session holds hundreds of thousands of objects for its whole life (torch, Dynamo, transformers,
the collected tests). Each full collection traverses every one of them again, and tests run many
(``Accelerator.free_memory``, ``find_executable_batch_size``'s retries, Python's own full collections).
``gc.freeze`` moves them into a generation no collection visits; garbage among them is collected first,
so its destructors run. A frozen object that later becomes garbage in a reference cycle is kept until
the process ends: right for what lives as long as the session, and the reason the freeze comes only
once the session has collected.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_collected_session"]


def freeze_collected_session() -> int:
    """Collect this process's garbage, then freeze every object left; returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
