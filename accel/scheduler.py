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
        #: scheduler steps per optimizer step: the process count, read from the state at the first step
        self._steps_per_step: int | None = None
        #: whether the scheduler has a ``total_steps`` it must not be stepped past (OneCycleLR raises)
        self._guards_total = hasattr(scheduler, "total_steps")
        #: one process, stepping with the optimizer, no total to respect (set at the first step):
        #: (the scheduler's bound ``step``, the gradient state, the optimizers)
        self._every_step: tuple[Any, GradientState, tuple[Any, ...]] | None = None

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the scheduler as Accelerate does: once per process per optimizer step, never while accumulating."""
        # the every-step case: one attribute read, then the checks that can change from step to step
        every_step = self._every_step
        if every_step is not None and not args and not kwargs:
            scheduler_step, gradient_state, optimizers = every_step
            if gradient_state.sync_gradients:
                for opt in optimizers:  # ``_is_overflow`` may be set by hand (Accelerate's tests do): ask each time
                    if getattr(opt, "step_was_skipped", False):
                        return
                scheduler_step()
                return
        self._step_by_rules(args, kwargs)

    def _step_by_rules(self, args: tuple, kwargs: dict) -> None:
        scheduler = self.scheduler
        if not self.step_with_optimizer:
            scheduler.step(*args, **kwargs)
            return
        gradient_state = self.gradient_state
        if not gradient_state.sync_gradients:
            if gradient_state.adjust_scheduler:
                scheduler._step_count += 1
            return
        if any(getattr(opt, "step_was_skipped", False) for opt in self.optimizers):
            return
        if self.split_batches:
            scheduler.step(*args, **kwargs)
            return
        repeat = self._steps_per_step
        if repeat is None:
            # PartialState holds the ranks; the count cannot change while this process runs
            repeat = self._steps_per_step = PartialState().num_processes
            if repeat == 1 and not self._guards_total:
                self._every_step = (scheduler.step, gradient_state, tuple(self.optimizers))
        for _ in range(repeat):
            total = getattr(scheduler, "total_steps", None)
            if total is not None and scheduler._step_count > total:
                break  # OneCycleLR raises past its total_steps
            scheduler.step(*args, **kwargs)

    # ------------------------------------------------------------------ delegation
    def get_last_lr(self) -> list[float]:
        """The wrapped scheduler's last learning rates."""
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped scheduler's state dict."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load ``state_dict`` into the wrapped scheduler."""
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        """The wrapped scheduler's ``get_lr``."""
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped scheduler's ``print_lr``."""
        return self.scheduler.print_lr(*args, **kwargs)
