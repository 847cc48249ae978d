"""fp8 training through torchao's ``Float8Linear`` (``accelerate.utils.ao``'s names).

The first and last ``nn.Linear`` of a model stay in high precision (converting them often stops
training from converging), as do layers whose sizes are not multiples of 16 (fp8 matmul kernels
need them). Every function needs torchao >= 0.6.1 and says so when it is missing.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import torch

__all__ = ["convert_model_to_fp8_ao", "filter_first_and_last_linear_layers", "filter_linear_layers",
           "find_first_last_linear_layers", "has_ao_layers", "register_fsdp_float8_scale_precompute"]


def _require_torchao(what: str) -> None:
    from .imports import is_torchao_available

    if not is_torchao_available():
        raise ImportError(f"`{what}` needs torchao >= 0.6.1 (pip install torchao), which is not installed")


def find_first_last_linear_layers(model: torch.nn.Module) -> tuple[str | None, str | None]:
    """Qualified names of the first and the last ``nn.Linear`` of ``model`` (None when it has none)."""
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    return (names[0], names[-1]) if names else (None, None)


def filter_linear_layers(module: torch.nn.Module, fqn: str, layers_to_filter: list[str | None]) -> bool:
    """Whether ``module`` (named ``fqn``) may become fp8: not listed in ``layers_to_filter`` and, for a
    linear layer, with in/out sizes divisible by 16."""
    if isinstance(module, torch.nn.Linear) and (module.in_features % 16 or module.out_features % 16):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: torch.nn.Module, fqn: str) -> bool:
    """:func:`filter_linear_layers` keeping ``module``'s own first and last linear layers in high precision."""
    first, last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, layers_to_filter=[first, last])


def has_ao_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds a torchao ``Float8Linear``."""
    _require_torchao("has_ao_layers")
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(module, Float8Linear) for module in model.modules())


def convert_model_to_fp8_ao(model: torch.nn.Module, config: Any = None,
                            module_filter_func: Callable[[torch.nn.Module, str], bool] | None = None) -> None:
    """Turn ``model``'s eligible ``nn.Linear`` layers into torchao ``Float8Linear``, in place.

    ``module_filter_func(module, fqn)`` decides per layer (default: all but the first and last linear
    layers, and only sizes divisible by 16); ``config`` is a ``torchao.float8.Float8LinearConfig``.
    """
    _require_torchao("convert_model_to_fp8_ao")
    from torchao.float8 import convert_to_float8_training

    if module_filter_func is None:
        first, last = find_first_last_linear_layers(model)
        module_filter_func = partial(filter_linear_layers, layers_to_filter=[first, last])
    convert_to_float8_training(model, module_filter_fn=module_filter_func, config=config)


def register_fsdp_float8_scale_precompute(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> Any:
    """After each ``optimizer.step()``, recompute the fp8 scales of ``model``'s FSDP2-sharded ``Float8Linear``
    weights in one all-reduce (torchao's ``precompute_float8_dynamic_scale_for_fsdp``), as Accelerate does when
    ``enable_fsdp_float8_all_gather`` is on; the all-gather then casts each shard with the same scale on every rank.
    Returns the hook's handle."""
    _require_torchao("register_fsdp_float8_scale_precompute")
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    return optimizer.register_step_post_hook(lambda *args, **kwargs: precompute_float8_dynamic_scale_for_fsdp(model))
