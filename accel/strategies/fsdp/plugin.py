"""The FSDP plugin with Accelerate's name, fields and ``FSDP_*`` variables.

``FullyShardedDataParallelPlugin`` describes how the FSDP strategy (this package) wraps a
model: FSDP2 (``fully_shard``, per-parameter sharding, the default of ``fsdp_version=2``) or FSDP1
(``FullyShardedDataParallel``, flat parameters). Values not passed come from the environment that
``accel launch --use_fsdp --fsdp_*`` (and ``accelerate launch``) sets, with Accelerate's defaults.

torch.distributed.fsdp is imported inside the methods, so importing this module (and ``accel``) stays cheap.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

import torch

from ...facts.environment import env_flag, parse_bool
from ...utils.constants import (
    FSDP2_PYTORCH_VERSION,
    FSDP_AUTO_WRAP_POLICY,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGY,
)
from ...utils.imports import is_torch_version

__all__ = ["FullyShardedDataParallelPlugin", "get_module_class_from_name", "materialise_on_rank_device"]

logger = logging.getLogger(__name__)

_PREFIX = "FSDP_"


def _env(name: str, default: Any = None) -> Any:
    """The launcher's ``FSDP_<name>`` variable, ``default`` when unset."""
    return os.environ.get(_PREFIX + name, default)


def _env_bool(name: str, default: bool = False) -> bool:
    """The yes/no variable ``FSDP_<name>``; a word that is neither is a ValueError naming it."""
    return env_flag(_PREFIX + name, default=default)


def _torch_at_least(version: str) -> bool:
    """Whether the installed torch is ``version`` or newer."""
    return is_torch_version(">=", version)


def get_module_class_from_name(module: torch.nn.Module, name: str) -> type | None:
    """The class of the first submodule of ``module`` (itself included) whose class is called ``name``, or None."""
    for sub in module.modules():
        if type(sub).__name__ == name:
            return type(sub)
    return None


def _enum_from(value: Any, enum: Any, names: list[str], what: str) -> Any:
    """``value`` (an enum member, its name in any case, its 1-based index in ``names`` or that index as text) as ``enum``."""
    if isinstance(value, enum):
        return value
    text = str(value).strip()
    if text.upper() in names:
        return enum[text.upper()] if text.upper() in enum.__members__ else enum(names.index(text.upper()) + 1)
    if text.isdigit():
        return enum(int(text))
    raise ValueError(f"{what} must be one of {names} (or 1..{len(names)}), got {value!r}")


