"""Freezing a process's long-lived objects out of Python's garbage collections.

A test session holds hundreds of thousands of objects for its whole life (torch, Dynamo, transformers,
the collected tests). Each full collection traverses every one of them again, and tests run many
(``Accelerator.free_memory``, ``find_executable_batch_size``'s retries, Python's own full collections).
``gc.freeze`` moves them into a generation no collection visits; garbage among them is collected first,
so its destructors run. A frozen object that later becomes garbage in a reference cycle is kept until
the process ends: right for what lives as long as the session, and the reason the freeze comes only
once the session has collected.

Tests go on importing (the first test that trains a transformers model, the first DeepSpeed run), and a
rank imports after it was forked: more than a thousand modules in a rank of the suites, which would put
every later full collection of that process back at a tenth of a second. A process that froze once
therefore freezes again between tests, after imports: what a module import makes lives as long as the
process.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["REFREEZE_AFTER_MODULES", "freeze_collected_session", "freeze_new_imports"]

#: modules a process must have imported since its last freeze before it freezes again between tests
REFREEZE_AFTER_MODULES = 25

#: how many modules this process had at its last freeze (None: it never froze here)
_modules_at_freeze: int | None = None


def freeze_collected_session() -> int:
    """Collect this process's garbage, then freeze every object left; returns how many are frozen."""
    global _modules_at_freeze
    gc.collect()
    gc.freeze()
    _modules_at_freeze = len(sys.modules)
    return gc.get_freeze_count()


def freeze_new_imports(min_new_modules: int = REFREEZE_AFTER_MODULES) -> bool:
    """Between tests: freeze again when this process froze before and has imported at least
    ``min_new_modules`` modules since (a forked child inherits its parent's count); True when it froze.

    Call it only where no test's objects are alive: whatever is left then is frozen with the imports."""
    if _modules_at_freeze is None or len(sys.modules) - _modules_at_freeze < min_new_modules:
        return False
    freeze_collected_session()
    return True
