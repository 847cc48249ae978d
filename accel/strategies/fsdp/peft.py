"""PEFT (adapter) models in checkpoints: the adapter-only state dicts behind FSDP's ``adapter_only``.

A PEFT model (``peft.PeftModel``, e.g. LoRA) is an ``nn.Module``, so ``Accelerator.get_state_dict``,
``save_state`` and ``load_state`` handle it like any model: its state holds the frozen base weights
and the adapters. ``adapter_only`` checkpoints hold the adapters alone, as Accelerate writes them:

- a full state dict (FSDP ``FULL_STATE_DICT``, gathered to rank 0): every *trainable* tensor under its
  full module name (``torch.distributed.checkpoint.state_dict`` with ``ignore_frozen_params``), loaded
  back non-strictly;
- otherwise (``SHARDED_STATE_DICT``, or no FSDP): PEFT's own adapter state
  (``peft.get_peft_model_state_dict`` of the active adapter, DTensor shards under FSDP2), loaded back
  with ``peft.set_peft_model_state_dict``.

A model that is not a PEFT model gets its whole state, as in Accelerate. Nothing here imports
peft or torch.distributed until used.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ...utils.imports import is_peft_available

__all__ = ["get_adapter_state_dict", "is_peft_model", "set_adapter_state_dict", "unwrap_peft_model"]


def unwrap_peft_model(model: Any) -> Any:
    """The PEFT model inside DDP/FSDP1/``torch.compile`` wrappers (FSDP2 keeps the model itself), or None."""
    if not is_peft_available():
        return None
    from peft import PeftModel

    seen = 0
    while seen < 8:
        if isinstance(model, PeftModel):
            return model
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None or not isinstance(inner, torch.nn.Module):
            return None
        model, seen = inner, seen + 1
    return None


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is, or wraps, a PEFT model (False without peft installed)."""
    return unwrap_peft_model(model) is not None


def _full(options: Any) -> bool:
    return bool(options is not None and getattr(options, "full_state_dict", False))


def get_adapter_state_dict(model: torch.nn.Module, options: Any = None) -> dict[str, Any]:
    """The adapter-only state of ``model`` (its whole state when it is not a PEFT model).

    ``options`` is a ``torch.distributed.checkpoint.state_dict.StateDictOptions`` for an FSDP model
    (None otherwise). With ``full_state_dict`` it gathers every trainable tensor under its full name
    (a collective: every rank calls it); otherwise it is PEFT's state of the active adapter.
    """
    peft_model = unwrap_peft_model(model)
    if _full(options):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        if peft_model is None:
            return get_model_state_dict(model, options=options)
        return get_model_state_dict(model, options=dataclasses.replace(options, ignore_frozen_params=True))
    if peft_model is None:
        if options is not None:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            return get_model_state_dict(model, options=options)
        return model.state_dict()
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(peft_model, adapter_name=peft_model.active_adapter)


def set_adapter_state_dict(model: torch.nn.Module, state_dict: dict[str, Any], options: Any = None) -> Any:
    """Load what :func:`get_adapter_state_dict` returned (with the same ``options``) into ``model``.

    Returns the load result (missing and unexpected keys). A full adapter state is loaded
    non-strictly (the frozen base weights are absent by design); with ``broadcast_from_rank0`` only
    rank 0 needs to pass the tensors.
    """
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict of tensors, got {type(state_dict).__name__}")
    peft_model = unwrap_peft_model(model)
    if _full(options):
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        if peft_model is None:
            return set_model_state_dict(model, state_dict, options=options)
        return set_model_state_dict(model, state_dict, options=dataclasses.replace(options, strict=False))
    if peft_model is None:
        if options is not None:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            return set_model_state_dict(model, state_dict, options=options)
        return model.load_state_dict(state_dict)
    from peft import set_peft_model_state_dict

    return set_peft_model_state_dict(peft_model, state_dict, adapter_name=peft_model.active_adapter)

