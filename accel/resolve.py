"""One place decides how a run goes: which backend, which strategy (and ``DistributedType``), which precision,
which ParallelismConfig, and why.

Inputs, highest first: the Accelerator's arguments (``cpu``, plugins, ``mixed_precision``), then the
environment that ``accel launch`` / ``accelerate launch`` set (``ACCEL_*`` spellings over
``ACCELERATE_*``), then the process layout and what the hardware offers. Every choice carries its
reason, shown by ``accel env`` and ``repr(Accelerator().state)``. The environment variables that
choose a strategy, a precision or a ParallelismConfig are read here and nowhere else; so are the
plugins a launcher asks for through them.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from dataclasses import dataclass, field
from typing import Any

from .facts.environment import env_text, parse_bool
from .utils.dataclasses import DistributedType, PrecisionType

__all__ = [
    "RunPlan",
    "STRATEGIES",
    "plugin_dict",
    "launched_for_deepspeed",
    "resolve",
    "resolve_backend",
    "resolve_parallelism_config",
    "resolve_run",
    "strategy_class",
]

#: strategy name -> "module:Class" (imported on first use, so DeepSpeed/FSDP cost nothing when unused)
STRATEGIES = {
    "single": "accel.strategies.base:SingleDeviceStrategy",
    "ddp": "accel.strategies.ddp:DDPStrategy",
    "deepspeed": "accel.strategies.deepspeed:DeepSpeedStrategy",
    "fsdp": "accel.strategies.fsdp:FSDPStrategy",
}

#: (accel's name, Accelerate's name) of each variable read here
USE_CPU_ENV = ("ACCEL_USE_CPU", "ACCELERATE_USE_CPU")
USE_DEEPSPEED_ENV = ("ACCEL_USE_DEEPSPEED", "ACCELERATE_USE_DEEPSPEED")
USE_FSDP_ENV = ("ACCEL_USE_FSDP", "ACCELERATE_USE_FSDP")
MIXED_PRECISION_ENV = ("ACCEL_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION")
#: Accelerate's only spelling: build a ParallelismConfig from the PARALLELISM_CONFIG_* variables
USE_PARALLELISM_CONFIG_ENV = "ACCELERATE_USE_PARALLELISM_CONFIG"


def _flag(*names: str) -> str | None:
    """The name of the first of ``names`` that is set, when it says yes; None when it says no or none is set.

    A word that is neither yes nor no is a ValueError naming the variable.
    """
    for name in names:
        value = env_text(name)
        if value is not None:
            return name if parse_bool(value, f"environment variable {name}") else None
    return None


def _first_set(*names: str) -> tuple[str, str] | None:
    """``(name, value)`` of the first of ``names`` that is set and not empty."""
    for name in names:
        value = env_text(name)
        if value is not None:
            return name, value
    return None


def launched_for_deepspeed() -> bool:
    """Whether the launcher asked for DeepSpeed (``accel launch --use_deepspeed`` sets ``ACCELERATE_USE_DEEPSPEED``)."""
    return _flag(*USE_DEEPSPEED_ENV) is not None


def resolve_parallelism_config(parallelism_config: Any = None) -> tuple[Any, str | None]:
    """The run's ``ParallelismConfig`` and why: the one given, else one built from the ``PARALLELISM_CONFIG_*``
    variables when the launcher set ``ACCELERATE_USE_PARALLELISM_CONFIG`` (as Accelerate's Accelerator does),
    else None. The reason is None when there is no config."""
    if parallelism_config is not None:
        return parallelism_config, "a ParallelismConfig was given"
    name = _flag(USE_PARALLELISM_CONFIG_ENV)
    if name is None:
        return None, None
    from .parallelism_config import ParallelismConfig

    return ParallelismConfig(), f"{name}=true (accel launch --use_parallelism_config)"


def plugin_dict(plugin: Any) -> dict[str, Any] | None:
    """``deepspeed_plugin`` as Accelerate takes it (one plugin, or ``{name: plugin}`` for several models) as a dict."""
    if plugin is None:
        return None
    from .strategies.deepspeed.config import DeepSpeedPlugin

    plugins = dict(plugin) if isinstance(plugin, dict) else {"default": plugin}
    if not plugins:
        raise ValueError("deepspeed_plugins is an empty dict; give at least one DeepSpeedPlugin")
    wrong = {name: type(p).__name__ for name, p in plugins.items() if not isinstance(p, DeepSpeedPlugin)}
    if wrong:
        raise TypeError(f"deepspeed plugins must be DeepSpeedPlugin objects, got {wrong}")
    return plugins


@dataclass(frozen=True)
class RunPlan:
    """How this run goes, with a reason per choice (``reasons``: backend, strategy, precision).

    ``precision`` is the precision plan that runs (None from :func:`resolve_run`, which decides the
    strategy only); ``requested_precision`` is what was asked before any fallback.
    """

    strategy: str
    distributed_type: DistributedType
    reasons: dict[str, str] = field(default_factory=dict)
    backend: str | None = None
    requested_precision: str | None = None
    precision: Any = field(default=None, compare=False, repr=False)
    deepspeed_plugins: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    fsdp_plugin: Any = field(default=None, compare=False, repr=False)
    parallelism_config: Any = field(default=None, compare=False, repr=False)

    @property
    def mixed_precision(self) -> str:
        """The precision that runs (the requested one when no precision plan was made)."""
        if self.precision is not None:
            return self.precision.used
        return self.requested_precision or "no"

    @property
    def precision_label(self) -> str:
        """The precision as people read it: "fp8 (emulated)" where torchao emulates fp8."""
        return self.precision.label if self.precision is not None else self.mixed_precision

    @property
    def is_fsdp2(self) -> bool:
        """Whether this run shards with FSDP2, as the chosen strategy answers for this plan's FSDP plugin."""
        return strategy_class(self.strategy).shards_with_fsdp2(self.fsdp_plugin)

    def describe(self) -> str:
        """The reasons on one line."""
        return "; ".join(f"{k}: {v}" for k, v in self.reasons.items())


def resolve_backend(cpu: bool = False) -> tuple[Any, str]:
    """The hardware backend this process uses and why: ``cpu=True``, ``ACCEL_USE_CPU``, ``ACCEL_DEVICE``, else detection."""
    from .backends import OVERRIDE_ENV, get_backend

    if cpu:
        return get_backend("cpu"), "cpu=True was passed"
    env = _flag(*USE_CPU_ENV)
    if env is not None:
        return get_backend("cpu"), f"{env}=true (accel launch --cpu)"
    override = os.environ.get(OVERRIDE_ENV, "").strip()
    backend = get_backend()
    if override:
        return backend, f"{OVERRIDE_ENV}={override}"
    return backend, "the first available backend in the probe order"


def resolve_run(num_processes: int, backend_distributed_type: str, *, deepspeed_plugins: Any = None,
                fsdp_plugin: Any = None) -> RunPlan:
    """The strategy for ``num_processes`` ranks on a backend whose multi-process type is given.

    A strategy the launcher's environment asks for comes with its plugin, built here from the same
    environment (``DeepSpeedPlugin()``/``FullyShardedDataParallelPlugin()`` read their own options).
    """
    deepspeed_plugins = plugin_dict(deepspeed_plugins)
    ds_env = _flag(*USE_DEEPSPEED_ENV)
    fsdp_env = _flag(*USE_FSDP_ENV)
    ds_why = "a DeepSpeedPlugin was given" if deepspeed_plugins is not None else (
        f"{ds_env}=true (accel launch --use_deepspeed)" if ds_env else None)
    fsdp_why = "an FSDP plugin was given" if fsdp_plugin is not None else (
        f"{fsdp_env}=true (accel launch --use_fsdp)" if fsdp_env else None)
    if ds_why and fsdp_why:
        raise ValueError(f"DeepSpeed ({ds_why}) and FSDP ({fsdp_why}) were both asked for; choose one")
    if ds_why:
        if deepspeed_plugins is None:
            from .strategies.deepspeed.config import DeepSpeedPlugin

            deepspeed_plugins = {"default": DeepSpeedPlugin()}
        return RunPlan("deepspeed", DistributedType.DEEPSPEED, {"strategy": ds_why}, deepspeed_plugins=deepspeed_plugins)
    if fsdp_why:
        if fsdp_plugin is None:
            from .strategies.fsdp.plugin import FullyShardedDataParallelPlugin

            fsdp_plugin = FullyShardedDataParallelPlugin()
        return RunPlan("fsdp", DistributedType.FSDP, {"strategy": fsdp_why}, fsdp_plugin=fsdp_plugin)
    if num_processes > 1:
        return RunPlan("ddp", DistributedType(backend_distributed_type),
                       {"strategy": f"{num_processes} processes: DistributedDataParallel"})
    return RunPlan("single", DistributedType.NO, {"strategy": "one process"})


def _requested_precision(mixed_precision: Any) -> tuple[str, str]:
    """The precision asked for and where it came from: the argument, the launcher's variable, else none."""
    if mixed_precision is not None:
        value, why = str(mixed_precision).lower(), f"mixed_precision={str(mixed_precision).lower()!r} was passed"
    else:
        found = _first_set(*MIXED_PRECISION_ENV)
        if found is None:
            return "no", "no mixed precision was asked for"
        value, why = found[1].strip().lower(), f"{found[0]}={found[1]} (accel launch --mixed_precision)"
    if value not in PrecisionType.list():
        raise ValueError(f"mixed_precision must be one of {PrecisionType.list()}, got {value!r} ({why})")
    return value, why


def resolve(num_processes: int, backend: Any, *, backend_reason: str = "", mixed_precision: Any = None,
            deepspeed_plugins: Any = None, fsdp_plugin: Any = None, parallelism_config: Any = None,
            autocast_handler: Any = None, scaler_handler: Any = None, fp8_handler: Any = None) -> RunPlan:
    """Backend, strategy, precision and parallelism config for one Accelerator, each with its reason (the one
    call that decides them).

    ``backend`` is the hardware backend the process state chose (see :func:`resolve_backend`). The
    precision plan comes from the chosen strategy (an engine such as DeepSpeed runs its own); a
    fallback is warned about once, here. A ``parallelism`` reason is there only when a config is used.
    """
    run = resolve_run(num_processes, backend.distributed_type, deepspeed_plugins=deepspeed_plugins,
                      fsdp_plugin=fsdp_plugin)
    requested, asked = _requested_precision(mixed_precision)
    if fp8_handler is not None and requested != "fp8" and run.strategy not in ("deepspeed", "fsdp"):
        raise ValueError(f"{type(fp8_handler).__name__} was passed, but mixed_precision is {requested!r}: "
                         "fp8 recipes need mixed_precision='fp8'")
    selected = next(iter(run.deepspeed_plugins.values())) if run.deepspeed_plugins else None
    precision = strategy_class(run.strategy).plan_precision(
        requested, backend, deepspeed_plugin=selected, fsdp_plugin=run.fsdp_plugin,
        autocast_handler=autocast_handler, scaler_handler=scaler_handler, fp8_handler=fp8_handler,
    )
    why = asked
    if precision.reason and requested != "no":
        why += f"; {precision.reason}"
    if precision.used != requested:
        why += f"; {precision.used} runs instead"
    reasons = {
        "backend": f"{backend.name} ({backend_reason})" if backend_reason else backend.name,
        "strategy": run.reasons["strategy"],
        "precision": f"{precision.label} ({why})",
    }
    config, config_why = resolve_parallelism_config(parallelism_config)
    if config_why is not None:
        reasons["parallelism"] = config_why
    return dataclasses.replace(run, reasons=reasons, backend=backend.name, requested_precision=requested,
                               precision=precision, parallelism_config=config)


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
