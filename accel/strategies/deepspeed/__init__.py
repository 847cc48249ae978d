"""DeepSpeed: the strategy (:mod:`.strategy`, ZeRO stages 0-3 through ``deepspeed.initialize``) and its
configuration (:mod:`.config`, ``DeepSpeedPlugin`` and the config dict it builds).

Every public name is re-exported here and loads its module on first use, so the plugin comes without
the strategy and neither imports deepspeed until a run needs it. Accelerate's import paths for the
plugin and the wrappers ``prepare`` returns are :mod:`accel.utils.deepspeed` and ``accel.utils``.
"""

from __future__ import annotations

from ..._lazy import lazy_exports

# public name -> module that defines it (resolved lazily)
_LAZY = {
    "DeepSpeedStrategy": "accel.strategies.deepspeed.strategy",
    "align_deepspeed_accelerator": "accel.strategies.deepspeed.strategy",
    "require_deepspeed": "accel.strategies.deepspeed.strategy",
    "DeepSpeedPlugin": "accel.strategies.deepspeed.config",
    "DummyOptim": "accel.strategies.deepspeed.config",
    "DummyScheduler": "accel.strategies.deepspeed.config",
    "HfDeepSpeedConfig": "accel.strategies.deepspeed.config",
    "get_active_deepspeed_plugin": "accel.strategies.deepspeed.config",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
