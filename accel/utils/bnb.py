"""bitsandbytes quantization, at Accelerate's names.

accel does not convert models to bitsandbytes layers yet: ``load_and_quantize_model`` says so and
why (bitsandbytes missing, or the conversion not integrated) instead of returning an unquantized
model. What needs no bitsandbytes, choosing the modules that must stay in full precision, is here.
"""

from __future__ import annotations

from typing import Any

import torch

from .dataclasses import BnbQuantizationConfig
from .imports import is_bnb_available

__all__ = ["get_keys_to_not_convert", "has_4bit_bnb_layers", "load_and_quantize_model"]


def get_keys_to_not_convert(model: torch.nn.Module) -> list[str]:
    """Modules to keep unquantized: the output head and whatever is tied to the input embeddings.

    A model whose head shares weights with another module keeps both in full precision (quantizing
    one side of a tie would break it); otherwise the last module (the head) stays unquantized.
    """
    from .modeling import find_tied_parameters

    tied = find_tied_parameters(model)
    tied_names = sorted({name for group in tied for name in (group if isinstance(group, (list, tuple)) else [group])})
    named = list(model.named_children())
    if not named:
        return []
    last = named[-1][0]
    keys = {name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name for name in tied_names}
    keys.add(last)
    return sorted(keys)


def has_4bit_bnb_layers(model: torch.nn.Module) -> bool:
    """Whether the model holds bitsandbytes 4-bit linear layers (False without bitsandbytes)."""
    if not is_bnb_available():
        return False
    import bitsandbytes as bnb

    return any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


def load_and_quantize_model(model: torch.nn.Module, bnb_quantization_config: BnbQuantizationConfig,
                            weights_location: Any = None, device_map: Any = None, no_split_module_classes: Any = None,
                            max_memory: Any = None, offload_folder: Any = None, offload_state_dict: bool = False) -> torch.nn.Module:
    """Quantize ``model`` with bitsandbytes and load its weights: not available in accel (the reason is raised)."""
    if not isinstance(bnb_quantization_config, BnbQuantizationConfig):
        raise TypeError(f"bnb_quantization_config must be a BnbQuantizationConfig, got {type(bnb_quantization_config).__name__}")
    if not is_bnb_available():
        raise ImportError("load_and_quantize_model needs bitsandbytes: `pip install bitsandbytes` (with your torch pinned)")
    from ..backends import UnsupportedFeatureError, get_backend

    raise UnsupportedFeatureError(get_backend().name, "bitsandbytes quantization (load_and_quantize_model)",
                                  "accel does not convert models to bitsandbytes layers yet")
