"""The n-D parallelism settings with Accelerate's names, fields and ``PARALLELISM_CONFIG_*`` variables:
tensor parallelism (``TorchTensorParallelConfig``, the deprecated ``TorchTensorParallelPlugin``), context
parallelism (``TorchContextParallelConfig``) and DeepSpeed sequence parallelism
(``DeepSpeedSequenceParallelConfig``). ``accel.parallelism_config.ParallelismConfig`` holds them; they
live here because Accelerate defines them in ``accelerate.utils.dataclasses``.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from ...facts.environment import env_flag
from ..constants import BETA_CP_AVAILABLE_PYTORCH_VERSION, BETA_TP_AVAILABLE_PYTORCH_VERSION
from ..imports import is_torch_version

__all__ = [
    "DeepSpeedSequenceParallelConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
]


def _torch_at_least(version: str) -> bool:
    """Whether the installed torch is ``version`` or newer."""
    return is_torch_version(">=", version)


@dataclass
class TorchTensorParallelPlugin:
    """Deprecated in Accelerate for ``ParallelismConfig(tp_size=...)``; kept for its name and fields."""

    tp_size: int = field(default=1, metadata={"help": "tensor parallel size used in the device mesh"})
    torch_device_mesh: Optional[Any] = field(default=None)


@dataclass
class TorchContextParallelConfig:
    """Context parallelism settings (``cp_comm_strategy``: allgather or alltoall; PARALLELISM_CONFIG_CP_COMM_STRATEGY)."""

    cp_comm_strategy: Optional[str] = field(default=None, metadata={"help": "'allgather' (default) or 'alltoall'."})

    def __post_init__(self) -> None:
        if not _torch_at_least(BETA_CP_AVAILABLE_PYTORCH_VERSION):
            raise ValueError(f"FSDP2-based Context parallelism is only available in PyTorch {BETA_CP_AVAILABLE_PYTORCH_VERSION} "
                             "and later versions. Please upgrade your PyTorch version.")
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = os.environ.get("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in ("allgather", "alltoall"):
            raise ValueError(f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Must be one of 'allgather' or 'alltoall'.")


@dataclass
class TorchTensorParallelConfig:
    """Tensor parallelism settings; accel applies the model's plan with torch's ``parallelize_module``."""

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        if not _torch_at_least(BETA_TP_AVAILABLE_PYTORCH_VERSION):
            raise ValueError(f"Torch tensor parallelism is only available in PyTorch {BETA_TP_AVAILABLE_PYTORCH_VERSION} and "
                             "later versions. Please upgrade your PyTorch version.")
        if self.enable_async_tp:
            warnings.warn("enable_async_tp is ignored by accel (async TP needs symmetric memory on a GPU backend)")


@dataclass
class DeepSpeedSequenceParallelConfig:
    """DeepSpeed (ALST/Ulysses) sequence parallelism settings, validated as Accelerate does; accel does not run SP."""

    sp_seq_length: Optional[int] = field(default=None, metadata={"help": "Fixed sequence length (when not variable)."})
    sp_seq_length_is_variable: Optional[bool] = field(default=None, metadata={"help": "Sequence length may change between batches (default True)."})
    sp_attn_implementation: Optional[str] = field(default=None, metadata={"help": "flash_attention_2, flash_attention_3, sdpa or a hub flash-attn kernel."})

    def __post_init__(self) -> None:
        if self.sp_seq_length_is_variable is None:
            self.sp_seq_length_is_variable = env_flag("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", default=True)
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            if "PARALLELISM_CONFIG_SP_SEQ_LENGTH" not in os.environ:
                raise ValueError("when `sp_seq_length_is_variable` is `False` `sp_seq_length` must be provided either through "
                                 "the constructor or the environment variable PARALLELISM_CONFIG_SP_SEQ_LENGTH")
            raw = os.environ["PARALLELISM_CONFIG_SP_SEQ_LENGTH"]
            self.sp_seq_length = None if raw == "None" else int(raw)
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = os.environ.get("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION")
        builtin = ["flash_attention_2", "flash_attention_3", "sdpa"]
        impl = self.sp_attn_implementation
        if impl is None:
            return
        if impl in ("eager", "flex_attention"):
            raise ValueError(f"Invalid sp_attn_implementation: {impl}. 'eager' and 'flex_attention' are not supported with "
                             "sequence parallelism.")
        if impl not in builtin and not ("/" in impl and "flash-attn" in impl):
            raise ValueError(f"Invalid sp_attn_implementation: {impl}. Must be one of {builtin} or a hub-hosted flash "
                             "attention kernel (e.g. 'kernels-community/flash-attn2').")
