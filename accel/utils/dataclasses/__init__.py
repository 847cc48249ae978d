"""Enums, plug-in dataclasses and kwargs handlers with Accelerate's names and fields."""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from ._base import BaseEnum, EnumWithContains, KwargsHandler
from ._base import StrValueEnum as _StrEnum
from ._base import env_bool as _env_bool
from ._base import env_suffix as _env_suffix
from ._fp8 import (
    AmaxComputeAlgorithm,
    AORecipeKwargs,
    Backend,
    FP8BackendType,
    FP8Format,
    FP8RecipeKwargs,
    MSAMPRecipeKwargs,
    OptLevel,
    TERecipeKwargs,
)


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

    @property
    def is_multi_device_data_parallel(self) -> bool:
        """Whether processes run plain data parallelism (DDP) over devices or hosts: the ``MULTI_*`` types.

        Those are the types where DDP can join uneven inputs (MULTI_CPU included: gloo joins too).
        """
        return self.name.startswith("MULTI_")


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


class SageMakerDistributedType(_StrEnum):
    """How SageMaker distributes a job: not at all, SageMaker data parallelism or model parallelism."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class ComputeEnvironment(_StrEnum):
    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


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
            from ..imports import is_torchdata_stateful_dataloader_available

            if not is_torchdata_stateful_dataloader_available():
                raise ImportError(
                    "use_stateful_dataloader=True needs torchdata >= 0.8.0 (StatefulDataLoader), which is not "
                    "installed: pip install 'torchdata>=0.8.0'"
                )


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


# ---------------------------------------------------------------------------- compile, profiling, fp8, quantization


class CustomDtype(enum.Enum):
    """Sizes of weights below one byte (or special 8-bit) that device-map planning must count."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