@dataclass
class FullyShardedDataParallelPlugin:
    """Fully sharded data parallelism (FSDP) settings, as Accelerate's plugin of the same name.

    ``fsdp_version=2`` shards every parameter with ``torch.distributed.fsdp.fully_shard`` (DTensor
    parameters, ``reshard_after_forward`` a bool); ``fsdp_version=1`` wraps modules in
    ``FullyShardedDataParallel`` (``sharding_strategy`` / ``reshard_after_forward`` a ShardingStrategy).
    Fields left None take the ``FSDP_*`` environment variable of the same name, then Accelerate's default.
    """

    fsdp_version: int = field(default=None, metadata={"help": "1 (FullyShardedDataParallel) or 2 (fully_shard). Default: FSDP_VERSION, else 1."})
    sharding_strategy: Any = field(default=None, metadata={"help": "FSDP1 ShardingStrategy (deprecated for reshard_after_forward)."})
    reshard_after_forward: Any = field(default=None, metadata={"help": "FSDP2: bool; FSDP1: a ShardingStrategy. Default True / FULL_SHARD."})
    backward_prefetch: Any = field(default=None, metadata={"help": "FSDP1 BackwardPrefetch; None in FSDP2."})
    mixed_precision_policy: Any = field(default=None, metadata={"help": "dict, dtype name, MixedPrecision (FSDP1) or MixedPrecisionPolicy (FSDP2)."})
    auto_wrap_policy: Optional[Union[Callable, str]] = field(default=None, metadata={"help": "transformer_based_wrap, size_based_wrap, no_wrap or a callable."})
    cpu_offload: Any = field(default=None, metadata={"help": "bool, CPUOffload (FSDP1) or OffloadPolicy (FSDP2)."})
    ignored_modules: Optional[Union[Iterable[torch.nn.Module], str]] = field(default=None, metadata={"help": "Modules (or a regex of their names) FSDP leaves alone."})
    state_dict_type: Any = field(default=None, metadata={"help": "FULL_STATE_DICT or SHARDED_STATE_DICT (LOCAL_STATE_DICT: FSDP1 only)."})
    state_dict_config: Any = field(default=None, metadata={"help": "Derived from state_dict_type when not given."})
    optim_state_dict_config: Any = field(default=None, metadata={"help": "Derived from state_dict_type when not given."})
    limit_all_gathers: bool = field(default=True, metadata={"help": "FSDP1: rate-limit in-flight all-gathers."})
    use_orig_params: Optional[bool] = field(default=None, metadata={"help": "FSDP1: expose the original parameters (FSDP2 always does)."})
    param_init_fn: Optional[Callable[[torch.nn.Module], None]] = field(default=None, metadata={"help": "FSDP1: materialise meta modules."})
    sync_module_states: Optional[bool] = field(default=None, metadata={"help": "FSDP1: broadcast rank 0's weights at wrap time."})
    forward_prefetch: bool = field(default=None, metadata={"help": "FSDP1: prefetch the next all-gather in forward."})
    activation_checkpointing: bool = field(default=None, metadata={"help": "Recompute activations of wrapped layers in backward."})
    activation_checkpointing_offload: bool = field(default=None, metadata={"help": "FSDP2: offload checkpointed inputs to CPU."})
    cpu_ram_efficient_loading: bool = field(default=None, metadata={"help": "Only rank 0 holds real weights before sharding; the others get them from it."})
    transformer_cls_names_to_wrap: Optional[list[str]] = field(default=None, metadata={"help": "Layer classes to wrap (transformer_based_wrap)."})
    min_num_params: Optional[int] = field(default=None, metadata={"help": "Parameter count from which a module is wrapped (size_based_wrap)."})

    def __post_init__(self) -> None:
        notes: set[str] = set()
        if self.fsdp_version is None:
            self.fsdp_version = int(_env("VERSION", "1"))
        self.fsdp_version = int(self.fsdp_version)
        if self.fsdp_version not in (1, 2):
            raise ValueError(f"fsdp_version must be 1 or 2, got {self.fsdp_version}")
        if self.fsdp_version == 2 and not _torch_at_least(FSDP2_PYTORCH_VERSION):
            raise ImportError(f"FSDP2 requires PyTorch >= {FSDP2_PYTORCH_VERSION}")
        fsdp2 = self.fsdp_version == 2
        self._settle_sharding(notes)

        if self.cpu_offload is None:
            self.cpu_offload = _env_bool("OFFLOAD_PARAMS")
        self.set_cpu_offload()
        self.validate_cpu_offload()

        self._settle_backward_prefetch(notes)
        self.set_state_dict_type()
        self._settle_auto_wrap()

        if self.use_orig_params is None and not fsdp2:
            self.use_orig_params = _env_bool("USE_ORIG_PARAMS")
        if fsdp2 and self.use_orig_params is not None:
            notes.add("use_orig_params is obsolete in FSDP2, as FSDP2 always uses the original parameters.")
            self.use_orig_params = None
        if self.sync_module_states is None and not fsdp2:
            self.sync_module_states = _env_bool("SYNC_MODULE_STATES")
        if fsdp2 and self.sync_module_states is not None:
            notes.add("sync_module_states is obsolete in FSDP2, as it is not needed anymore. Setting sync_module_states to None.")
            self.sync_module_states = None
        if self.forward_prefetch is None and not fsdp2:
            self.forward_prefetch = _env_bool("FORWARD_PREFETCH")
        if fsdp2 and self.forward_prefetch is not None:
            raise ValueError("forward_prefetch is not yet implemented in FSDP2, set to None or use `fsdp_version=1`")

        if self.activation_checkpointing is None:
            self.activation_checkpointing = _env_bool("ACTIVATION_CHECKPOINTING")
        if self.activation_checkpointing_offload is None:
            self.activation_checkpointing_offload = _env_bool("ACTIVATION_CHECKPOINTING_OFFLOAD")
        if self.activation_checkpointing_offload and not self.activation_checkpointing:
            raise ValueError("`activation_checkpointing_offload=True` requires `activation_checkpointing=True`.")
        if self.activation_checkpointing_offload and not fsdp2:
            raise ValueError("`activation_checkpointing_offload=True` requires `fsdp_version=2`.")

        if self.ignored_modules is None:
            self.ignored_modules = _env("IGNORED_MODULES")

        if self.cpu_ram_efficient_loading is None:
            self.cpu_ram_efficient_loading = _env_bool("CPU_RAM_EFFICIENT_LOADING")
        else:  # transformers' from_pretrained reads the variable to load on rank 0 only
            os.environ[_PREFIX + "CPU_RAM_EFFICIENT_LOADING"] = str(bool(self.cpu_ram_efficient_loading))
        if not fsdp2 and self.cpu_ram_efficient_loading and not self.sync_module_states:
            warnings.warn("sync_module_states cannot be False since efficient cpu ram loading enabled. "
                          "Setting sync_module_states to True.")
            self.sync_module_states = True

        if isinstance(self.mixed_precision_policy, str):
            self.set_mixed_precision(self.mixed_precision_policy, override=True)
        elif isinstance(self.mixed_precision_policy, dict):
            self.set_mixed_precision(self.mixed_precision_policy)
        if self.mixed_precision_policy is not None:
            self.validate_mixed_precision_policy()

        if self.sync_module_states and self.param_init_fn is None:
            # modules left on the meta device (cpu_ram_efficient_loading) are materialised on this rank's device
            self.param_init_fn = materialise_on_rank_device
        if notes:
            logger.warning("Multiple deprecation warnings due to FSDP2 conversion:\n%s", "\n".join(sorted(notes)))

    # ------------------------------------------------------------------ pieces of __post_init__
    def _settle_sharding(self, notes: set[str]) -> None:
        from torch.distributed.fsdp import ShardingStrategy

        fsdp2 = self.fsdp_version == 2
        if self.sharding_strategy is not None:
            notes.add("sharding_strategy is deprecated in favor of reshard_after_forward. "
                      "This will be removed in a future version of Accelerate.")
        if not fsdp2:
            if self.sharding_strategy is None:
                self.sharding_strategy = _env("SHARDING_STRATEGY", "FULL_SHARD")
            self.sharding_strategy = _enum_from(self.sharding_strategy, ShardingStrategy, FSDP_SHARDING_STRATEGY, "sharding_strategy")
        if self.reshard_after_forward is None and self.sharding_strategy is None:
            self.reshard_after_forward = _env("RESHARD_AFTER_FORWARD", "true" if fsdp2 else "FULL_SHARD")
        if isinstance(self.reshard_after_forward, str):
            if fsdp2:
                self.reshard_after_forward = parse_bool(self.reshard_after_forward, "reshard_after_forward")
            else:
                self.reshard_after_forward = _enum_from(self.reshard_after_forward, ShardingStrategy,
                                                        FSDP_SHARDING_STRATEGY, "reshard_after_forward")
        if fsdp2 and self.reshard_after_forward is not None and not isinstance(self.reshard_after_forward, bool):
            raise ValueError(f"reshard_after_forward set to {self.reshard_after_forward}. This is not supported with FSDP2, "
                             "please set to a `bool`")
        if not fsdp2 and isinstance(self.reshard_after_forward, bool):
            raise ValueError(
                f"reshard_after_forward set to {self.reshard_after_forward}. This is not supported with FSDP1, please set to "
                "a `str` or an instance of `torch.distributed.fsdp.fully_sharded_data_parallel.ShardingStrategy`"
            )

    def _settle_backward_prefetch(self, notes: set[str]) -> None:
        from torch.distributed.fsdp import BackwardPrefetch

        if self.backward_prefetch is None:
            self.backward_prefetch = _env("BACKWARD_PREFETCH")
        if isinstance(self.backward_prefetch, str) and self.backward_prefetch.upper() == "NO_PREFETCH":
            self.backward_prefetch = None
        if self.backward_prefetch is not None:
            self.backward_prefetch = _enum_from(self.backward_prefetch, BackwardPrefetch, FSDP_BACKWARD_PREFETCH[:2],
                                                "backward_prefetch")
        if self.fsdp_version == 2 and self.backward_prefetch is not None:
            notes.add("backward_prefetch is not supported in FSDP2. Setting backward prefetch to None.")
            self.backward_prefetch = None

    def _settle_auto_wrap(self) -> None:
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

        if self.auto_wrap_policy is None:
            self.auto_wrap_policy = _env("AUTO_WRAP_POLICY", "NO_WRAP")
        if not isinstance(self.auto_wrap_policy, str):
            return
        name = self.auto_wrap_policy.upper()
        if name not in FSDP_AUTO_WRAP_POLICY:
            raise ValueError(f"Invalid auto wrap policy: {self.auto_wrap_policy}. Must be one of {FSDP_AUTO_WRAP_POLICY}")
        if name == "TRANSFORMER_BASED_WRAP":
            self.auto_wrap_policy = transformer_auto_wrap_policy
            if self.transformer_cls_names_to_wrap is None:
                self.transformer_cls_names_to_wrap = _env("TRANSFORMER_CLS_TO_WRAP")
            if isinstance(self.transformer_cls_names_to_wrap, str):
                self.transformer_cls_names_to_wrap = [n.strip() for n in self.transformer_cls_names_to_wrap.split(",") if n.strip()]
        elif name == "SIZE_BASED_WRAP":
            self.auto_wrap_policy = size_based_auto_wrap_policy
            if self.min_num_params is None:
                self.min_num_params = int(_env("MIN_NUM_PARAMS", 0))
            elif not isinstance(self.min_num_params, int):
                raise ValueError(f"`min_num_params` must be an integer. Got {self.min_num_params} of type {type(self.min_num_params)}")
        else:
            self.auto_wrap_policy = None

    # ------------------------------------------------------------------ Accelerate's public methods
    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """Set ``state_dict_type`` (default FSDP_STATE_DICT_TYPE, else FULL for FSDP1 / SHARDED for FSDP2) and its configs."""
        from torch.distributed.fsdp.fully_sharded_data_parallel import (
            FullOptimStateDictConfig,
            FullStateDictConfig,
            ShardedOptimStateDictConfig,
            ShardedStateDictConfig,
            StateDictType,
        )

        if state_dict_type is not None:
            self.state_dict_type = state_dict_type
        if self.state_dict_type is None:
            self.state_dict_type = os.environ.get("FSDP_STATE_DICT_TYPE",
                                                  "FULL_STATE_DICT" if self.fsdp_version == 1 else "SHARDED_STATE_DICT")
        if isinstance(self.state_dict_type, str):
            text = self.state_dict_type.strip()
            if text.isdigit():
                self.state_dict_type = StateDictType(int(text))
            elif text.upper() in StateDictType.__members__:
                self.state_dict_type = StateDictType[text.upper()]
            else:
                raise ValueError(f"state_dict_type must be one of {list(StateDictType.__members__)}, got {text!r}")
        if self.state_dict_type == StateDictType.FULL_STATE_DICT:
            if self.state_dict_config is None:
                self.state_dict_config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
            if self.optim_state_dict_config is None:
                self.optim_state_dict_config = FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True)
        elif self.state_dict_type == StateDictType.SHARDED_STATE_DICT:
            if self.state_dict_config is None:
                self.state_dict_config = ShardedStateDictConfig(offload_to_cpu=True)
            if self.optim_state_dict_config is None:
                self.optim_state_dict_config = ShardedOptimStateDictConfig(offload_to_cpu=True)
        if self.fsdp_version == 2 and self.state_dict_type == StateDictType.LOCAL_STATE_DICT:
            raise ValueError("FSDP2 does not support LOCAL_STATE_DICT. "
                             "Please set `fsdp_state_dict_type` to `SHARDED_STATE_DICT` or `FULL_STATE_DICT`.")

    def set_auto_wrap_policy(self, model: torch.nn.Module) -> None:
        """Bind the wrap policy to ``model``: the named layer classes (default: its ``_no_split_modules``) or the size.

        A class name that no submodule of ``model`` has is a ValueError naming it.
        """
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

        if self.auto_wrap_policy is transformer_auto_wrap_policy:
            classes = self._wrap_classes(model)
            self.auto_wrap_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=set(classes))
        elif self.auto_wrap_policy is size_based_auto_wrap_policy:
            if self.min_num_params and self.min_num_params > 0:
                self.auto_wrap_policy = functools.partial(size_based_auto_wrap_policy, min_num_params=self.min_num_params)
            else:
                self.auto_wrap_policy = None

    def _wrap_classes(self, model: torch.nn.Module) -> tuple[type, ...]:
        """The classes ``transformer_cls_names_to_wrap`` names (default: the model's ``_no_split_modules``) in ``model``."""
        names = self.transformer_cls_names_to_wrap
        if names is None:
            names = list(getattr(model, "_no_split_modules", None) or [])
            self.transformer_cls_names_to_wrap = names
        classes = []
        for name in names:
            cls = get_module_class_from_name(model, name)
            if cls is None:
                present = sorted({type(m).__name__ for m in model.modules()})
                raise ValueError(f"Could not find the transformer layer class {name} in the model "
                                 f"(transformer_cls_names_to_wrap; the model has: {', '.join(present)}).")
            classes.append(cls)
        return tuple(classes)

    def set_mixed_precision(self, mixed_precision: Any, buffer_autocast: bool = False, override: bool = False) -> None:
        """Set the FSDP mixed precision policy from a dtype name (fp16, bf16, fp32, fp8→bf16), a dtype or a dict."""
        mapping = {"fp8": torch.bfloat16, "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
        dtype = mixed_precision
        if isinstance(mixed_precision, str):
            dtype = mapping.get(mixed_precision)
            if dtype is None:
                raise ValueError(f"Invalid mixed precision: {mixed_precision}. Must be one of {list(mapping.keys())}")
        elif isinstance(mixed_precision, torch.dtype) and mixed_precision not in mapping.values():
            raise ValueError(f"Invalid mixed precision: {mixed_precision}. Must be one of {list(mapping.values())}")
        policy_cls = self._policy_class()
        if override or self.mixed_precision_policy is None:
            kwargs = {"param_dtype": dtype, "reduce_dtype": dtype}
            if self.fsdp_version == 1:
                kwargs["buffer_dtype"] = torch.float32 if buffer_autocast else dtype
            else:
                kwargs["output_dtype"] = dtype
            self.mixed_precision_policy = policy_cls(**kwargs)
        elif isinstance(self.mixed_precision_policy, dict):
            valid = ["param_dtype", "reduce_dtype"] + (["buffer_dtype"] if self.fsdp_version == 1 else ["output_dtype"])
            missing = [k for k in valid if k not in self.mixed_precision_policy]
            bad = [k for k, v in self.mixed_precision_policy.items() if v not in mapping.values()]
            if missing or bad:
                raise ValueError(f"Invalid mixed precision policy: {self.mixed_precision_policy}. Must be a `dict` with keys "
                                 f"{valid}.Values must be one of {list(mapping.values())}")
            self.mixed_precision_policy = policy_cls(**self.mixed_precision_policy)

    def _policy_class(self) -> type:
        if self.fsdp_version == 2:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            return MixedPrecisionPolicy
        from torch.distributed.fsdp import MixedPrecision

        return MixedPrecision

    def validate_mixed_precision_policy(self) -> None:
        """ValueError unless the policy is FSDP2's MixedPrecisionPolicy (version 2) or FSDP1's MixedPrecision."""
        if not isinstance(self.mixed_precision_policy, self._policy_class()):
            required = ("`torch.distributed.fsdp.MixedPrecisionPolicy`" if self.fsdp_version == 2
                        else "`torch.distributed.fsdp.MixedPrecision`")
            raise ValueError(f"mixed_precision_policy must be an instance of {required}.")

    def set_cpu_offload(self) -> None:
        """Turn a bool ``cpu_offload`` into FSDP2's OffloadPolicy/CPUOffloadPolicy or FSDP1's CPUOffload."""
        if not isinstance(self.cpu_offload, bool):
            return
        if self.fsdp_version == 2:
            from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

            self.cpu_offload = CPUOffloadPolicy() if self.cpu_offload else OffloadPolicy()
        else:
            from torch.distributed.fsdp import CPUOffload

            self.cpu_offload = CPUOffload(offload_params=self.cpu_offload)

    def validate_cpu_offload(self) -> None:
        """ValueError when ``cpu_offload`` is not the offload type of this FSDP version."""
        if self.fsdp_version == 2:
            from torch.distributed.fsdp import OffloadPolicy

            if not isinstance(self.cpu_offload, OffloadPolicy):
                raise ValueError(f"`cpu_offload` must be an instance of `torch.distributed.fsdp.OffloadPolicy` in FSDP2, got {self.cpu_offload}")
        else:
            from torch.distributed.fsdp import CPUOffload

            if not isinstance(self.cpu_offload, CPUOffload):
                raise ValueError(f"`cpu_offload` must be an instance of `torch.distributed.fsdp.CPUOffload` in FSDP1, got {self.cpu_offload}")

    # ------------------------------------------------------------------ accel helpers
    @property
    def offloads_params(self) -> bool:
        """Whether parameters live on the CPU between uses."""
        from torch.distributed.fsdp import CPUOffloadPolicy

        if self.fsdp_version == 2:
            return isinstance(self.cpu_offload, CPUOffloadPolicy)
        return bool(getattr(self.cpu_offload, "offload_params", False))

    @property
    def is_sharded_state_dict(self) -> bool:
        """True when checkpoints are written as DCP shards (SHARDED_STATE_DICT)."""
        from torch.distributed.fsdp import StateDictType

        return self.state_dict_type == StateDictType.SHARDED_STATE_DICT


def materialise_on_rank_device(module: torch.nn.Module, device: Any = None) -> None:
    """``param_init_fn`` for sync_module_states: empty storage for a meta module on ``device`` (rank 0's weights
    arrive by broadcast). The FSDP strategy passes the rank's device; without one, the active backend's current
    device is used (as Accelerate uses the device module's current device)."""
    if device is None:
        from ...backends import get_backend

        device = get_backend().device()
    module.to_empty(device=device, recurse=False)
