"""The layers a prepared model may get and how to take them off again.

``prepare`` may compile a model (``torch.compile`` or regional compilation, as the dynamo plugin
asks) and leaves 8/4-bit models where bitsandbytes put them; ``unwrap_model`` removes the strategy's
wrappers and, when asked, the mixed-precision forward, keeping or dropping the compiled shell.
The Accelerator passes its plugin and strategy in as values.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

__all__ = ["compile_model", "has_device_map", "may_place_model", "refuse_device_mapped_model", "unwrap_model"]


def compile_model(model: torch.nn.Module, dynamo_plugin: Any, strategy: Any, stacklevel: int = 2) -> torch.nn.Module:
    """``model`` compiled as ``dynamo_plugin`` asks (once: a compiled model is returned as it is).

    A strategy whose engine compiles by its own config (``strategy.compiles_models`` false) gets the
    model back uncompiled, with a warning naming the ignored backend (``stacklevel`` as in ``warnings.warn``,
    counted from the caller of this function).
    """
    from ..utils.dataclasses import DynamoBackend
    from ..utils.other import compile_regions, has_compiled_regions, is_compiled_module

    plugin = dynamo_plugin
    if plugin is None or plugin.backend == DynamoBackend.NO or is_compiled_module(model) or has_compiled_regions(model):
        return model
    if not strategy.compiles_models:
        warnings.warn(f"dynamo_backend={plugin.backend.value.lower()!r} is ignored: the {strategy.name} strategy "
                      "compiles through its own engine config", stacklevel=stacklevel + 1)
        return model
    if plugin.use_regional_compilation:
        return compile_regions(model, **plugin.to_kwargs())
    return torch.compile(model, **plugin.to_kwargs())


def may_place_model(model: torch.nn.Module, offload_supported: Callable[[], bool]) -> bool:
    """Whether ``prepare`` may move ``model`` to the device: not an 8/4-bit model (bitsandbytes placed it).

    An 8/4-bit model whose device map offloads to cpu or disk cannot train: a ValueError names the map's
    devices, unless ``offload_supported()`` says bitsandbytes' multi-backend build (or an XPU) handles
    offloaded modules (the Accelerator passes its module's probes, which Accelerate's tests patch).
    """
    if not (getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)):
        return True
    device_map = getattr(model, "hf_device_map", None) or {}
    if any(str(d) in ("cpu", "disk") for d in device_map.values()) and not offload_supported():
        raise ValueError(
            "You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU or disk offload: "
            f"its device map puts modules on {sorted({str(d) for d in device_map.values()})}"
        )
    return False


def unwrap_model(model: torch.nn.Module, strategy_unwrap: Callable[[Any], Any], keep_fp32_wrapper: bool = True,
                 keep_torch_compile: bool = True) -> torch.nn.Module:
    """The user's model inside ``model``: the strategy's wrappers (``strategy_unwrap``) and DDP-style ones removed.

    A compiled model stays compiled around the unwrapped module unless ``keep_torch_compile=False``;
    ``keep_fp32_wrapper=False`` restores the forward that mixed precision replaced.
    """
    from ..precision import AutocastForward
    from ..utils.other import extract_model_from_parallel, is_compiled_module

    compiled = model if is_compiled_module(model) else None
    inner = compiled._orig_mod if compiled is not None else model
    inner = extract_model_from_parallel(strategy_unwrap(inner), keep_torch_compile=False)
    if not keep_fp32_wrapper and isinstance(getattr(inner, "forward", None), AutocastForward):
        original = inner.forward.original
        if getattr(original, "__self__", None) is inner:
            del inner.forward  # the class's forward is the original
        else:
            inner.forward = original
    if compiled is not None and keep_torch_compile:
        compiled._orig_mod = inner
        return compiled
    return inner


def has_device_map(model: torch.nn.Module) -> bool:
    """Whether ``model`` or one of its submodules was dispatched over several devices by big-model
    inference (an ``hf_device_map`` with more than one entry)."""
    return any(len(getattr(module, "hf_device_map", None) or ()) > 1 for module in model.modules())


def refuse_device_mapped_model(model: Any, distributed_type: Any) -> None:
    """A ValueError, in Accelerate's words, when a model spread over devices by a device map is prepared
    for distributed training (each rank would own a copy of a model split across devices);
    ``ACCELERATE_BYPASS_DEVICE_MAP=true`` lets it through, as in Accelerate."""
    if not isinstance(model, torch.nn.Module) or str(distributed_type) == "NO" or not has_device_map(model):
        return
    from ..facts.environment import env_flag

    if env_flag("ACCELERATE_BYPASS_DEVICE_MAP"):
        return
    raise ValueError("You can't train a model that has been loaded with `device_map='auto'` in any distributed mode.")
