"""Version floors: the oldest torch (or library) version at which a feature is used.

Values are Accelerate's where it has one (``accelerate.utils.constants``), so a feature switches on at
the same version under either library.
"""

from __future__ import annotations

__all__ = ["FLOORS", "floor"]

#: FSDP2's ``fully_shard`` (public in ``torch.distributed.fsdp`` from 2.6); Accelerate's FSDP2_PYTORCH_VERSION
TORCH_FSDP2 = "2.6.0"
#: FSDP1 with the features Accelerate relies on (its value keeps a pre-release build tag)
TORCH_FSDP = "2.1.0.a0+32f93b1"
#: ``torch.distributed.tensor`` (DTensor) as a public module
TORCH_DTENSOR = "2.5.0"
#: torch tensor parallelism (beta) and the transformers release that drives it
TORCH_TP = "2.3.0"
TRANSFORMERS_TP = "4.52.0"
#: FSDP2-based context parallelism (beta)
TORCH_CP = "2.6.0"
#: DeepSpeed's sequence parallelism (beta)
DEEPSPEED_SP = "0.18.2"
#: torchrun's ``--log-line-prefix-template``
TORCH_ELASTIC_LOG_LINE_PREFIX = "2.2.0"
#: profiling an xpu / an MTIA device with ``torch.profiler``
TORCH_XPU_PROFILING = "2.4.0"
TORCH_MTIA_PROFILING = "2.1.0"
#: ``torch.load(weights_only=True)`` with an allow-list of globals
TORCH_WEIGHTS_ONLY = "2.4.0"
#: ``torch.distributed.pipelining`` (pipeline parallelism)
TORCH_PIPELINING = "2.4.0"
#: torchao with ``convert_to_float8_training`` (the fp8 "AO" backend)
TORCHAO_FP8 = "0.6.1"
#: torchdata with ``StatefulDataLoader``
TORCHDATA_STATEFUL = "0.8.0"
#: bitsandbytes with 8-bit and with 4-bit layers
BITSANDBYTES_8BIT = "0.37.2"
BITSANDBYTES_4BIT = "0.39.0"
#: Transformer Engine with MXFP8 block-scaling recipes
TRANSFORMER_ENGINE_MXFP8 = "2.0.0"
#: Linux kernels older than this can hang multi-process runs
LINUX_KERNEL = "5.5.0"

#: name -> (what it gates, version); the table ``accel env`` and the docs read
FLOORS: dict[str, tuple[str, str]] = {
    "TORCH_FSDP2": ("torch for FSDP2 (fully_shard)", TORCH_FSDP2),
    "TORCH_FSDP": ("torch for FSDP1", TORCH_FSDP),
    "TORCH_DTENSOR": ("torch for DTensor", TORCH_DTENSOR),
    "TORCH_TP": ("torch for tensor parallelism", TORCH_TP),
    "TRANSFORMERS_TP": ("transformers for tensor parallelism", TRANSFORMERS_TP),
    "TORCH_CP": ("torch for context parallelism", TORCH_CP),
    "DEEPSPEED_SP": ("DeepSpeed for sequence parallelism", DEEPSPEED_SP),
    "TORCH_ELASTIC_LOG_LINE_PREFIX": ("torch for torchrun's log line prefix template", TORCH_ELASTIC_LOG_LINE_PREFIX),
    "TORCH_XPU_PROFILING": ("torch for profiling an xpu", TORCH_XPU_PROFILING),
    "TORCH_MTIA_PROFILING": ("torch for profiling an MTIA device", TORCH_MTIA_PROFILING),
    "TORCH_WEIGHTS_ONLY": ("torch for weights-only loading", TORCH_WEIGHTS_ONLY),
    "TORCH_PIPELINING": ("torch for pipeline parallelism", TORCH_PIPELINING),
    "TORCHAO_FP8": ("torchao for fp8 training", TORCHAO_FP8),
    "TORCHDATA_STATEFUL": ("torchdata for StatefulDataLoader", TORCHDATA_STATEFUL),
    "BITSANDBYTES_8BIT": ("bitsandbytes for 8-bit layers", BITSANDBYTES_8BIT),
    "BITSANDBYTES_4BIT": ("bitsandbytes for 4-bit layers", BITSANDBYTES_4BIT),
    "TRANSFORMER_ENGINE_MXFP8": ("Transformer Engine for MXFP8", TRANSFORMER_ENGINE_MXFP8),
    "LINUX_KERNEL": ("Linux kernel for multi-process runs", LINUX_KERNEL),
}

__all__ += list(FLOORS)


def floor(name: str) -> str:
    """The version floor ``name`` (a key of :data:`FLOORS`); KeyError naming the known floors."""
    try:
        return FLOORS[name][1]
    except KeyError:
        raise KeyError(f"no version floor named {name!r}; known: {', '.join(FLOORS)}") from None
