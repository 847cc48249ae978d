"""Models whose weights are offloaded by hooks: bring a module's weights to a device for a while, collect a full state dict."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Optional, Union

import torch
import torch.nn as nn

from .tensors import set_module_tensor_to_device

logger = logging.getLogger(__name__)

def has_offloaded_params(module: nn.Module) -> bool:
    """True when ``module`` carries an ``AlignDevicesHook`` that offloads its weights."""
    hook = getattr(module, "_hf_hook", None)  # duck-typed: this module sits below accel.hooks
    return bool(getattr(type(hook), "aligns_devices", False)) and bool(getattr(hook, "offload", False))


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device: Optional[Union[int, str, torch.device]] = None):
    """Within the context, the direct weights of ``module`` are on ``execution_device`` (or its hook's device).

    Offloaded modules are onloaded through their hook and offloaded again on exit; other modules have
    their direct parameters moved and moved back.
    """
    if has_offloaded_params(module):
        hook = module._hf_hook
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = execution_device
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = original
    elif execution_device is not None:
        devices = {name: p.device for name, p in module.named_parameters(recurse=False)}
        try:
            for name in devices:
                set_module_tensor_to_device(module, name, execution_device)
            yield
        finally:
            for name, device in devices.items():
                set_module_tensor_to_device(module, name, device)
    else:
        yield


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict of an offloaded model, on the CPU, onloading one module at a time."""
    state: dict[str, torch.Tensor] = {}
    placeholders: set[str] = set()
    for name, module in model.named_modules():
        if name == "":
            continue
        try:
            with align_module_device(module, "cpu"):
                sub = module.state_dict()
        except MemoryError:
            raise MemoryError("Offloaded module must fit in CPU memory to call save_model!") from None
        for key, tensor in sub.items():
            full = f"{name}.{key}"
            if tensor.device == torch.device("meta"):
                placeholders.add(full)
                continue
            state[full] = tensor.to("cpu")
    for name, tensor in model.state_dict().items():  # direct tensors of the root
        if "." not in name and name not in state and tensor.device != torch.device("meta"):
            state[name] = tensor.to("cpu")
    placeholders -= set(state)
    if placeholders:
        logger.warning(f"The following tensors were not saved because they were still on meta device: {placeholders}")
    return state


def get_state_dict_from_offload(
    module: nn.Module,
    module_name: str,
    state_dict: dict[str, Any],
    device_to_put_offload: Union[int, str, torch.device] = "cpu",
) -> dict[str, Any]:
    """Fill ``state_dict`` entries of ``module`` (named ``module_name``, a tensor name) from its onloaded weights."""
    root = module_name[: module_name.rfind(".")]
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):
        for key, tensor in module.state_dict().items():
            if f"{root}.{key}" in state_dict:
                state_dict[f"{root}.{key}"] = tensor
    return state_dict
