"""How a prepared model is distributed. One module per strategy, chosen from the state.

DeepSpeed and FSDP slot in as further modules with the same small interface (`Strategy`).
"""

from __future__ import annotations

from .base import SingleDeviceStrategy, Strategy
from .ddp import DDPStrategy

__all__ = ["DDPStrategy", "SingleDeviceStrategy", "Strategy", "select_strategy"]


def select_strategy(state, ddp_kwargs=None) -> Strategy:
    """DDP when several processes run, otherwise the model stays as it is."""
    if state.use_distributed:
        return DDPStrategy(state, ddp_kwargs)
    return SingleDeviceStrategy(state)
