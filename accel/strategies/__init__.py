"""How prepared models are distributed and stepped: one module per strategy.

``accel.resolve`` picks the strategy for a run (its table names the module of each); the
Accelerator builds it with a :class:`StrategyContext` and hands it what was prepared as a
:class:`PreparedObjects`. DeepSpeed and FSDP modules import their frameworks only when chosen.

Importing the package (or ``accel.strategies.context``) imports no strategy: each name below loads
its module on first use (PEP 562), so the Accelerator's import does not pay for ``torch``'s DDP
or for strategy classes a run does not use.
"""

from __future__ import annotations

from .._lazy import lazy_exports

# public name -> module that defines it (resolved lazily)
_LAZY = {
    "SingleDeviceStrategy": "accel.strategies.base",
    "Strategy": "accel.strategies.base",
    "StrategyCheckpoint": "accel.strategies.base",
    "PreparedObjects": "accel.strategies.context",
    "StrategyContext": "accel.strategies.context",
    "DDPStrategy": "accel.strategies.ddp",
}

__all__ = ["DDPStrategy", "PreparedObjects", "SingleDeviceStrategy", "Strategy", "StrategyCheckpoint", "StrategyContext"]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
