"""How prepared models are distributed and stepped: one module per strategy.

``accel.resolve`` picks the strategy for a run (its table names the module of each); the
Accelerator builds it with a :class:`StrategyContext` and hands it what was prepared as a
:class:`PreparedObjects`. DeepSpeed and FSDP modules import their frameworks only when chosen.
"""

from __future__ import annotations

from .base import SingleDeviceStrategy, Strategy, StrategyCheckpoint
from .context import PreparedObjects, StrategyContext
from .ddp import DDPStrategy

__all__ = ["DDPStrategy", "PreparedObjects", "SingleDeviceStrategy", "Strategy", "StrategyCheckpoint", "StrategyContext"]
