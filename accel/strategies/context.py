"""The values an Accelerator hands its strategy and checkpointing, so neither reaches back into it.

``StrategyContext`` is given once, when the strategy is built: the run's state, the gradient state,
the precision plan and the settings a strategy reads while preparing. ``PreparedObjects`` is a
snapshot of what was prepared, passed with every call that needs it (clipping, state dicts,
checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EMPTY", "PreparedObjects", "StrategyContext"]


@dataclass(frozen=True)
class PreparedObjects:
    """What an Accelerator has prepared, each kind in the order it was prepared (a frozen snapshot).

    ``custom_objects`` are those given to ``register_for_checkpointing``; ``scaler`` is the fp16 grad
    scaler of the precision in use, or None.
    """

    models: tuple[Any, ...] = ()
    optimizers: tuple[Any, ...] = ()
    schedulers: tuple[Any, ...] = ()
    dataloaders: tuple[Any, ...] = ()
    custom_objects: tuple[Any, ...] = ()
    scaler: Any = None


#: nothing prepared
EMPTY = PreparedObjects()


@dataclass(frozen=True)
class StrategyContext:
    """What a strategy needs from the run it serves, handed over once when it is built.

    ``state`` is the ``AcceleratorState`` (ranks, device, backend, plugins, parallelism config),
    ``gradient_state`` the shared ``GradientState`` (accumulation steps, whether this step syncs),
    ``precision`` the ``PrecisionPlan`` that runs. ``dataloader_config`` gives ``split_batches`` when
    a scheduler or a DeepSpeed config is filled; ``ddp_kwargs`` are the ``DistributedDataParallelKwargs``.
    """

    state: Any
    gradient_state: Any
    precision: Any
    dataloader_config: Any = None
    step_scheduler_with_optimizer: bool = True
    ddp_kwargs: Any = None

    @property
    def split_batches(self) -> bool:
        """Whether a loader's batch size is the global one, split over the processes."""
        return bool(getattr(self.dataloader_config, "split_batches", False))
