"""bitsandbytes quantization at Accelerate's names (``accelerate.utils.bnb``).

:func:`load_and_quantize_model` swaps a model's ``nn.Linear`` layers for bitsandbytes' 8-bit
(LLM.int8) or 4-bit (fp4/nf4) layers and quantizes their weights, either from the model's own
weights or from a checkpoint loaded into a model built on the meta device, with a device map that
may send modules to the host or to disk.

Where accel differs from Accelerate, because Accelerate assumes a CUDA or XPU GPU:

- weights are quantized on the active backend's device (``accel.backends.get_backend()``), the host
  included: bitsandbytes has CPU kernels, and pure-torch ones for other device types. A device it has
  no kernel for is refused with :class:`~accel.backends.UnsupportedFeatureError` naming the device;
- on the host backend ``"cpu"`` in a device map is the execution device, so 4-bit modules placed
  there stay quantized (with an accelerator, as in Accelerate, ``"cpu"`` and ``"disk"`` modules are
  offloaded: kept in ``torch_dtype`` under 4-bit, stored as int8 rows under 8-bit).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Union

import torch
import torch.nn as nn

from ..backends import is_host_device
from ..big_modeling import dispatch_model, init_empty_weights
from ..quantization.bnb_params import (
    bnb_parameter_like,
    bnb_parameter_to_device,
    is_bnb_parameter,
    is_quantized_bnb_parameter,
    quantize_and_offload_8bit,
)
from .dataclasses import BnbQuantizationConfig
from .imports import is_4bit_bnb_available, is_8bit_bnb_available, is_bnb_available
from .modeling import (
    find_tied_parameters,
    get_balanced_memory,
    infer_auto_device_map,
    load_checkpoint_in_model,
)

__all__ = [
    "get_keys_to_not_convert", "get_parameter_device", "get_quantized_model_device_map", "has_4bit_bnb_layers",
    "load_and_quantize_model", "quantization_device", "quantize_and_offload_8bit", "replace_with_bnb_layers",
]

logger = logging.getLogger(__name__)

_AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


# ------------------------------------------------------------------------------------------ where
def _backend() -> Any:
    from ..backends import get_backend

    return get_backend()


def quantization_device() -> torch.device:
    """The device weights are quantized on and run on: the active backend's current device (the host on cpu)."""
    backend = _backend()
    if backend.is_host:
        return torch.device("cpu")
    return backend.device(backend.current_device())


def _device_value(device: torch.device) -> Union[int, str]:
    """What a device map holds for ``device``: ``"cpu"`` for the host, else its integer id."""
    return "cpu" if is_host_device(device) else (device.index if device.index is not None else 0)


def _offload_targets() -> tuple[str, ...]:
    """Device-map values whose modules are offloaded (moved in by hooks at each forward)."""
    return ("disk",) if _backend().is_host else ("cpu", "disk")


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """The device of a module's first parameter."""
    try:
        return next(parameter.parameters()).device
    except StopIteration:
        raise ValueError(f"{type(parameter).__name__} has no parameters, so it has no device") from None


# ------------------------------------------------------------------------------------------ which modules
def get_keys_to_not_convert(model: nn.Module) -> list[str]:
    """Modules to keep unquantized: the output head and whatever is tied to another module.

    Quantizing one side of a weight tie would break it, so every tied module stays in full precision;
    the last top-level module (the head) stays too, except in a bare base model (one with a
    ``base_model_prefix`` that is not an attribute of it, i.e. no head) without ties, where nothing does.
    """
    tied = find_tied_parameters(model)
    tied_names = {name for group in tied for name in (group if isinstance(group, (list, tuple)) else [group])}
    prefix = getattr(model, "base_model_prefix", None)
    if not tied_names and prefix and not hasattr(model, prefix):
        return []
    named = list(model.named_children())
    if not named:
        return []
    keys = {name.replace(".weight", "").replace(".bias", "") for name in tied_names}
    keys.add(named[-1][0])
    return sorted(keys)


