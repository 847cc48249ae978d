"""One place decides how a run is distributed: which strategy, which ``DistributedType``, and why.

Inputs, highest first: the Accelerator's arguments (plugins), then the environment that
``accel launch`` / ``accelerate launch`` set (``ACCELERATE_USE_DEEPSPEED``, ``ACCELERATE_USE_FSDP``,
with ``ACCEL_*`` spellings taking precedence), then the process layout and the hardware backend.
Every choice carries its reason, shown by ``accel env`` and ``repr(Accelerator().state)``.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Any

from .utils.dataclasses import DistributedType

__all__ = ["RunPlan", "STRATEGIES", "resolve_run", "strategy_class"]

_TRUE = {"1", "true", "yes", "on"}

#: strategy name -> "module:Class" (imported on first use, so DeepSpeed/FSDP cost nothing when unused)
STRATEGIES = {
    "single": "accel.strategies.base:SingleDeviceStrategy",
    "ddp": "accel.strategies.ddp:DDPStrategy",
    "deepspeed": "accel.strategies.deepspeed:DeepSpeedStrategy",
    "fsdp": "accel.strategies.fsdp:FSDPStrategy",
}


def _flag(*names: str) -> str | None:
    """The first of ``names`` set to a true value, or None."""
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().lower() in _TRUE:
            return name
    return None


@dataclass(frozen=True)
class RunPlan:
    """How this run is distributed, with a reason per choice."""

    strategy: str
    distributed_type: DistributedType
    reasons: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in self.reasons.items())


def resolve_run(num_processes: int, backend_distributed_type: str, *, deepspeed_plugins: Any = None,
                fsdp_plugin: Any = None) -> RunPlan:
    """Decide the strategy for ``num_processes`` ranks on a backend whose multi-process type is given."""
    ds_env = _flag("ACCEL_USE_DEEPSPEED", "ACCELERATE_USE_DEEPSPEED")
    fsdp_env = _flag("ACCEL_USE_FSDP", "ACCELERATE_USE_FSDP")
    use_ds = deepspeed_plugins is not None or ds_env is not None
    use_fsdp = fsdp_plugin is not None or fsdp_env is not None
    if use_ds and use_fsdp:
        ds_why = "deepspeed_plugin" if deepspeed_plugins is not None else ds_env
        fsdp_why = "fsdp_plugin" if fsdp_plugin is not None else fsdp_env
        raise ValueError(f"DeepSpeed ({ds_why}) and FSDP ({fsdp_why}) were both asked for; choose one")
    if use_ds:
        why = "a DeepSpeedPlugin was given" if deepspeed_plugins is not None else f"{ds_env}=true (accel launch --use_deepspeed)"
        return RunPlan("deepspeed", DistributedType.DEEPSPEED, {"strategy": why})
    if use_fsdp:
        why = "an FSDP plugin was given" if fsdp_plugin is not None else f"{fsdp_env}=true (accel launch --use_fsdp)"
        return RunPlan("fsdp", DistributedType.FSDP, {"strategy": why})
    if num_processes > 1:
        return RunPlan("ddp", DistributedType(backend_distributed_type),
                       {"strategy": f"{num_processes} processes: DistributedDataParallel"})
    return RunPlan("single", DistributedType.NO, {"strategy": "one process"})


def strategy_class(name: str) -> type:
    """The strategy class registered under ``name``."""
    try:
        target = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("accel."):
            raise NotImplementedError(f"the {name!r} strategy is not available in this accel build") from None
        raise
