"""NVIDIA Transformer Engine helpers with Accelerate's names (``accelerate.utils.transformer_engine``).

Layer conversion and fp8 autocast run Transformer Engine's own layers, so they need
transformer_engine (an NVIDIA GPU, or Intel's port on Gaudi); without it each helper raises an
ImportError saying so.
"""

from __future__ import annotations

from typing import Any

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


def _te() -> Any:
    """``transformer_engine.pytorch`` (or Intel's HPU port), or an ImportError saying what is missing."""
    from .imports import is_hpu_available, is_transformer_engine_available

    if not is_transformer_engine_available():
        raise ImportError("Transformer Engine fp8 needs transformer_engine, which is not installed "
                          "(pip install transformer_engine[pytorch]; it needs an NVIDIA GPU or Intel Gaudi)")
    if is_hpu_available():
        import intel_transformer_engine as te

        return te
    import transformer_engine.pytorch as te

    return te


def _copy_params(source: torch.nn.Module, target: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        target.weight.copy_(source.weight)
        if getattr(source, "bias", None) is not None:
            target.bias.copy_(source.bias)
    return target


def convert_model(model: torch.nn.Module, to_transformer_engine: bool = True, _convert_linear: bool = True,
                  _convert_ln: bool = True) -> None:
    """Swap ``nn.Linear``/``nn.LayerNorm`` for Transformer Engine's layers (or back), in place, keeping the weights.

    Linear layers whose sizes are not multiples of 16 stay as they are (fp8 GEMMs need them).
    """
    from .operations import GatheredParameters

    te = _te()
    te_layernorm = getattr(te, "LayerNorm", torch.nn.LayerNorm)
    for name, child in model.named_children():
        params = [p for p in (getattr(child, "weight", None), getattr(child, "bias", None)) if p is not None]
        if to_transformer_engine and _convert_linear and type(child) is torch.nn.Linear:
            with GatheredParameters(params, modifier_rank=0):
                if child.in_features % 16 or child.out_features % 16:
                    continue
                new = te.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                params_dtype=child.weight.dtype)
                setattr(model, name, _copy_params(child, new))
        elif to_transformer_engine and _convert_ln and type(child) is torch.nn.LayerNorm:
            with GatheredParameters(params, modifier_rank=0):
                new = te_layernorm(child.normalized_shape[0], eps=child.eps, params_dtype=child.weight.dtype)
                setattr(model, name, _copy_params(child, new))
        elif not to_transformer_engine and _convert_linear and isinstance(child, te.Linear):
            new = torch.nn.Linear(child.in_features, child.out_features, bias=getattr(child, "bias", None) is not None,
                                  dtype=child.weight.dtype, device=child.weight.device)
            setattr(model, name, _copy_params(child, new))
        elif not to_transformer_engine and _convert_ln and te_layernorm is not torch.nn.LayerNorm and isinstance(child, te_layernorm):
            new = torch.nn.LayerNorm(child.weight.shape[0], eps=child.eps, dtype=child.weight.dtype, device=child.weight.device)
            setattr(model, name, _copy_params(child, new))
        else:
            convert_model(child, to_transformer_engine=to_transformer_engine, _convert_linear=_convert_linear,
                          _convert_ln=_convert_ln)


def contextual_fp8_autocast(model_forward: Any, fp8_recipe: Any, use_during_eval: bool = False) -> Any:
    """``model_forward`` run under Transformer Engine's ``fp8_autocast`` while training (and in eval if asked).

    The result is meant to be bound to the model (``MethodType``); ``__wrapped__`` keeps the original
    so unwrapping can restore it.
    """
    te = _te()

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        with te.fp8_autocast(enabled=use_during_eval or self.training, fp8_recipe=fp8_recipe):
            return model_forward(*args, **kwargs)

    forward.__wrapped__ = model_forward
    return forward


def apply_fp8_autowrap(model: torch.nn.Module, fp8_recipe_handler: Any) -> torch.nn.Module:
    """Make ``model.forward`` run under Transformer Engine fp8 autocast with the recipe ``fp8_recipe_handler``
    (a ``TERecipeKwargs``) describes: delayed scaling, or MXFP8 block scaling when asked for."""
    from types import MethodType

    _te()
    from .imports import is_hpu_available

    if is_hpu_available():
        import intel_transformer_engine.recipe as recipes

        mxfp8_ok, why_not = False, "MXFP8 block scaling is not available on HPU"
    else:
        import transformer_engine.common.recipe as recipes
        from transformer_engine.pytorch.fp8 import check_mxfp8_support

        mxfp8_ok, why_not = check_mxfp8_support()
    kwargs = fp8_recipe_handler.to_kwargs() if fp8_recipe_handler is not None else {}
    if "fp8_format" in kwargs:
        kwargs["fp8_format"] = getattr(recipes.Format, kwargs["fp8_format"])
    use_during_eval = kwargs.pop("use_autocast_during_eval", False)
    if kwargs.pop("use_mxfp8_block_scaling", False):
        if not mxfp8_ok:
            raise ValueError(f"MXFP8 block scaling is not available: {why_not}")
        for option in ("amax_compute_algo", "amax_history_len"):
            if option in kwargs:
                raise ValueError(f"{option} does not apply to MXFP8 block scaling; leave it unset")
        recipe = recipes.MXFP8BlockScaling(**kwargs)
    else:
        recipe = recipes.DelayedScaling(**kwargs)
    forward = contextual_fp8_autocast(model.forward, recipe, use_during_eval)
    model.forward = MethodType(forward, model)
    return model


__all__ += ["apply_fp8_autowrap", "contextual_fp8_autocast", "convert_model"]
