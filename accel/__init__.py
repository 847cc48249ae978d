"""accel: an Accelerate-compatible Accelerator and a backend qualification harness for PyTorch.

Importing accel stays cheap: submodules load on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (resolved lazily, PEP 562)
_LAZY = {
    "Accelerator": "accel.accelerator",
    "PartialState": "accel.state",
    "AcceleratorState": "accel.state",
    "GradientState": "accel.state",
    "DistributedType": "accel.utils.dataclasses",
    "AutocastKwargs": "accel.utils.dataclasses",
    "DDPCommunicationHookType": "accel.utils.dataclasses",
    "DataLoaderConfiguration": "accel.utils.dataclasses",
    "DistributedDataParallelKwargs": "accel.utils.dataclasses",
    "GradScalerKwargs": "accel.utils.dataclasses",
    "InitProcessGroupKwargs": "accel.utils.dataclasses",
    "ProjectConfiguration": "accel.utils.dataclasses",
    "GradientAccumulationPlugin": "accel.utils.dataclasses",
    "skip_first_batches": "accel.data_loader",
    "synchronize_rng_states": "accel.utils.random",
    "is_rich_available": "accel.utils.imports",
    "find_executable_batch_size": "accel.utils.memory",
    "notebook_launcher": "accel.launchers",
    "debug_launcher": "accel.launchers",
    "get_backend": "accel.backends",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'accel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
