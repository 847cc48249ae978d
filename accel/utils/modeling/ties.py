"""Tied weights: find parameters that are one tensor, tie them again after loading, check where they live."""

from __future__ import annotations

import inspect
import logging
from typing import Any, Mapping

import torch
import torch.nn as nn

logger = logging.getLogger(__name__)

def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Groups (sorted names) of parameters that are the same tensor object."""
    by_identity: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_identity.setdefault(id(param), []).append(name)
    return [sorted(set(names)) for names in by_identity.values() if len(set(names)) > 1]


def _getattr_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _owner(model: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    module = model
    parts = tensor_name.split(".")
    for part in parts[:-1]:
        sub = getattr(module, part, None)
        if sub is None:
            raise ValueError(f"{module} has no attribute {part}.")
        module = sub
    return module, parts[-1]


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make each group of names point at one parameter again (the first not on the meta device)."""
    for group in tied_params:
        source = None
        for name in group:
            param = _getattr_path(model, name)
            if param.device != torch.device("meta"):
                source = param
                break
        if source is None:
            continue
        for name in group:
            owner, attr = _owner(model, name)
            setattr(owner, attr, source)


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """True when a transformers model's config says some weights should be tied."""
    if "PreTrainedModel" not in [c.__name__ for c in inspect.getmro(type(model))]:
        return False
    config = getattr(model, "config", None)
    decoder = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    word = bool(decoder is not None and getattr(decoder, "tie_word_embeddings", False) and model.get_output_embeddings())
    enc_dec = bool(getattr(config, "is_encoder_decoder", False) and getattr(config, "tie_encoder_decoder", False))
    module_ties = any(hasattr(m, "_tie_weights") for m in model.modules())
    return word or enc_dec or module_ties


def _device_of(name: str, device_map: Mapping[str, Any]) -> Any:
    probe = name
    while True:
        if probe in device_map:
            return device_map[probe]
        if probe == "":
            raise ValueError(f"The `device_map` does not contain the module {name}.")
        probe = probe.rsplit(".", 1)[0] if "." in probe else ""


def check_tied_parameters_on_same_device(tied_params: list[list[str]], device_map: Mapping[str, Any]) -> None:
    """Warn when tied parameters would land on different devices."""
    for group in tied_params:
        devices = {name: _device_of(name, device_map) for name in group}
        if len(set(map(str, devices.values()))) > 1:
            logger.warning(
                f"Tied parameters are on different devices: {devices}. "
                "Please modify your custom device map or set `device_map='auto'`. "
            )
