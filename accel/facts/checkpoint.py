"""Checkpoint file names: Accelerate's (``accelerate.utils.constants``), so checkpoints written by either
library share one layout, plus the offload folder's index."""

from __future__ import annotations

__all__ = [
    "CUSTOM_NAME", "DATALOADER_STATE_NAME", "FSDP_MODEL_NAME", "MODEL_NAME", "OFFLOAD_INDEX_NAME", "OPTIMIZER_NAME",
    "PROFILE_PATTERN_NAME", "RNG_STATE_NAME", "SAFE_MODEL_NAME", "SAFE_WEIGHTS_INDEX_NAME", "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME", "SAMPLER_NAME", "SCALER_NAME", "SCHEDULER_NAME", "WEIGHTS_INDEX_NAME", "WEIGHTS_NAME",
    "WEIGHTS_PATTERN_NAME", "index_suffix",
]

MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
WEIGHTS_PATTERN_NAME = MODEL_NAME + "{suffix}.bin"
SAFE_WEIGHTS_PATTERN_NAME = SAFE_MODEL_NAME + "{suffix}.safetensors"
FSDP_MODEL_NAME = f"{MODEL_NAME}_fsdp"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"
DATALOADER_STATE_NAME = "dl_state_dict"
CUSTOM_NAME = "custom_checkpoint"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"
#: the index of an offload folder (big-model inference: one ``.dat`` file per tensor plus this index)
OFFLOAD_INDEX_NAME = "index.json"


def index_suffix(i: int) -> str:
    """Accelerate's suffix of the i-th object's file: nothing for the first, ``_{i}`` after it."""
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
        raise ValueError(f"a checkpoint object index must be a non-negative integer, got {i!r}")
    return f"_{i}" if i > 0 else ""
