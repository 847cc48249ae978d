"""Mixed-precision helpers with Accelerate's names (the Accelerator itself plans precision in ``accel.precision``)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> Any:
    """A gradient scaler for the active backend (FSDP's sharded scaler under FSDP); ``kwargs`` go to its constructor.

    A backend without fp16 autocast raises ``UnsupportedFeatureError`` saying why, instead of
    returning a scaler that would not scale anything.
    """
    from ...backends import get_backend
    from ..dataclasses import DistributedType

    if distributed_type == DistributedType.FSDP:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=get_backend().autocast_device_type, **kwargs)
    return get_backend().grad_scaler(**kwargs)


def get_mixed_precision_context_manager(native_amp: bool = False, autocast_kwargs: Any = None) -> Any:
    """Autocast for the state's mixed precision (fp16, else bf16 for bf16/fp8) on its device; a null context
    when ``native_amp`` is False. ``autocast_kwargs`` is an :class:`AutocastKwargs`."""
    if not native_amp:
        return contextlib.nullcontext()
    from ...state import AcceleratorState

    state = AcceleratorState()
    kwargs = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    enabled = kwargs.pop("enabled", True)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}.get(str(state.mixed_precision))
    if dtype is None:
        return torch.autocast(state.device.type, enabled=enabled, **kwargs)
    return state.hardware_backend.autocast(dtype, enabled=enabled, **kwargs)