def _keep(full_name: str, short_name: str, skip: list[str]) -> bool:
    """Accelerate's rule: a module is kept when its own name is listed, or a listed name is it or one of its parents."""
    if short_name in skip:
        return True
    return any(key == full_name or (key in full_name and f"{key}." in full_name) for key in skip)


def _bnb_linear(module: nn.Linear, config: BnbQuantizationConfig) -> nn.Module:
    """An empty bitsandbytes layer with ``module``'s shape, holding ``module``'s (unquantized) tensors."""
    import bitsandbytes as bnb

    has_bias = module.bias is not None
    if config.load_in_8bit:
        layer = bnb.nn.Linear8bitLt(module.in_features, module.out_features, has_bias, has_fp16_weights=False,
                                    threshold=config.llm_int8_threshold, device="meta")
    else:
        layer = bnb.nn.Linear4bit(module.in_features, module.out_features, has_bias, config.bnb_4bit_compute_dtype,
                                  compress_statistics=config.bnb_4bit_use_double_quant,
                                  quant_type=config.bnb_4bit_quant_type, device="meta")
    layer.weight = bnb_parameter_like(layer.weight, module.weight.data)
    if has_bias:
        layer.bias = nn.Parameter(module.bias.data, requires_grad=False)
    layer.train(module.training)
    return layer


