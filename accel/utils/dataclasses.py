"""Enums, plug-in dataclasses and kwargs handlers with Accelerate's names and fields."""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass
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


__all__ = [
    "ComputeEnvironment",
    "DataLoaderConfiguration",
    "DistributedType",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "PrecisionType",
    "RNGType",
]
