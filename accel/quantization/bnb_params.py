"""One bitsandbytes parameter put on a device and quantized there.

Kept apart from :mod:`accel.utils.bnb` (which imports the loaders) so that the loaders
(``set_module_tensor_to_device``, the offload hooks) can call it without an import cycle. Nothing
here imports bitsandbytes: the parameter classes come from the parameters themselves.

bitsandbytes quantizes a weight when its parameter moves from the host to a device
(``Int8Params.to``/``Params4bit.to``). That path assigns ``param.data`` across devices, which a device
without a compatible shallow-copy type refuses; here the parameter is built on the target device
first and quantized in place, which works wherever bitsandbytes has kernels for the device.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..utils.offload import offload_weight

__all__ = [
    "BNB_PARAMETER_CLASSES", "bnb_parameter_like", "bnb_parameter_to_device", "is_bnb_parameter", "is_quantized_bnb_parameter",
    "quantize_and_offload_8bit",
]

#: class names of bitsandbytes' quantizable parameters (``FP4Params`` is an old name, kept for old models)
BNB_PARAMETER_CLASSES = ("Int8Params", "FP4Params", "Params4bit")

# constructor keywords each class takes besides the data (the rest of a parameter's __dict__ is state)
_INT8_KEYS = ("has_fp16_weights",)
_4BIT_KEYS = ("blocksize", "compress_statistics", "quant_type", "quant_storage", "module")


def is_bnb_parameter(param: Any) -> bool:
    """Whether ``param`` is a bitsandbytes 8-bit or 4-bit parameter (judged by class name, no import)."""
    return type(param).__name__ in BNB_PARAMETER_CLASSES


def is_quantized_bnb_parameter(param: Any) -> bool:
    """Whether a bitsandbytes parameter already holds quantized data (int8 rows or packed 4-bit blocks)."""
    name = type(param).__name__
    if name == "Int8Params":
        return param.dtype == torch.int8
    if name in ("Params4bit", "FP4Params"):
        return bool(getattr(param, "bnb_quantized", False))
    return False


def _constructor_keys(old: torch.nn.Parameter) -> dict[str, Any]:
    state = dict(getattr(old, "__dict__", {}))
    keys = _INT8_KEYS if type(old).__name__ == "Int8Params" else _4BIT_KEYS
    return {k: state[k] for k in keys if k in state}


def bnb_parameter_like(old: torch.nn.Parameter, data: torch.Tensor) -> torch.nn.Parameter:
    """A parameter of ``old``'s bitsandbytes class and settings around ``data``, not quantized yet."""
    if not is_bnb_parameter(old):
        raise TypeError(f"bnb_parameter_like takes a bitsandbytes parameter, got {type(old).__name__}")
    return type(old)(data, requires_grad=False, **_constructor_keys(old))


