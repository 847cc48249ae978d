"""Fixed names and versions with Accelerate's module path (``accelerate.utils.constants``).

Checkpoint file names and minimum versions come from :mod:`accel.facts` (Accelerate's values, under
Accelerate's names here); the ``BETA_*`` versions are the minimum versions at which a feature is enabled.
"""

from __future__ import annotations

import operator

import torch

from ..facts import versions

# ---------------------------------------------------------------------------- checkpoint file names
from ..facts.checkpoint import (  # noqa: E402 - Accelerate's names, from the one table
    DATALOADER_STATE_NAME, FSDP_MODEL_NAME, MODEL_NAME, OPTIMIZER_NAME, PROFILE_PATTERN_NAME, RNG_STATE_NAME,
    SAFE_MODEL_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_PATTERN_NAME, SAMPLER_NAME, SCALER_NAME,
    SCHEDULER_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_PATTERN_NAME,
)

# ---------------------------------------------------------------------------- option lists
FSDP_SHARDING_STRATEGY = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
DEEPSPEED_MULTINODE_LAUNCHERS = ["pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm"]
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]

# ---------------------------------------------------------------------------- SageMaker launch defaults
SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_PYTHON_VERSION = "py38"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]

# ---------------------------------------------------------------------------- minimum versions (accel.facts.versions)
FSDP_PYTORCH_VERSION = versions.TORCH_FSDP
FSDP2_PYTORCH_VERSION = versions.TORCH_FSDP2
DTENSOR_PYTORCH_VERSION = versions.TORCH_DTENSOR
ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION = versions.TORCH_ELASTIC_LOG_LINE_PREFIX
XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = versions.TORCH_XPU_PROFILING
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = versions.TORCH_MTIA_PROFILING
BETA_TP_AVAILABLE_PYTORCH_VERSION = versions.TORCH_TP
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = versions.TRANSFORMERS_TP
BETA_CP_AVAILABLE_PYTORCH_VERSION = versions.TORCH_CP
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = versions.DEEPSPEED_SP

STR_OPERATION_TO_FUNC = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
                         "<=": operator.le, "<": operator.lt}

#: torchrun's own options (``accel launch`` passes these through)
TORCH_LAUNCH_PARAMS = [
    "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "standalone",
    "max_restarts", "monitor_interval", "start_method", "role", "module", "m", "no_python", "run_path",
    "log_dir", "r", "redirects", "t", "tee", "node_rank", "master_addr", "master_port",
]

CUDA_DISTRIBUTED_TYPES = ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"]
TORCH_DISTRIBUTED_OPERATION_TYPES = CUDA_DISTRIBUTED_TYPES + [
    "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_CPU", "MULTI_HPU", "MULTI_NEURON",
]

#: layers whose weights layerwise casting upcasts for compute
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = (
    torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
    torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d,
    torch.nn.Linear,
)
