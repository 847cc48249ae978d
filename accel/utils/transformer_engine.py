"""NVIDIA Transformer Engine helpers with Accelerate's names (``accelerate.utils.transformer_engine``).

accel does not convert models to Transformer Engine layers itself; these helpers tell whether a
model already uses them and fail with the reason where the package is missing.
"""

from __future__ import annotations

import torch

__all__ = ["has_transformer_engine_layers"]


def has_transformer_engine_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds a Transformer Engine ``Linear``, ``LayerNorm`` or ``TransformerLayer``."""
    from .imports import is_transformer_engine_available

    if not is_transformer_engine_available():
        raise ImportError("Using `has_transformer_engine_layers` requires transformer_engine to be installed "
                          "(pip install transformer_engine[pytorch]).")
    import transformer_engine.pytorch as te

    kinds = tuple(getattr(te, name) for name in ("LayerNorm", "Linear", "TransformerLayer") if hasattr(te, name))
    return any(isinstance(module, kinds) for module in model.modules())
