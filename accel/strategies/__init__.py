"""How prepared models are distributed and stepped: one module per strategy.

``accel.resolve`` picks the strategy for a run (its table names the module of each); the
Accelerator hands it everything it prepares. DeepSpeed and FSDP modules import their
frameworks only when chosen.
"""

from __future__ import annotations

from .base import SingleDeviceStrategy, Strategy, StrategyCheckpoint
from .ddp import DDPStrategy

__all__ = ["DDPStrategy", "SingleDeviceStrategy", "Strategy", "StrategyCheckpoint"]
