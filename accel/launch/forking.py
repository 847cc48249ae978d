"""Forking worker processes from a process that has run other work: what the children must not inherit.

A forked child inherits the parent's garbage, and the first collection in the child runs its
destructors. Some of them wait for threads, and a forked child has only the thread that forked: a
torch.distributed process group left in a reference cycle by earlier work (a notebook cell, an earlier
test) makes every forked worker hang in its first garbage collection, inside whatever it was doing.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["garbage_frozen_for_fork"]


@contextlib.contextmanager
def garbage_frozen_for_fork() -> Iterator[None]:
    """Around forking children: collect this process's garbage first (its destructors work here), then keep
    what is left out of the children's collections (``gc.freeze``). Afterwards the parent's collections
    resume over everything, unless the parent had frozen objects of its own before: ``gc.unfreeze`` cannot
    tell them apart, so they stay frozen, with what this call froze besides."""
    frozen_before = gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()