def replace_with_bnb_layers(model: nn.Module, bnb_quantization_config: BnbQuantizationConfig,
                            modules_to_not_convert: Optional[list[str]] = None,
                            current_key_name: Optional[list[str]] = None) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (but those in ``modules_to_not_convert``) by a bitsandbytes layer.

    The new layers hold the old tensors unquantized (on the meta device for a model built empty);
    they are quantized when placed on a device. A model with no ``nn.Linear`` to convert is logged
    (some architectures use other projection classes).
    """
    if not isinstance(bnb_quantization_config, BnbQuantizationConfig):
        raise TypeError(f"bnb_quantization_config must be a BnbQuantizationConfig, got {type(bnb_quantization_config).__name__}")
    skip = list(modules_to_not_convert or [])
    prefix = list(current_key_name or [])
    replaced = 0
    for full_name, module in list(model.named_modules()):
        path = ".".join(prefix + ([full_name] if full_name else []))
        for child_name, child in list(module.named_children()):
            child_path = f"{path}.{child_name}" if path else child_name
            if type(child) is nn.Linear and not _keep(child_path, child_name, skip):
                setattr(module, child_name, _bnb_linear(child, bnb_quantization_config))
                replaced += 1
    if not replaced:
        logger.warning("load_and_quantize_model found no nn.Linear to quantize in %s (some architectures use other "
                       "projection classes, e.g. GPT-2's Conv1D)", type(model).__name__)
    return model


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """Whether the model holds bitsandbytes 4-bit linear layers (False without bitsandbytes)."""
    if not is_bnb_available():
        return False
    import bitsandbytes as bnb

    return any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


# ------------------------------------------------------------------------------------------ device maps
def get_quantized_model_device_map(model: nn.Module, bnb_quantization_config: BnbQuantizationConfig,
                                   device_map: Any = None, max_memory: Any = None,
                                   no_split_module_classes: Optional[list[str]] = None) -> dict[str, Any]:
    """The device map a quantized model is loaded with.

    ``None`` puts the whole model on the quantization device; a strategy name (``"auto"``,
    ``"balanced"``, ``"balanced_low_0"``, ``"sequential"``) plans with quantized sizes (skipped modules
    at ``torch_dtype``, ``keep_in_fp32_modules`` at fp32). A 4-bit module that would be offloaded is
    refused: bitsandbytes cannot offload 4-bit weights, so such modules must be listed in the
    skip lists (a custom device map does that for its offloaded modules).
    """
    config = bnb_quantization_config
    skip = list(config.skip_modules or [])
    keep_fp32 = list(config.keep_in_fp32_modules or [])
    if device_map is None:
        device_map = {"": _device_value(quantization_device())}
    if isinstance(device_map, str):
        if device_map not in _AUTO_MAPS:
            raise ValueError(f"device_map given as a string must be one of {list(_AUTO_MAPS)}, got {device_map!r}")
        special = {n: config.torch_dtype for n, _ in model.named_parameters() if any(m in n for m in skip)}
        special.update({n: torch.float32 for n, _ in model.named_parameters() if any(m in n for m in keep_fp32)})
        special = {k: v for k, v in special.items() if v is not None}
        kwargs = {"special_dtypes": special, "no_split_module_classes": no_split_module_classes, "dtype": config.target_dtype}
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, low_zero=device_map == "balanced_low_0", max_memory=max_memory, **kwargs)
        device_map = infer_auto_device_map(model, max_memory=max_memory, **kwargs)
    if not isinstance(device_map, dict):
        raise TypeError(f"device_map must be None, a strategy name or a dict, got {type(device_map).__name__}")
    unconverted = set(skip) | set(keep_fp32)
    offloaded = sorted(k for k, v in device_map.items() if k not in unconverted and v in _offload_targets())
    if offloaded and config.load_in_4bit:
        raise ValueError(
            f"4-bit modules would be offloaded ({offloaded} on {sorted({str(device_map[k]) for k in offloaded})}): "
            "bitsandbytes cannot offload 4-bit weights. Give load_and_quantize_model a device map of your own (its "
            "offloaded modules stay unquantized in torch_dtype) or more device memory (max_memory)")
    if offloaded:
        logger.info("Modules %s are offloaded; they are stored as 8-bit rows and their scales", offloaded)
    return device_map


# ------------------------------------------------------------------------------------------ quantizing
def _refusal(device: torch.device, exc: BaseException) -> Exception:
    from ..backends import UnsupportedFeatureError

    return UnsupportedFeatureError(_backend().name, "bitsandbytes quantization",
                                   f"bitsandbytes has no working kernel for {device.type} ({type(exc).__name__}: {exc})")


def _quantize_in_place(model: nn.Module) -> int:
    """Quantize, where they lie, the bitsandbytes weights a loader left unquantized; returns how many."""
    done = 0
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or not is_bnb_parameter(param) or is_quantized_bnb_parameter(param):
                continue
            if param.device.type == "meta" or getattr(param, "has_fp16_weights", False):
                continue
            try:
                module._parameters[name] = bnb_parameter_to_device(param, param.data, param.device)
            except (RuntimeError, NotImplementedError) as exc:
                raise _refusal(param.device, exc) from exc
            done += 1
    return done


def _place(model: nn.Module, device: torch.device) -> None:
    """Move every tensor of a loaded model to ``device``, quantizing bitsandbytes weights there (ties kept)."""
    moved: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in moved:
                if is_bnb_parameter(param):
                    try:
                        moved[id(param)] = bnb_parameter_to_device(param, param.data, device)
                    except (RuntimeError, NotImplementedError) as exc:
                        raise _refusal(device, exc) from exc
                else:
                    moved[id(param)] = nn.Parameter(param.data.to(device), requires_grad=param.requires_grad)
            module._parameters[name] = moved[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = buffer.to(device)


def _check_available(config: BnbQuantizationConfig) -> None:
    if not is_bnb_available():
        raise ImportError("load_and_quantize_model needs bitsandbytes: `pip install bitsandbytes` (with your torch pinned)")
    if config.load_in_8bit and not is_8bit_bnb_available():
        raise ImportError("the installed bitsandbytes is too old for 8-bit layers: upgrade bitsandbytes")
    if config.load_in_4bit and not is_4bit_bnb_available():
        raise ImportError("the installed bitsandbytes is too old for 4-bit layers: upgrade bitsandbytes")


def load_and_quantize_model(model: nn.Module, bnb_quantization_config: BnbQuantizationConfig,
                            weights_location: Optional[Union[str, os.PathLike]] = None, device_map: Any = None,
                            no_split_module_classes: Optional[list[str]] = None, max_memory: Any = None,
                            offload_folder: Optional[Union[str, os.PathLike]] = None,
                            offload_state_dict: bool = False) -> nn.Module:
    """Quantize ``model`` with bitsandbytes (8-bit or 4-bit, as ``bnb_quantization_config`` says) and return it.

    A model with its weights loaded is converted and quantized on the quantization device (Accelerate
    warns that building it under ``init_empty_weights`` is better, and so does this). A model on the
    meta device needs ``weights_location`` (a checkpoint file, an index JSON or a folder): it is
    converted empty, loaded with ``device_map`` (``None``: all on the quantization device; a strategy
    name; or a dict, whose ``"disk"`` modules need ``offload_folder``) and dispatched.
    ``skip_modules`` (default: :func:`get_keys_to_not_convert`) and ``keep_in_fp32_modules`` stay
    ``nn.Linear``; the latter in fp32. ``model.is_loaded_in_8bit``/``is_loaded_in_4bit`` are set for PEFT.
    The config's lists are updated in place, as in Accelerate.
    """
    if not isinstance(bnb_quantization_config, BnbQuantizationConfig):
        raise TypeError(f"bnb_quantization_config must be a BnbQuantizationConfig, got {type(bnb_quantization_config).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    config = bnb_quantization_config
    _check_available(config)

    modules_offloaded: list[str] = []
    if isinstance(device_map, dict) and len(device_map) > 1:
        modules_offloaded = [k for k, v in device_map.items() if v in _offload_targets()]
    if config.skip_modules is None:
        config.skip_modules = get_keys_to_not_convert(model)
    if config.load_in_4bit:  # bitsandbytes cannot offload 4-bit weights: those modules stay in torch_dtype
        config.skip_modules.extend(m for m in modules_offloaded if m not in config.skip_modules)
    if config.keep_in_fp32_modules is None:
        config.keep_in_fp32_modules = []
    keep_fp32 = config.keep_in_fp32_modules
    not_converted = config.skip_modules + [m for m in keep_fp32 if m not in config.skip_modules]

    model.is_loaded_in_4bit = config.load_in_4bit
    model.is_loaded_in_8bit = config.load_in_8bit
    device = quantization_device()

    if get_parameter_device(model).type != "meta":
        logger.warning("Quantizing a model whose weights are loaded holds them twice for a while: build the model "
                       "under `init_empty_weights` and pass `weights_location` instead.")
        model = replace_with_bnb_layers(model, config, modules_to_not_convert=not_converted)
        dtype = config.torch_dtype
        with torch.no_grad():
            for name, param in model.named_parameters(remove_duplicate=False):
                if any(m in name for m in keep_fp32):
                    param.data = param.data.to(torch.float32)
                elif dtype is not None and param.is_floating_point():
                    param.data = param.data.to(dtype)
        _place(model, device)
        return model

    if weights_location is None:
        raise ValueError("the model is on the meta device, so load_and_quantize_model needs `weights_location`: the "
                         f"checkpoint (file, index JSON or folder) holding its weights, got {weights_location!r}")
    with init_empty_weights():
        model = replace_with_bnb_layers(model, config, modules_to_not_convert=not_converted)
    device_map = get_quantized_model_device_map(model, config, device_map, max_memory=max_memory,
                                                no_split_module_classes=no_split_module_classes)
    if offload_state_dict is None and "disk" in device_map.values():
        offload_state_dict = True
    load_checkpoint_in_model(
        model, weights_location, device_map, dtype=config.torch_dtype, offload_folder=offload_folder,
        offload_state_dict=offload_state_dict, keep_in_fp32_modules=keep_fp32,
        offload_8bit_bnb=config.load_in_8bit and "disk" in device_map.values())
    _quantize_in_place(model)
    return dispatch_model(model, device_map=device_map, offload_dir=offload_folder)

