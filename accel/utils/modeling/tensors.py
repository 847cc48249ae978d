"""Put one tensor of a module on a device (or the meta device), and compare devices."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.nn as nn

from ...backends import is_host_device
from ...quantization.bnb_params import bnb_parameter_to_device, is_bnb_parameter
from .placement import as_torch_device as _as_torch_device
from .sizes import _UNCONVERTED_PREFIXES, _proper_dtype
from .ties import _owner

def check_device_same(first_device: torch.device, second_device: torch.device) -> bool:
    """True when both are the same device; an accelerator device without index counts as index 0."""
    first, second = torch.device(first_device), torch.device(second_device)
    if first.type != second.type:
        return False
    if not is_host_device(first):
        first = torch.device(first.type, first.index or 0)
        second = torch.device(second.type, second.index or 0)
    return first == second


def is_peft_model(model: nn.Module) -> bool:
    """True for a PEFT-wrapped model (only when ``peft`` is installed)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: Union[int, str, torch.device],
    value: Optional[torch.Tensor] = None,
    dtype: Optional[Union[str, torch.dtype]] = None,
    fp16_statistics: Optional[torch.Tensor] = None,
    tied_params_map: Optional[dict[int, dict[Any, torch.Tensor]]] = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Put a parameter or buffer of ``module`` (dotted name) on ``device``, optionally with a new ``value``.

    ``param.to(device)`` makes a tensor the module does not know about; this replaces the module's own
    entry, keeping the parameter class and ``requires_grad``. Values are cast to the existing dtype
    unless ``dtype`` is given (integer and bool values are never cast). ``tied_params_map`` lets tied
    weights share one copy per device.
    """
    module, tensor_name = _owner(module, tensor_name)
    if tensor_name not in module._parameters and tensor_name not in module._buffers:
        raise ValueError(f"{module} does not have a parameter or a buffer named {tensor_name}.")
    is_buffer = tensor_name in module._buffers
    old_value = getattr(module, tensor_name)
    target = _as_torch_device(device)

    if tied_params_map is not None:
        for probe in (value, old_value):
            if probe is None:
                continue
            shared = tied_params_map.get(probe.data_ptr())
            if shared is not None and target in shared:
                module._parameters[tensor_name] = shared[target]
                return

    meta = torch.device("meta")
    if old_value is not None and old_value.device == meta and target != meta and value is None:
        raise ValueError(f"{tensor_name} is on the meta device, we need a `value` to put in on {device}.")

    param = module._parameters.get(tensor_name)
    param_cls = type(param)
    if param is not None and is_bnb_parameter(param):  # bitsandbytes quantizes as it moves
        module._parameters[tensor_name] = bnb_parameter_to_device(
            param, value if value is not None else old_value, target, requires_grad=old_value.requires_grad,
            fp16_statistics=fp16_statistics, dtype=_proper_dtype(dtype) if dtype is not None else None)
        return
    if value is not None:
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value)
        if old_value is not None and old_value.shape != value.shape and param_cls.__name__ != "Params4bit":
            raise ValueError(
                f'Trying to set a tensor of shape {value.shape} in "{tensor_name}" (which has shape {old_value.shape}), this looks incorrect.'
            )
        if dtype is None:
            if old_value is not None:
                value = value.to(old_value.dtype, non_blocking=non_blocking)
        elif not str(value.dtype).startswith(_UNCONVERTED_PREFIXES):
            value = value.to(_proper_dtype(dtype), non_blocking=non_blocking)

    with torch.no_grad():
        if value is None:
            new_value = old_value.to(target, non_blocking=non_blocking)
            if dtype is not None and target == meta and not str(old_value.dtype).startswith(_UNCONVERTED_PREFIXES):
                new_value = new_value.to(_proper_dtype(dtype))
        else:
            new_value = value.to(target, non_blocking=non_blocking)

        if is_buffer:
            module._buffers[tensor_name] = new_value
        elif value is not None or not check_device_same(target, param.device) or new_value.dtype != param.dtype:
            extra = dict(getattr(param, "__dict__", {}))
            hf_initialized = extra.pop("_is_hf_initialized", None)
            requires_grad = old_value.requires_grad and (new_value.is_floating_point() or new_value.is_complex())
            if isinstance(param, nn.Parameter) and param_cls is not nn.Parameter:
                try:
                    new_param = param_cls(new_value, requires_grad=requires_grad, **extra)
                except TypeError:
                    new_param = param_cls(new_value, requires_grad=requires_grad)
            else:
                new_param = nn.Parameter(new_value, requires_grad=requires_grad)
            if hf_initialized is not None:
                new_param._is_hf_initialized = hf_initialized
            module._parameters[tensor_name] = new_param
            if fp16_statistics is not None:
                new_param.SCB = fp16_statistics.to(target, non_blocking=non_blocking)

    if clear_cache and not is_host_device(target) and target.type != "meta":
        from accel.utils.memory import clear_device_cache

        clear_device_cache()

    if tied_params_map is not None:
        stored = module._parameters.get(tensor_name) if not is_buffer else module._buffers[tensor_name]
        for probe in (old_value, value):
            if probe is not None and probe.data_ptr() in tied_params_map:
                tied_params_map[probe.data_ptr()].setdefault(target, stored)
                break
