"""Enums, plug-in dataclasses and kwargs handlers with Accelerate's names and fields."""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any


class _StrEnum(str, enum.Enum):
    """A str-valued enum that compares equal to its value, like Accelerate's."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        return [m.value for m in cls]


class DistributedType(_StrEnum):
    """How the processes of a run are organised."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


class PrecisionType(_StrEnum):
    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class RNGType(_StrEnum):
    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class ComputeEnvironment(_StrEnum):
    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class KwargsHandler:
    """Base of the ``kwargs_handlers`` dataclasses: ``to_kwargs`` returns the non-default fields."""

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        default = self.__class__().to_dict()
        return {k: v for k, v in self.to_dict().items() if default.get(k) != v}


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments for ``torch.distributed.init_process_group``.

    ``backend=None`` (accel's default) lets the active hardware backend choose (gloo, nccl, xccl,
    hccl); Accelerate defaults to "nccl" and then overrides it, which reads as if nccl were used.
    """

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None

    def __post_init__(self) -> None:
        if self.timeout is not None and not isinstance(self.timeout, timedelta):
            raise TypeError(f"InitProcessGroupKwargs.timeout must be a datetime.timedelta, got {type(self.timeout).__name__}")


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if self.num_steps is not None and (not isinstance(self.num_steps, int) or self.num_steps < 1):
            raise ValueError(f"GradientAccumulationPlugin.num_steps must be a positive integer, got {self.num_steps!r}")


@dataclass
class DataLoaderConfiguration:
    """How ``prepare`` shards data loaders across processes."""

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def __post_init__(self) -> None:
        if self.use_stateful_dataloader:
            raise NotImplementedError("use_stateful_dataloader=True is not supported by accel yet (needs torchdata)")


class DDPCommunicationHookType(_StrEnum):
    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class LoggerType(_StrEnum):
    """Trackers ``log_with`` accepts. accel implements "json", "csv" and "tensorboard"."""

    ALL = "all"
    JSON = "json"
    CSV = "csv"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    AIM = "aim"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    TRACKIO = "trackio"


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for ``torch.nn.parallel.DistributedDataParallel``."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.comm_hook = DDPCommunicationHookType(self.comm_hook)
        self.comm_wrapper = DDPCommunicationHookType(self.comm_wrapper)

    def ddp_arguments(self) -> dict[str, Any]:
        """The DistributedDataParallel arguments the user changed (the defaults here are DDP's own,
        and passing a deprecated one such as ``broadcast_buffers`` unchanged would only warn)."""
        names = ("dim", "broadcast_buffers", "bucket_cap_mb", "find_unused_parameters", "check_reduction",
                 "gradient_as_bucket_view", "static_graph")
        return {k: v for k, v in self.to_kwargs().items() if k in names}


@dataclass
class GradScalerKwargs(KwargsHandler):
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class AutocastKwargs(KwargsHandler):
    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class ProjectConfiguration:
    """Where checkpoints and logs go, and how checkpoints are named and rotated."""

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: str | None = None) -> None:
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir

    def __post_init__(self) -> None:
        self.set_directories(self.project_dir)
        if self.total_limit is not None and (not isinstance(self.total_limit, int) or self.total_limit < 1):
            raise ValueError(f"ProjectConfiguration.total_limit must be a positive integer, got {self.total_limit!r}")


__all__ = [
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "LoggerType",
    "ProjectConfiguration",
    "ComputeEnvironment",
    "DataLoaderConfiguration",
    "DistributedType",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "PrecisionType",
    "RNGType",
]