def bnb_parameter_to_device(old: torch.nn.Parameter, value: torch.Tensor, device: Any,
                            requires_grad: Optional[bool] = None,
                            fp16_statistics: Optional[torch.Tensor] = None,
                            dtype: Optional[torch.dtype] = None) -> torch.nn.Parameter:
    """A new parameter of ``old``'s bitsandbytes class holding ``value`` on ``device``, quantized there.

    ``value`` in floating point is quantized on ``device`` (8-bit: row-wise int8 with its scales in
    ``SCB``; 4-bit: packed blocks with a quant state attached to the owning module). An int8 ``value``
    is taken as already quantized, with ``fp16_statistics`` (or ``old.SCB``) as its row scales. On the
    meta device nothing is quantized: the result is an empty placeholder of ``value``'s shape and
    dtype, as a module offloaded to disk keeps. ``dtype`` casts a floating ``value`` before it is
    quantized (an int8 ``value`` is never cast).
    """
    cls = type(old)
    name = cls.__name__
    if name not in BNB_PARAMETER_CLASSES:
        raise TypeError(f"bnb_parameter_to_device takes a bitsandbytes parameter ({', '.join(BNB_PARAMETER_CLASSES)}), "
                        f"got {name}")
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"value must be a tensor, got {type(value).__name__}")
    device = torch.device(device) if not isinstance(device, int) else torch.device(value.device.type, device)
    if dtype is not None and value.is_floating_point():
        value = value.to(dtype)
    state = dict(getattr(old, "__dict__", {}))
    if name == "Int8Params":
        keys = {k: state[k] for k in _INT8_KEYS if k in state}
        fp16_weights = bool(keys.get("has_fp16_weights", False))
        grad = bool(requires_grad) and fp16_weights
        if device.type == "meta":
            return cls(torch.empty(value.shape, dtype=value.dtype, device="meta"), requires_grad=False, **keys)
        if value.dtype == torch.int8:  # already quantized: keep the rows, attach their scales
            scales = fp16_statistics if fp16_statistics is not None else state.get("SCB")
            if scales is None:
                raise ValueError("an int8 value for an Int8Params needs its row scales (fp16_statistics or the old SCB)")
            data = value.to(device)
            return cls(data, requires_grad=False, CB=data, SCB=scales.to(device), **keys)
        data = value.to(device)
        if fp16_weights:
            return cls(data, requires_grad=grad, **keys)
        new = cls(data.to(torch.float16) if data.dtype == torch.float32 else data, requires_grad=False, **keys)
        new._quantize(device)
        return new
    # Params4bit (and the old FP4Params)
    keys = {k: state[k] for k in _4BIT_KEYS if k in state}
    if device.type == "meta":
        return cls(torch.empty(value.shape, dtype=value.dtype, device="meta"), requires_grad=False, **keys)
    if state.get("bnb_quantized") and value.dtype == state.get("quant_storage", torch.uint8):
        if value is old or value.data_ptr() == old.data_ptr():  # a move of quantized blocks: bitsandbytes moves them
            return old.to(device)
        raise ValueError("this Params4bit holds quantized blocks already; load 4-bit weights from a full-precision checkpoint")
    new = cls(value.to(device), requires_grad=False, **keys)
    new._quantize(device)
    return new


def _owner(model: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    try:
        return (model.get_submodule(path) if path else model), leaf
    except AttributeError:
        raise ValueError(f"{type(model).__name__} has no module {path!r} (for the tensor {name!r})") from None


def quantize_and_offload_8bit(model: torch.nn.Module, param: torch.Tensor, param_name: str, new_dtype: Optional[torch.dtype],
                              offload_folder: Any, offload_index: dict, fp16_statistics: Optional[torch.Tensor]) -> None:
    """Write ``param`` to the offload folder as a bitsandbytes 8-bit model keeps it, leaving a placeholder.

    A weight of an 8-bit layer is quantized on the host first and written as int8 rows plus their row
    scales (``<name with SCB for weight>``), which the offload hooks hand back as ``fp16_statistics``; a
    weight that arrives quantized (``fp16_statistics`` given) is written as it is. Any other tensor is
    cast to ``new_dtype`` and written. The model keeps an empty meta tensor of the same class in its
    place, so nothing of the offloaded weight stays in memory.
    """
    owner, leaf = _owner(model, param_name)
    if leaf not in owner._parameters and leaf not in owner._buffers:
        raise ValueError(f"{type(owner).__name__} has no parameter or buffer {leaf!r} (for {param_name!r})")
    old = owner._parameters.get(leaf, owner._buffers.get(leaf))
    scales_name = param_name.replace("weight", "SCB")
    if fp16_statistics is not None:
        offload_weight(param, param_name, offload_folder, index=offload_index)
        offload_weight(fp16_statistics, scales_name, offload_folder, index=offload_index)
        stored_dtype = param.dtype
    elif is_bnb_parameter(old) and type(old).__name__ == "Int8Params" and not getattr(old, "has_fp16_weights", False):
        quantized = bnb_parameter_to_device(old, param, "cpu", dtype=new_dtype)
        offload_weight(quantized.data, param_name, offload_folder, index=offload_index)
        offload_weight(quantized.SCB, scales_name, offload_folder, index=offload_index)
        stored_dtype = torch.int8
    else:
        value = param.to(new_dtype) if new_dtype is not None and param.is_floating_point() else param
        offload_weight(value, param_name, offload_folder, index=offload_index)
        stored_dtype = value.dtype
    placeholder = torch.empty(tuple(param.shape), dtype=stored_dtype, device="meta")
    if leaf in owner._buffers:
        owner._buffers[leaf] = placeholder
    elif is_bnb_parameter(old):
        owner._parameters[leaf] = bnb_parameter_to_device(old, placeholder, "meta")
    else:
        owner._parameters[leaf] = torch.nn.Parameter(placeholder, requires_grad=bool(old is not None and old.requires_grad))
