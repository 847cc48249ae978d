"""LOMO and AdaLomo optimizers (the ``lomo_optim`` package): their fused backward.

These optimizers update the weights inside the backward pass, so ``Accelerator.backward(loss,
learning_rate=...)`` hands the loss to them instead of calling ``loss.backward()``, as Accelerate does.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

__all__ = ["is_lomo_optimizer", "lomo_backward"]


def _lomo_classes() -> tuple[type, ...]:
    from ..utils.imports import is_lomo_available

    if not is_lomo_available():
        return ()
    from lomo_optim import AdaLomo, Lomo

    return (Lomo, AdaLomo)


def is_lomo_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` (or the optimizer a prepared one wraps) is a LOMO or AdaLomo optimizer."""
    classes = _lomo_classes()
    return bool(classes) and isinstance(getattr(optimizer, "optimizer", optimizer), classes)


def lomo_backward(optimizers: Iterable[Any], loss: torch.Tensor, learning_rate: float) -> None:
    """Run the fused backward of every LOMO/AdaLomo optimizer among ``optimizers`` with ``learning_rate``.

    A missing learning rate, or no LOMO optimizer among the prepared ones, is a ValueError (Accelerate's words).
    """
    if learning_rate is None:
        raise ValueError("A learning rate must be passed in order to call backward pass with LOMO optimizers.")
    called = False
    for optimizer in optimizers:
        if is_lomo_optimizer(optimizer):
            getattr(optimizer, "optimizer", optimizer).fused_backward(loss, learning_rate)
            called = True
    if not called:
        raise ValueError("Backward pass not properly called on LOMO optimizers. Are you sure you passed a LOMO "
                         "optimizer in accelerator.prepare()?")
