"""torch DistributedDataParallel on the process group the state set up."""

from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel

from ..backends import is_host_device
from ..utils.dataclasses import DDPCommunicationHookType, DistributedDataParallelKwargs, DistributedType
from .base import Strategy
from .context import StrategyContext


class DDPStrategy(Strategy):
    """torch ``DistributedDataParallel``: every rank holds the whole model, gradients are all-reduced."""

    name = "ddp"

    def __init__(self, context: StrategyContext):
        super().__init__(context)
        self.ddp_kwargs = context.ddp_kwargs or DistributedDataParallelKwargs()

    @property
    def distributed_type(self) -> DistributedType:
        """The backend's multi-process type (``MULTI_CPU``, ``MULTI_GPU``, ...)."""
        return DistributedType(self.backend.distributed_type)

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """``DistributedDataParallel`` around ``model`` (with the communication hook asked for); frozen models stay bare."""
        if isinstance(model, DistributedDataParallel):
            return model
        if not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise (frozen or evaluation model)
        device = self.device
        device_ids = [device.index] if not is_host_device(device) and device.index is not None else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids, output_device=device_ids[0] if device_ids else None,
                                          **self.ddp_kwargs.ddp_arguments())
        self._register_comm_hook(wrapped)
        return wrapped

    def _register_comm_hook(self, model: DistributedDataParallel) -> None:
        hook = self.ddp_kwargs.comm_hook
        if hook == DDPCommunicationHookType.NO:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if hook == DDPCommunicationHookType.FP16:
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif hook == DDPCommunicationHookType.BF16:
            model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        else:
            state = powerSGD_hook.PowerSGDState(process_group=None, **self.ddp_kwargs.comm_state_option)
            fn = powerSGD_hook.powerSGD_hook if hook == DDPCommunicationHookType.POWER_SGD else powerSGD_hook.batched_powerSGD_hook
            model.register_comm_hook(state, fn)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """DDP's own ``no_sync`` (a null context for a model DDP does not wrap)."""
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module):
        """Make the next backward all-reduce even inside ``no_sync``."""
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        saved = (model.require_backward_grad_sync, model.require_forward_param_sync)
        model.require_backward_grad_sync = True
        model.require_forward_param_sync = True
        # the reducer only all-reduces in a backward it was prepared for
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = saved

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module inside DDP."""
        return model.module if isinstance(model, DistributedDataParallel) else model

    def is_wrapped(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` is a ``DistributedDataParallel``."""
        return isinstance(model, DistributedDataParallel)
