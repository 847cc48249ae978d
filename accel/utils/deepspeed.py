"""DeepSpeed at Accelerate's API: the plugin and its config (from :mod:`accel.strategies.deepspeed.config`),
and the wrappers ``prepare`` returns around DeepSpeed's engine, optimizer and scheduler.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..optimizer import AcceleratedOptimizer
from ..scheduler import AcceleratedScheduler
from ..strategies.deepspeed.config import (  # noqa: F401  (Accelerate's import path for the configuration)
    DeepSpeedPlugin,
    DummyOptim,
    DummyScheduler,
    HfDeepSpeedConfig,
    get_active_deepspeed_plugin,
)

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedPlugin",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "get_active_deepspeed_plugin",
    "map_pytorch_optim_to_deepspeed",
]


class DeepSpeedEngineWrapper:
    """Runs ``accelerator.backward`` on a DeepSpeed engine: backward, then step at a sync boundary."""

    def __init__(self, engine: Any):
        self.engine = engine

    def backward(self, loss: torch.Tensor, sync_gradients: bool = True, **kwargs: Any) -> None:
        # accel's accumulation decides the boundary, so DeepSpeed's counter cannot drift from it
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()

    def get_global_grad_norm(self) -> float | None:
        norm = self.engine.get_global_grad_norm()
        return norm.item() if hasattr(norm, "item") else norm


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The engine's optimizer: ``step``/``zero_grad`` are the engine's business (a no-op here)."""

    def __init__(self, optimizer: Any):
        super().__init__(optimizer, device_placement=False, scaler=None)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """No-op: the engine clears gradients in its ``step``."""

    def step(self, closure: Callable[[], Any] | None = None) -> None:
        """No-op: the engine stepped in ``accelerator.backward``."""
        self._accelerate_step_called = True

    @property
    def step_was_skipped(self) -> bool:
        """Whether DeepSpeed's fp16 loss scaler skipped the last step on overflow."""
        return bool(getattr(self.optimizer, "overflow", False))


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """The scheduler handed to ``deepspeed.initialize``: the engine steps it, so ``step`` is a no-op."""

    def __init__(self, scheduler: Any, optimizers: Any):
        super().__init__(scheduler, optimizers)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """No-op: the engine steps its scheduler in ``engine.step``."""


def map_pytorch_optim_to_deepspeed(optimizer: torch.optim.Optimizer) -> Any:
    """DeepSpeed's CPU Adam/Adagrad for an offloaded optimizer, keeping the torch optimizer's settings."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    defaults = {k: v for k, v in optimizer.defaults.items() if k in ("lr", "betas", "eps", "weight_decay", "amsgrad")}
    if isinstance(optimizer, torch.optim.Adagrad):
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return DeepSpeedCPUAdagrad(optimizer.param_groups, **{k: v for k, v in defaults.items() if k in ("lr", "eps", "weight_decay")})
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return DeepSpeedCPUAdam(optimizer.param_groups, adamw_mode=isinstance(optimizer, torch.optim.AdamW), **defaults)
    return optimizer  # DeepSpeed runs other optimizers as they are (zero_force_ds_cpu_optimizer is off)

