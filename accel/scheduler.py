"""The LR scheduler wrapper, with Accelerate's stepping rules.

A scheduler is written for one process seeing every batch. Under ``prepare`` each optimizer step
covers ``num_processes`` batches (unless ``split_batches``), so the wrapper steps the scheduler
that many times; while gradients accumulate it does not step (only advances ``_step_count`` when
``adjust_scheduler``), and it does not step when the optimizer skipped its update.
"""

from __future__ import annotations

from typing import Any

from .state import GradientState, PartialState


class AcceleratedScheduler:
    """Wraps a learning-rate scheduler for ``Accelerator.prepare``, stepping it by the rules above."""

    def __init__(self, scheduler: Any, optimizers: Any, step_with_optimizer: bool = True, split_batches: bool = False):
        self.scheduler = scheduler
        self.optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer
        self.gradient_state = GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        for opt in self.optimizers:  # a plain loop: this runs every step
            if getattr(opt, "step_was_skipped", False):
                return
        if self.split_batches:
            self.scheduler.step(*args, **kwargs)
            return
        total = getattr(self.scheduler, "total_steps", None)
        # PartialState holds the ranks (AcceleratorState only forwards them) and is cheap to ask every step
        for _ in range(PartialState().num_processes):
            if total is not None and self.scheduler._step_count > total:
                break  # OneCycleLR raises past its total_steps
            self.scheduler.step(*args, **kwargs)

    # ------------------------------------------------------------------ delegation
    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
