"""Gradient accumulation's step rule and the block of an accumulating step.

:func:`advance` counts one batch and decides whether its backward synchronises gradients (every
``num_steps``-th batch, and always at the end of the loader when the plugin syncs with it);
:func:`accumulation_block` is what ``Accelerator.accumulate`` returns: nothing to enter on a
synchronising step, else the models' ``no_sync`` contexts, entered already. Both run every step, so
they stay small.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

__all__ = ["accumulation_block", "advance"]

#: the block of a synchronising step: nothing to enter (reusable: a nullcontext holds no state)
_NO_CONTEXT = contextlib.nullcontext()


class _Unsynced:
    """The block of an accumulating step: the models' ``no_sync`` contexts, entered already, left at its end."""

    __slots__ = ("stack",)

    def __init__(self, stack: contextlib.ExitStack):
        self.stack = stack

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return bool(self.stack.__exit__(*exc))


def advance(step: int, gradient_state: Any) -> int:
    """The step count after one more batch; sets ``gradient_state.sync_gradients`` for that batch.

    At the end of the loader (when the plugin syncs with it) the count restarts at 0 and the batch
    synchronises; otherwise the count goes up by one and every ``num_steps``-th batch synchronises.
    """
    if gradient_state.sync_with_dataloader and gradient_state.end_of_dataloader:
        gradient_state.sync_gradients = True
        return 0
    step += 1
    gradient_state.sync_gradients = step % gradient_state.num_steps == 0
    return step


def accumulation_block(models: Sequence[Any], gradient_state: Any,
                       no_sync: Callable[[Any], contextlib.AbstractContextManager]) -> contextlib.AbstractContextManager:
    """The block of this step: a null context when it synchronises (or syncs each batch, or has no models),
    else each model's ``no_sync(model)`` entered now and left when the block ends (all of them, if one fails)."""
    if not models or gradient_state.sync_gradients or gradient_state.sync_each_batch:
        return _NO_CONTEXT
    stack = contextlib.ExitStack()
    try:
        for model in models:
            stack.enter_context(no_sync(model))
    except BaseException:
        stack.close()
        raise
    return _Unsynced(stack)