class DynamoBackend(_StrEnum):
    """``torch.compile`` backends by Accelerate's upper-case names (``TorchDynamoPlugin.backend``)."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """How ``prepare`` compiles models with ``torch.compile``.

    Unset fields come from ``ACCEL_DYNAMO_*`` (or Accelerate's ``ACCELERATE_DYNAMO_*``): ``BACKEND``
    (default "no": no compilation), ``MODE`` ("default"), ``USE_FULLGRAPH``, ``USE_DYNAMIC``,
    ``USE_REGIONAL_COMPILATION``. ``to_kwargs()`` gives the ``torch.compile`` arguments that differ
    from the defaults (``use_regional_compilation`` is accel's choice, not a compile argument).
    """

    backend: DynamoBackend | str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = _env_suffix("DYNAMO_BACKEND", "no")
        try:
            self.backend = DynamoBackend(str(getattr(self.backend, "value", self.backend)).upper())
        except ValueError:
            raise ValueError(f"unknown dynamo backend {self.backend!r}; known: {', '.join(m.value.lower() for m in DynamoBackend)}") from None
        if self.mode is None:
            self.mode = _env_suffix("DYNAMO_MODE", "default")
        if self.fullgraph is None:
            self.fullgraph = _env_bool("DYNAMO_USE_FULLGRAPH")
        if self.use_regional_compilation is None:
            self.use_regional_compilation = _env_bool("DYNAMO_USE_REGIONAL_COMPILATION")
        if self.dynamic is None and _env_suffix("DYNAMO_USE_DYNAMIC") is not None:
            self.dynamic = _env_bool("DYNAMO_USE_DYNAMIC")

    def to_dict(self) -> dict[str, Any]:
        """The fields, with ``backend`` as the lower-case name ``torch.compile`` takes."""
        values = copy.deepcopy(self.__dict__)
        values["backend"] = values["backend"].value.lower()
        return values

    def to_kwargs(self) -> dict[str, Any]:
        """The ``torch.compile`` keyword arguments that differ from the defaults."""
        kwargs = super().to_kwargs()
        kwargs.pop("use_regional_compilation", None)
        return kwargs


#: profiler activity name -> (torch.profiler.ProfilerActivity member, backend that must be available)
_PROFILER_ACTIVITIES = {"cpu": ("CPU", None), "cuda": ("CUDA", "cuda"), "xpu": ("XPU", "xpu"),
                        "hpu": ("HPU", "hpu"), "mtia": ("MTIA", "mtia")}


@dataclass
class ProfileKwargs(KwargsHandler):
    """Arguments for ``torch.profiler.profile`` used by ``Accelerator.profile()``.

    ``activities``: names among "cpu", "cuda", "xpu", "hpu", "mtia" (a device activity needs its
    backend available); ``schedule_option``: arguments of ``torch.profiler.schedule``;
    ``output_trace_dir``: where ``Accelerator.profile`` writes a Chrome trace per process.
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Any = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def _get_profiler_activity(self, activity: str) -> Any:
        """The ``torch.profiler.ProfilerActivity`` for ``activity``; ValueError naming why it cannot be used."""
        import torch

        if activity not in _PROFILER_ACTIVITIES:
            raise ValueError(f"Invalid profiler activity: {activity}. Must be one of {list(_PROFILER_ACTIVITIES)}.")
        member, backend_name = _PROFILER_ACTIVITIES[activity]
        value = getattr(torch.profiler.ProfilerActivity, member, None)
        if value is None:
            raise ValueError(f"profiler activity {activity!r} is not supported by torch {torch.__version__}")
        if backend_name is not None:
            from ..imports import _backend_available

            if not _backend_available(backend_name):
                raise ValueError(f"profiler activity {activity!r} needs the {backend_name} backend, which is not available")
        return value

    def build(self) -> Any:
        """A ``torch.profiler.profile`` configured from these fields (not started)."""
        import torch

        activities = None if self.activities is None else [self._get_profiler_activity(a) for a in self.activities]
        schedule = None if self.schedule_option is None else torch.profiler.schedule(**self.schedule_option)
        return torch.profiler.profile(
            activities=activities, schedule=schedule, on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes, profile_memory=self.profile_memory, with_stack=self.with_stack,
            with_flops=self.with_flops, with_modules=self.with_modules,
        )


#: the activities ``ProfileKwargs(activities=...)`` accepts
ProfilerActivity = Literal["cpu", "xpu", "mtia", "cuda", "hpu"]


@dataclass
class BnbQuantizationConfig:
    """How ``load_and_quantize_model`` quantizes with bitsandbytes: 8-bit (LLM.int8) or 4-bit (fp4/nf4).

    Exactly one of ``load_in_8bit``/``load_in_4bit`` must be True. Dtypes may be given as "fp32",
    "fp16", "bf16" or ``torch.dtype``. ``target_dtype`` is set to ``torch.int8`` or
    :attr:`CustomDtype.INT4`.
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp16"
    torch_dtype: Any = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = None

    @staticmethod
    def _dtype(name: str, value: Any) -> Any:
        import torch

        named = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        if isinstance(value, str):
            if value not in named:
                raise ValueError(f"{name} must be in ['fp32','fp16','bf16'] but found {value}")
            return named[value]
        if not isinstance(value, torch.dtype):
            raise ValueError(f"{name} must be a string or a torch.dtype")
        return value

    def __post_init__(self) -> None:
        import torch

        for name in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean")
        if self.load_in_4bit and self.load_in_8bit:
            raise ValueError("load_in_4bit and load_in_8bit can't be both True")
        if not self.load_in_4bit and not self.load_in_8bit:
            raise ValueError("load_in_4bit and load_in_8bit can't be both False")
        if not isinstance(self.llm_int8_threshold, (int, float)) or isinstance(self.llm_int8_threshold, bool):
            raise ValueError("llm_int8_threshold must be a float or an int")
        if not isinstance(self.bnb_4bit_quant_type, str):
            raise ValueError("bnb_4bit_quant_type must be a string")
        if self.bnb_4bit_quant_type not in ("fp4", "nf4"):
            raise ValueError(f"bnb_4bit_quant_type must be in ['fp4','nf4'] but found {self.bnb_4bit_quant_type}")
        self.bnb_4bit_compute_dtype = self._dtype("bnb_4bit_compute_dtype", self.bnb_4bit_compute_dtype)
        if self.skip_modules is not None and not isinstance(self.skip_modules, list):
            raise ValueError("skip_modules must be a list of strings")
        if self.keep_in_fp32_modules is not None and not isinstance(self.keep_in_fp32_modules, list):
            raise ValueError("keep_in_fp_32_modules must be a list of strings")
        self.target_dtype = CustomDtype.INT4 if self.load_in_4bit else torch.int8
        if self.load_in_4bit and self.llm_int8_threshold != 6.0:
            import warnings

            warnings.warn("llm_int8_threshold can only be used for model loaded in 8bit", stacklevel=3)
        if self.torch_dtype is not None:
            self.torch_dtype = self._dtype("torch_dtype", self.torch_dtype)
        if self.skip_modules is not None and not all(isinstance(m, str) for m in self.skip_modules):
            raise ValueError("skip_modules must be a list of strings")

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (a copy)."""
        return copy.deepcopy(self.__dict__)


__all__ = [
    "AORecipeKwargs",
    "BnbQuantizationConfig",
    "CustomDtype",
    "DynamoBackend",
    "FP8BackendType",
    "FP8RecipeKwargs",
    "MSAMPRecipeKwargs",
    "ProfileKwargs",
    "TERecipeKwargs",
    "TorchDynamoPlugin",
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
    "AmaxComputeAlgorithm",
    "Backend",
    "BaseEnum",
    "EnumWithContains",
    "FP8Format",
    "OptLevel",
    "ProfilerActivity",
    "SageMakerDistributedType",
]


# ---------------------------------------------------------------------------------------------------
# Strategy plugins live beside their strategies (accel.utils.deepspeed, ...) and are reachable here too,
# as in Accelerate (``from accel.utils.dataclasses import DeepSpeedPlugin``); resolved on first use so
# this module stays light and free of import cycles.
_PLUGIN_MODULES = {
    "DeepSpeedPlugin": "accel.utils.deepspeed",
    # FSDP and n-D parallelism
    "FullyShardedDataParallelPlugin": "accel.strategies.fsdp.plugin",
    "TorchTensorParallelPlugin": "accel.utils.dataclasses._parallel",
    "TorchContextParallelConfig": "accel.utils.dataclasses._parallel",
    "TorchTensorParallelConfig": "accel.utils.dataclasses._parallel",
    "DeepSpeedSequenceParallelConfig": "accel.utils.dataclasses._parallel",
    "get_module_class_from_name": "accel.strategies.fsdp.plugin",
    "TensorInformation": "accel.utils.operations",
    # Megatron-LM's plugin and its model-config parsers
    **{name: "accel.utils.megatron_lm" for name in (
        "MegatronLMPlugin", "MODEL_CONFIGS_TO_MEGATRON_PARSERS", "add_model_config_to_megatron_parser",
        "parse_bert_config", "parse_gpt2_config", "parse_t5_config", "parse_llama_config", "parse_glm4_moe_config")},
}


def __getattr__(name: str):
    module = _PLUGIN_MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
