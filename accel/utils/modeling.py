"""Big-model utilities with Accelerate's names: sizes, device maps, checkpoint loading, tied weights.

Device-neutral: integer device ids in a device map or a ``max_memory`` dict are devices of the active
backend (``accel.backends.get_backend()``): ``0`` is ``cuda:0`` on CUDA, ``xpu:0`` on XPU, and so on;
the free memory of each comes from ``Backend.mem_get_info``. ``"cpu"`` and ``"disk"`` are the host RAM
and the offload folder; on a CPU-only machine a device map spans just those two.

Checkpoints are read one tensor at a time (safetensors through ``safe_open``, torch files through
``torch.load(mmap=True)``), so loading never holds a whole shard beside the model. Weights a device map
sends to disk from a safetensors checkpoint are not copied: the offload index points into the
checkpoint file, which is memory-mapped on use (see ``accel.utils.offload``).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import json
import logging
import os
import re
import warnings
from collections import OrderedDict, defaultdict
from typing import Any, Iterator, Mapping, Optional, Union

import torch
import torch.nn as nn

from .offload import (
    _check_writable,
    _dtype_name,
    load_offloaded_weight,
    offload_weight,
    save_offload_index,
)
from .placement import as_torch_device

logger = logging.getLogger(__name__)

__all__ = [
    "align_module_device",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "fallback_allocate",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "is_peft_model",
    "load_checkpoint_in_model",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
]

WEIGHTS_NAME = "pytorch_model.bin"
SAFE_WEIGHTS_NAME = "model.safetensors"
_HOST_KEYS = ("mps", "cpu", "disk")
_UNCONVERTED_PREFIXES = ("torch.uint", "torch.int", "torch.bool")


# ---------------------------------------------------------------------------------------------- devices
def _backend():
    from accel.backends import get_backend

    return get_backend()


_as_torch_device = as_torch_device  # the name the rest of accel (and older callers) use


def check_device_same(first_device: torch.device, second_device: torch.device) -> bool:
    """True when both are the same device; an accelerator device without index counts as index 0."""
    first, second = torch.device(first_device), torch.device(second_device)
    if first.type != second.type:
        return False
    if first.type != "cpu":
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


# ---------------------------------------------------------------------------------------------- sizes
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMG]I?B)\s*$", re.IGNORECASE)


def convert_file_size_to_int(size: Union[int, str]) -> int:
    """``"5MB"`` -> 5_000_000, ``"2GiB"`` -> 2 * 2**30 (a lower-case ``b`` means bits); ints pass through."""
    err = f"`size` {size} is not in a valid format. Use an integer for bytes, or a string with an unit (like '5.0GB')."
    if isinstance(size, bool):
        raise ValueError(err)
    if isinstance(size, int):
        if size < 0:
            raise ValueError(err)
        return size
    if not isinstance(size, str):
        raise ValueError(err)
    match = _SIZE_RE.match(size)
    if match is None:
        raise ValueError(err)
    number, unit = float(match.group(1)), match.group(2)
    upper = unit.upper()
    if upper.endswith("IB"):
        value = int(number * 2 ** {"K": 10, "M": 20, "G": 30}[upper[0]])
    else:
        value = int(number * 10 ** {"K": 3, "M": 6, "G": 9}[upper[0]])
        if unit.endswith("b"):
            value //= 8
    return value


def dtype_byte_size(dtype: torch.dtype) -> float:
    """Bytes one element of ``dtype`` takes (``torch.bool`` counts as 1/8, as in Accelerate)."""
    if dtype == torch.bool:
        return 1 / 8
    custom = getattr(dtype, "name", None)  # Accelerate's CustomDtype enum values
    if custom in ("INT2", "INT4", "FP8"):
        return {"INT2": 1 / 4, "INT4": 1 / 2, "FP8": 1}[custom]
    if isinstance(dtype, torch.dtype):
        if dtype.is_complex or dtype.is_floating_point or str(dtype).startswith(("torch.int", "torch.uint")):
            return torch.empty((), dtype=dtype).element_size()
    bits = re.search(r"[^\d](\d+)$", str(dtype))
    if bits is None:
        raise ValueError(f"`dtype` is not a valid dtype: {dtype}.")
    return int(bits.group(1)) // 8


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """(device, storage pointer, storage bytes): equal for tensors sharing one storage."""
    try:
        storage = tensor.untyped_storage()
        return tensor.device, storage.data_ptr(), storage.nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.device, 0, tensor.nelement() * tensor.element_size()


def _proper_dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
        value = getattr(torch, name, None)
        if not isinstance(value, torch.dtype):
            raise ValueError(f"{dtype!r} is not a torch dtype")
        return value
    return dtype


def named_module_tensors(
    module: nn.Module, include_buffers: bool = True, recurse: bool = False, remove_non_persistent: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters, then (optionally) buffers of ``module``, optionally without non-persistent buffers."""
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skip = get_non_persistent_buffers(module, recurse=recurse) if remove_non_persistent else set()
        for name, buffer in module.named_buffers(recurse=recurse):
            if name not in skip:
                yield name, buffer


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the non-persistent buffers of ``module`` (a new set; the module is not touched)."""
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, sub in module.named_modules():
            if fqns:
                names |= {f"{prefix}.{b}" if prefix else b for b in sub._non_persistent_buffers_set}
            else:
                names |= set(sub._non_persistent_buffers_set)
    return names


def compute_module_sizes(
    model: nn.Module,
    dtype: Optional[Union[str, torch.dtype]] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Bytes of every submodule and tensor (``""`` is the whole model), as they would be loaded in ``dtype``."""
    dtype_size = dtype_byte_size(_proper_dtype(dtype)) if dtype is not None else None
    special = {k: dtype_byte_size(_proper_dtype(v)) for k, v in (special_dtypes or {}).items()}
    sizes: dict[str, int] = defaultdict(int)
    tensors = model.named_buffers(recurse=True) if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        own = dtype_byte_size(tensor.dtype)
        if name in special:
            size = tensor.numel() * special[name]
        elif dtype_size is None or str(tensor.dtype).startswith(_UNCONVERTED_PREFIXES):
            size = tensor.numel() * own  # integer tensors are never converted on load
        else:
            size = tensor.numel() * min(dtype_size, own)
        parts = name.split(".")
        for i in range(len(parts) + 1):
            sizes[".".join(parts[:i])] += size
    return sizes


def compute_module_total_buffer_size(
    model: nn.Module,
    dtype: Optional[Union[str, torch.dtype]] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
) -> int:
    """Total bytes of the buffers of ``model``."""
    return compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True).get("", 0)


def _is_leaf_layer(module: Any, no_split: list[str]) -> bool:
    if not isinstance(module, nn.Module):
        return True
    return type(module).__name__ in no_split or next(iter(module.children()), None) is None


def get_max_layer_size(
    modules: list[tuple[str, nn.Module]], module_sizes: dict[str, int], no_split_module_classes: list[str]
) -> tuple[int, list[str]]:
    """Size of the largest unsplittable layer among ``modules`` and the names of the layers of that size."""
    best, names = 0, []
    pending = list(modules)
    while pending:
        name, module = pending.pop(0)
        if _is_leaf_layer(module, no_split_module_classes):
            size = module_sizes[name]
            if size > best:
                best, names = size, [name]
            elif size == best:
                names.append(name)
        else:
            pending[:0] = [(f"{name}.{child}", sub) for child, sub in module.named_children()]
    return best, names


def get_module_leaves(module_sizes: Mapping[str, int]) -> list[str]:
    """Names in ``module_sizes`` that have no child entry."""
    parents = {name.rsplit(".", 1)[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """(total bytes, (largest layer bytes, its names)); honours ``model._no_split_modules``."""
    sizes = compute_module_sizes(model)
    no_split = getattr(model, "_no_split_modules", None) or []
    top = _top_level_entries(model)
    return sizes[""], get_max_layer_size(top, sizes, no_split)


def _top_level_entries(model: nn.Module) -> list[tuple[str, Any]]:
    return (
        list(model.named_parameters(recurse=False))
        + list(model.named_children())
        + list(model.named_buffers(recurse=False))
    )


# ---------------------------------------------------------------------------------------------- tied weights
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


# ---------------------------------------------------------------------------------------------- set a tensor
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

    if clear_cache and target.type not in ("cpu", "meta"):
        from accel.utils.memory import clear_device_cache

        clear_device_cache()

    if tied_params_map is not None:
        stored = module._parameters.get(tensor_name) if not is_buffer else module._buffers[tensor_name]
        for probe in (old_value, value):
            if probe is not None and probe.data_ptr() in tied_params_map:
                tied_params_map[probe.data_ptr()].setdefault(target, stored)
                break


# ---------------------------------------------------------------------------------------------- memory budgets
def _accelerator():
    """The active backend when it drives an accelerator (not the host), else None."""
    backend = _backend()
    return None if backend.device_type == "cpu" else backend


def get_max_memory(max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None) -> dict[Union[int, str], int]:
    """Memory budget per device: the free memory of every device when ``None``, else ``max_memory`` in bytes.

    Keys are ordered accelerator ids first (ascending), then ``"mps"``, ``"cpu"``, ``"disk"``. Free memory
    comes from the active backend; a device that cannot report it is left out (logged).
    """
    import psutil

    if max_memory is None:
        budget: dict[Union[int, str], int] = {}
        backend = _accelerator()
        if backend is not None:
            for index in range(backend.device_count()):
                try:
                    torch.zeros(1, device=backend.device(index))  # initialise the device's context
                    budget[index] = int(backend.mem_get_info(index)[0])
                except Exception as exc:
                    logger.info(f"Device {index} seems unavailable ({type(exc).__name__}: {exc}), proceeding to check subsequent devices.")
        budget["cpu"] = int(psutil.virtual_memory().available)
        return budget

    budget = {}
    for key, value in max_memory.items():
        budget[key] = convert_file_size_to_int(value) if isinstance(value, str) else value
    ids = sorted(k for k in budget if isinstance(k, int) and not isinstance(k, bool))
    backend = _accelerator()
    count = backend.device_count() if backend is not None else 0
    for index in ids:
        if not 0 <= index < count:
            logger.warning(f"Device {index} is not available, available devices are {list(range(count))}")
    order = ids + [k for k in _HOST_KEYS if k in budget]
    unknown = [k for k in budget if k not in order]
    if unknown:
        raise ValueError(
            f"Device {unknown[0]} is not recognized, available devices are integers(for GPU/XPU), 'mps', 'cpu' and 'disk'"
        )
    return {k: budget[k] for k in order}


def _normalise_no_split(no_split_module_classes: Any) -> list[str]:
    if no_split_module_classes is None:
        return []
    if isinstance(no_split_module_classes, str):
        return [no_split_module_classes]
    return list(no_split_module_classes)


def get_balanced_memory(
    model: nn.Module,
    max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None,
    no_split_module_classes: Optional[list[str]] = None,
    dtype: Optional[Union[str, torch.dtype]] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    low_zero: bool = False,
) -> dict[Union[int, str], int]:
    """A ``max_memory`` for ``infer_auto_device_map`` that spreads the model evenly over the accelerators.

    Every device but the last gets the model size divided by the number of devices plus a margin
    (1.25 x the larger of the biggest no-split block and the mean leaf-module size); the last keeps
    its whole budget. ``low_zero`` keeps device 0 as empty as possible (e.g. for ``generate``).
    """
    user_set = max_memory is not None
    budget = get_max_memory(max_memory)
    devices = [k for k in budget if (isinstance(k, int) or k == "mps") and budget[k] > 0]
    if not devices:
        return budget
    if len(devices) == 1:
        low_zero = False
        if not user_set:
            for key in budget:
                if isinstance(key, int):
                    budget[key] = int(budget[key] * 0.9)
                    logger.info(
                        f"We will use 90% of the memory on device {key} for storing the model, and 10% for the buffer to avoid OOM. "
                        "You can set `max_memory` in to a higher value to use more memory (at your own risk)."
                    )
                    break

    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    per_device = sizes[""] // (len(devices) - 1 if low_zero else len(devices))

    no_split = _normalise_no_split(no_split_module_classes)
    block = 0
    if no_split:
        seen: dict[str, int] = {}
        for name, size in sizes.items():
            if not name:
                continue
            try:
                cls_name = type(_getattr_path(model, name)).__name__
            except AttributeError:
                continue
            if cls_name in no_split and cls_name not in seen:
                seen[cls_name] = size
                if len(seen) == len(set(no_split)):
                    break
        block = max(seen.values(), default=0)

    # leaves of the size table are tensors; without them, the leaves are the innermost modules
    tensor_names = set(get_module_leaves(sizes))
    module_only = {n: v for n, v in sizes.items() if n not in tensor_names}
    innermost = get_module_leaves(module_only)
    mean_leaf = int(sum(module_only[n] for n in innermost) / max(len(innermost), 1))
    per_device += int(1.25 * max(block, mean_leaf))

    ids = sorted(k for k, v in budget.items() if isinstance(k, int) and v > 0)
    for index in ids[:-1]:
        cap = budget[0] if (low_zero and index == 0) else per_device
        budget[index] = min(cap, budget[index])
    if low_zero:
        rest = sum(budget.get(i, 0) for i in range(1, len(devices)))
        budget[0] = min(max(0, sizes[""] - rest), budget[0])
    return budget


# ---------------------------------------------------------------------------------------------- device maps
def clean_device_map(device_map: dict[str, Any], module_name: str = "") -> dict[str, Any]:
    """Merge entries: a module whose submodules all go to one device becomes one entry (in place)."""
    prefix = f"{module_name}." if module_name else ""
    inside = [k for k in device_map if k.startswith(prefix)]
    values = [device_map[k] for k in inside]
    if len(values) > 1 and len({_hashable(v) for v in values}) == 1:
        for key in inside:
            del device_map[key]
        device_map[module_name] = values[0]
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = {".".join(k.split(".")[:depth]) for k in device_map if k.startswith(prefix) and len(k) > len(module_name)}
    for child in children:
        clean_device_map(device_map, module_name=child)
    return device_map


def _hashable(value: Any) -> Any:
    return str(value) if isinstance(value, torch.device) else value


def _contains(outer: str, name: str) -> bool:
    """True when ``name`` is ``outer`` or inside it (``a.1`` does not contain ``a.10``)."""
    return outer == "" or name == outer or name.startswith(outer + ".")


def check_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> None:
    """Check ``device_map`` gives exactly one device to every tensor of ``model``.

    Raises ``ValueError`` naming the tensors left without a device, or the two entries that give one
    module different devices (``{"block": 0, "block.attn": "cpu"}``); warns about keys naming no module.
    """
    known = set(dict(model.named_modules())) | set(model.state_dict()) | {n for n, _ in model.named_parameters()}
    unknown = [k for k in device_map if k != "" and k not in known]
    if unknown:
        warnings.warn(f"The following device_map keys do not match any submodules in the model: {unknown}", UserWarning)
    for inner in device_map:
        probe = inner
        while probe:  # every enclosing entry must agree with this one
            probe = probe.rsplit(".", 1)[0] if "." in probe else ""
            if probe in device_map and _hashable(device_map[probe]) != _hashable(device_map[inner]):
                raise ValueError(
                    f"The device_map gives module {inner!r} two devices: {device_map[inner]!r} from its own entry and "
                    f"{device_map[probe]!r} from {probe!r}. Give each module one device."
                )
    if "" in device_map:
        return
    uncovered = [name for name in model.state_dict() if not any(_contains(k, name) for k in device_map)]
    if uncovered:
        raise ValueError(
            f"The device_map provided does not give any device for the following parameters: {', '.join(uncovered)}"
        )


def get_module_size_with_ties(
    tied_params: list[str],
    module_size: int,
    module_sizes: Mapping[str, int],
    modules_to_treat: list[tuple[str, Any]],
) -> tuple[int, list[str], list[Any]]:
    """Size of a module plus the modules holding the weights tied to it, and those modules (names, objects)."""
    if not tied_params:
        return module_size, [], []
    names, modules = [], []
    total = module_size
    for param in tied_params:
        owner = next(((n, m) for n, m in modules_to_treat if param.startswith(n + ".")), None)
        if owner is None:
            raise ValueError(f"tied parameter {param!r} belongs to none of the modules left to place")
        names.append(owner[0])
        modules.append(owner[1])
        total += module_sizes[owner[0]] - module_sizes[param]
    return total, names, modules


def _tie_groups_crossing(name: str, tied_parameters: list[list[str]]) -> list[str]:
    """Parameters tied to something inside ``name`` that live outside it."""
    inside = lambda p: (p + ".").startswith(name + ".") or name == ""  # noqa: E731
    out: list[str] = []
    for group in tied_parameters:
        if any(inside(p) for p in group) and not all(inside(p) for p in group):
            out.extend(p for p in group if not inside(p))
    return out


def _children_with_params(name: str, module: nn.Module) -> list[tuple[str, Any]]:
    entries = list(module.named_parameters(recurse=False)) + list(module.named_children())
    return [(f"{name}.{n}", v) for n, v in entries]


def fallback_allocate(
    modules: list[tuple[str, Any]],
    module_sizes: Mapping[str, int],
    size_limit: Union[int, str],
    no_split_module_classes: Optional[list[str]] = None,
    tied_parameters: Optional[list[list[str]]] = None,
) -> tuple[Optional[str], Any, list[tuple[str, Any]]]:
    """Breadth-first search for a (sub)module that fits ``size_limit``; returns it and the remaining list.

    ``(None, None, modules)`` when nothing fits.
    """
    try:
        limit = convert_file_size_to_int(size_limit)
    except ValueError:
        return None, None, modules
    no_split = no_split_module_classes or []
    tied_parameters = tied_parameters or []
    queue = list(modules)
    found = None
    while queue:
        name, module = queue.pop(0)
        ties = _tie_groups_crossing(name, tied_parameters)
        size, _, _ = get_module_size_with_ties(ties, module_sizes[name], module_sizes, queue)
        if size <= limit:
            found = (name, module)
            break
        if isinstance(module, torch.Tensor) or _is_leaf_layer(module, no_split):
            continue
        queue[:0] = _children_with_params(name, module)
    if found is None:
        return None, None, modules
    name = found[0]
    # expand the found module's ancestors in ``modules`` so it is directly in the list, then take it out
    remaining = list(modules)
    parts = name.split(".")
    for depth in range(1, len(parts)):
        parent = ".".join(parts[:depth])
        names = [n for n, _ in remaining]
        if parent in names:
            i = names.index(parent)
            remaining[i : i + 1] = _children_with_params(parent, remaining[i][1])
    names = [n for n, _ in remaining]
    taken = remaining.pop(names.index(name))
    return taken[0], taken[1], remaining


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None,
    no_split_module_classes: Optional[list[str]] = None,
    dtype: Optional[Union[str, torch.dtype]] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, Union[int, str]]:
    """A device map filling accelerators in order, then the CPU, then the disk.

    Rules (Accelerate's): no device's budget is exceeded; the first accelerator and the CPU keep room
    for the largest layer (an offloaded layer is brought there to run); modules are split into their
    children only when they do not fit and are not in ``no_split_module_classes``; tied weights go to
    the device of the first module holding one of them. Works on meta models (sizes come from shapes
    and dtypes). Warns when the buffers of offloaded layers fit no accelerator (see ``offload_buffers``).
    """
    budget = get_max_memory(max_memory)
    no_split = _normalise_no_split(no_split_module_classes)
    devices = list(budget)
    if "disk" not in devices:
        devices.append("disk")
    accelerators = [d for d in devices if d not in ("cpu", "disk")]
    if "mps" in accelerators:
        reserve_on = ["mps"]
    elif accelerators:
        reserve_on = [accelerators[0], "cpu"]
    else:
        reserve_on = ["cpu"]

    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    tied_parameters = find_tied_parameters(model)
    if check_tied_parameters_in_config(model) and not tied_parameters:
        logger.warning(
            "The model weights are not tied. Please use the `tie_weights` method before using the `infer_auto_device` function."
        )
    queue: list[tuple[str, Any]] = _top_level_entries(model)

    def modules_in(entries: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        return [(n, m) for n, m in entries if isinstance(m, nn.Module)]

    device_map: dict[str, Union[int, str]] = OrderedDict()
    used = {d: 0 for d in devices}
    buffer_bytes: dict[Any, int] = {}
    min_needed: dict[Any, int] = {}
    slot = 0
    largest, largest_names = get_max_layer_size(queue, sizes, no_split)

    def say(msg: str) -> None:
        if verbose:
            print(msg)

    while queue:
        name, module = queue.pop(0)
        say(f"\nTreating module {name}.")
        largest_names = [n for n in largest_names if n != name and not n.startswith(name + ".")]
        if not largest_names:
            largest, largest_names = get_max_layer_size(modules_in(queue), sizes, no_split)
        size = sizes[name]
        ties = _tie_groups_crossing(name, tied_parameters)
        device = devices[slot]
        limit = budget[device] if device != "disk" else None
        reserved = 0
        if device in reserve_on:
            limit -= largest
            reserved = largest
        size_with_ties, tied_names, tied_modules = get_module_size_with_ties(ties, size, sizes, queue)

        # 1. it fits, with whatever is tied to it
        if limit is None or used[device] + size_with_ties <= limit:
            say(f"Putting {name} (size={size_with_ties}) on {device}.")
            used[device] += size_with_ties
            device_map[name] = device
            for tied_name in tied_names:
                queue = [(n, m) for n, m in queue if n != tied_name]
                device_map[tied_name] = device
            if not offload_buffers and isinstance(module, nn.Module):
                buffer_bytes[device] = buffer_bytes.get(device, 0) + compute_module_total_buffer_size(
                    module, dtype=dtype, special_dtypes=special_dtypes
                )
            continue

        # 2. it fits alone: split one of the tied modules and retry
        if ties and used[device] + size <= limit:
            split = False
            for tied_name, tied_module in zip(tied_names, tied_modules):
                if _is_leaf_layer(tied_module, no_split):
                    continue
                say(f"Splitting {tied_name}.")
                i = next(i for i, (n, _) in enumerate(queue) if n == tied_name)
                queue = [(name, module)] + queue[:i] + _children_with_params(tied_name, tied_module) + queue[i + 1 :]
                largest, largest_names = get_max_layer_size(modules_in(queue), sizes, no_split)
                split = True
                break
            if split:
                continue
            say("None of the tied module can be split, going to the next device.")

        # 3. it does not fit: split it when possible
        if used[device] + size >= limit:
            if not isinstance(module, torch.Tensor) and not _is_leaf_layer(module, no_split):
                say(f"Splitting {name}.")
                queue = _children_with_params(name, module) + queue
                largest, largest_names = get_max_layer_size(modules_in(queue), sizes, no_split)
                continue
            say("This module cannot be split, going to the next device.")

        # 4. nothing placed here yet: look for any smaller module that fits
        if used[device] == 0 and fallback_allocation and device != "disk":
            room = budget[device] - max(largest, size_with_ties)
            fb_name, fb_module, rest = fallback_allocate(queue, sizes, room - used[device], no_split, tied_parameters)
            if fb_module is not None:
                queue = [(fb_name, fb_module), (name, module)] + rest
                continue

        # 5. next device
        if used[device] == 0:
            min_needed[device] = size_with_ties + reserved
        used[device] += reserved
        slot += 1
        queue.insert(0, (name, module))

    used = {d: m for d, m in used.items() if m > 0}
    if clean_result:
        device_map = clean_device_map(device_map)

    offloaded_buffers = buffer_bytes.get("cpu", 0) + buffer_bytes.get("disk", 0)
    if offloaded_buffers > 0 and not offload_buffers and accelerators:
        fits = any(mem >= offloaded_buffers + used.get(d, 0) for d, mem in budget.items() if d not in ("cpu", "disk"))
        if not fits:
            warnings.warn(
                f"Current model requires {offloaded_buffers} bytes of buffer for offloaded layers, which seems does "
                f"not fit any GPU's remaining memory. If you are experiencing a OOM later, please consider using "
                f"offload_buffers=True."
            )
    if min_needed:
        info = "\n".join(f"  - {d}: {m} bytes required" for d, m in min_needed.items())
        logger.info(
            "Based on the current allocation process, no modules could be assigned to the following devices due to "
            f"insufficient memory:\n{info}\nThese minimum requirements are specific to this allocation attempt and may "
            "vary. Consider increasing the available memory for these devices to at least the specified minimum, or "
            "adjusting the model config."
        )
    return device_map


# ---------------------------------------------------------------------------------------------- checkpoints
def _safetensors_format_ok(path: str, metadata: Optional[dict]) -> None:
    if metadata is None:
        return
    fmt = metadata.get("format", "pt")
    if fmt not in ("pt", "tf", "flax", "mlx"):
        raise OSError(f"The safetensors archive passed at {path} does not contain the valid metadata (format={fmt!r}).")
    if fmt != "pt":
        raise ValueError(f"The checkpoint passed was saved with {fmt}, we need a the pt format.")


def load_state_dict(checkpoint_file: Union[str, os.PathLike], device_map: Optional[Mapping[str, Any]] = None) -> dict[str, torch.Tensor]:
    """Load one checkpoint file; with a ``device_map``, safetensors tensors are read straight onto their device."""
    path = os.fspath(checkpoint_file)
    if not path.endswith(".safetensors"):
        return _torch_load(path)
    from safetensors import safe_open

    with safe_open(path, framework="pt") as fh:
        _safetensors_format_ok(path, fh.metadata())
        names = list(fh.keys())
    tensors: dict[str, torch.Tensor] = {}
    if device_map is None:
        targets = {name: torch.device("cpu") for name in names}
    else:
        targets = {}
        for name in names:
            try:
                device = _device_of(name, device_map)
            except ValueError:
                device = "cpu"
            targets[name] = torch.device("cpu") if device == "disk" else _as_torch_device(device)
    by_device: dict[torch.device, list[str]] = defaultdict(list)
    for name, device in targets.items():
        by_device[device].append(name)
    for device, keys in by_device.items():
        try:
            handle = safe_open(path, framework="pt", device=str(device))
        except Exception as exc:  # safetensors knows a fixed list of device types; others load through the host
            if "invalid" not in str(exc) or device.type == "cpu":
                raise
            with safe_open(path, framework="pt", device="cpu") as fh:
                for key in keys:
                    tensors[key] = fh.get_tensor(key).to(device)
            continue
        with handle as fh:
            for key in keys:
                tensors[key] = fh.get_tensor(key)
    return tensors


def _torch_load(path: str) -> dict[str, torch.Tensor]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:  # legacy (non-zip) files cannot be memory-mapped
        if "mmap" not in str(exc) and "zipfile" not in str(exc):
            raise
        return torch.load(path, map_location="cpu", weights_only=True)


class _CheckpointFile:
    """One checkpoint file read tensor by tensor."""

    def __init__(self, path: str):
        self.path = path
        self.is_safetensors = path.endswith(".safetensors")
        self._handle = None
        self._state: Optional[dict[str, torch.Tensor]] = None
        if self.is_safetensors:
            from safetensors import safe_open

            self._handle = safe_open(path, framework="pt")
            _safetensors_format_ok(path, self._handle.metadata())
            self._keys = list(self._handle.keys())
        else:
            self._state = _torch_load(path)
            if not isinstance(self._state, Mapping):
                raise ValueError(f"checkpoint {path!r} does not hold a state dict (got {type(self._state).__name__})")
            self._keys = list(self._state.keys())

    def keys(self) -> list[str]:
        return self._keys

    def get(self, key: str) -> torch.Tensor:
        if self._handle is not None:
            return self._handle.get_tensor(key)
        return self._state[key]

    def close(self) -> None:
        self._handle = None
        self._state = None


def _checkpoint_files(checkpoint: Union[str, os.PathLike]) -> list[str]:
    path = os.fspath(checkpoint)
    index_file = None
    if os.path.isfile(path):
        if path.endswith(".json"):
            index_file = path
        else:
            return [path]
    elif os.path.isdir(path):
        names = os.listdir(path)
        for single in (WEIGHTS_NAME, SAFE_WEIGHTS_NAME):
            if single in names:
                return [os.path.join(path, single)]
        indexes = [n for n in names if n.endswith(".index.json")]
        if not indexes:
            raise ValueError(
                f"{path} is not a folder containing a `.index.json` file or a {WEIGHTS_NAME} or a {SAFE_WEIGHTS_NAME} file"
            )
        if len(indexes) > 1:
            raise ValueError(f"{path} containing more than one `.index.json` file, delete the irrelevant ones.")
        index_file = os.path.join(path, indexes[0])
    else:
        raise ValueError(
            "`checkpoint` should be the path to a file containing a whole state dict, or the index of a sharded "
            f"checkpoint, or a folder containing a sharded checkpoint or the whole state dict, but got {path}."
        )
    with open(index_file, encoding="utf-8") as fh:
        try:
            index = json.load(fh)
        except json.JSONDecodeError as exc:
            raise ValueError(f"checkpoint index {index_file!r} is not valid JSON: {exc}") from exc
    weight_map = index.get("weight_map", index) if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"checkpoint index {index_file!r} has no weight map (tensor name -> shard file)")
    folder = os.path.dirname(index_file)
    files = [os.path.join(folder, f) for f in sorted(set(weight_map.values()))]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise FileNotFoundError(f"checkpoint index {index_file!r} names shard(s) that do not exist: {missing}")
    return files


def load_offloaded_weights(model: nn.Module, index: Mapping[str, Any], offload_folder: Union[str, os.PathLike]) -> None:
    """Load every weight listed in ``index`` from ``offload_folder`` back into ``model`` on the CPU."""
    if not index:
        return
    for name, info in index.items():
        if "SCB" in name:
            continue
        weight = load_offloaded_weight(os.path.join(offload_folder, f"{name}.dat"), info)
        set_module_tensor_to_device(model, name, "cpu", value=weight.clone())


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: Union[str, os.PathLike],
    device_map: Optional[dict[str, Union[int, str, torch.device]]] = None,
    offload_folder: Optional[Union[str, os.PathLike]] = None,
    dtype: Optional[Union[str, torch.dtype]] = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: Optional[list[str]] = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> None:
    """Load a checkpoint (file, index JSON, or folder; safetensors or torch) into ``model``.

    With a ``device_map`` each tensor goes straight to its module's device; ``"disk"`` modules are
    offloaded to ``offload_folder`` (weights of a safetensors checkpoint are referenced in place, others
    written as ``.dat`` files) and left on the meta device. Tensors are read one at a time, so the CPU
    never holds a whole shard beside the model (``offload_state_dict`` is accepted for compatibility;
    streaming already gives its memory bound). Unused checkpoint keys are logged, or raise with
    ``strict``; model tensors the checkpoint lacks raise with ``strict`` or when they have no value at
    all (still on the meta device), and are logged otherwise. Call ``dispatch_model`` afterwards to run
    a model spread over devices (or use ``load_checkpoint_and_dispatch``).
    """
    if offload_8bit_bnb:
        raise NotImplementedError("accel does not support offloading bitsandbytes 8-bit weights (offload_8bit_bnb=True)")
    if broadcast_from_rank0:
        raise NotImplementedError("accel's load_checkpoint_in_model does not implement broadcast_from_rank0")
    tied_params = find_tied_parameters(model)
    if check_tied_parameters_in_config(model) and not tied_params:
        logger.warning(
            "The model weights are not tied. Please use the `tie_weights` method before using the `infer_auto_device` function."
        )
    if device_map is not None:
        check_tied_parameters_on_same_device(tied_params, device_map)
        needs_disk = "disk" in device_map.values()
        if needs_disk and offload_folder is None:
            raise ValueError(
                "At least one of the model submodule will be offloaded to disk, please pass along an `offload_folder`."
            )
        if needs_disk:
            _check_writable(offload_folder)
    dtype = _proper_dtype(dtype) if dtype is not None else None
    files = _checkpoint_files(checkpoint)

    model_state = model.state_dict(keep_vars=True)
    model_keys = set(model_state)
    buffer_names = {n for n, _ in model.named_buffers()}
    offload_index: dict[str, Any] = {}
    unexpected: set[str] = set()
    loaded: set[str] = set()

    for path in files:
        source = _CheckpointFile(path)
        try:
            for key in source.keys():
                if "SCB" in key:
                    continue
                if key not in model_keys:
                    unexpected.add(key)
                    continue
                if device_map is None:
                    _load_in_place(model, key, source.get(key), model_state[key], dtype, path)
                    loaded.add(key)
                    continue
                try:
                    device = _device_of(key, device_map)
                except ValueError:
                    raise ValueError(f"{key} doesn't have any device set.") from None
                target_dtype = _target_dtype(key, model_state[key], dtype, keep_in_fp32_modules)
                if device == "disk" and (offload_buffers or key not in buffer_names):
                    _offload_from_checkpoint(model, key, source, target_dtype, offload_folder, offload_index, model_state[key])
                else:
                    value = source.get(key)
                    _check_shape(key, value, model_state[key], path)
                    set_module_tensor_to_device(
                        model, key, "cpu" if device == "disk" else device, value=value, dtype=target_dtype, clear_cache=False
                    )
                loaded.add(key)
        finally:
            source.close()
        del source
        gc.collect()

    if unexpected:
        message = (
            f"Some weights of the model checkpoint at {os.fspath(checkpoint)} were not used when"
            f" initializing {type(model).__name__}: {sorted(unexpected)}. This may or may not be an issue - make sure that the checkpoint does not have unnecessary parameters, or that the model definition correctly corresponds to the checkpoint."
        )
        if strict:
            raise ValueError(message)
        logger.warning(message)

    for group in tied_params:  # a tied weight is loaded once for every name it has
        if any(n in loaded for n in group):
            loaded.update(group)
    missing = sorted(model_keys - loaded)
    if missing:
        no_value = [k for k in missing if model_state[k] is not None and model_state[k].device == torch.device("meta")]
        message = f"The checkpoint at {os.fspath(checkpoint)} has no value for {len(missing)} tensor(s) of {type(model).__name__}: {missing}"
        if strict or no_value:
            raise ValueError(message + ("" if strict else f" (still on the meta device: {no_value})"))
        logger.warning(message + "; they keep their current values.")

    if device_map is not None:
        save_offload_index(offload_index, offload_folder)
    retie_parameters(model, tied_params)


def _check_shape(key: str, value: torch.Tensor, current: Optional[torch.Tensor], path: str) -> None:
    if current is not None and tuple(value.shape) != tuple(current.shape) and type(current).__name__ != "Params4bit":
        raise ValueError(
            f"Shape mismatch for {key!r}: the checkpoint {path!r} has {tuple(value.shape)}, the model expects {tuple(current.shape)}."
        )


def _target_dtype(key: str, current: Optional[torch.Tensor], dtype: Optional[torch.dtype], keep_fp32: Optional[list[str]]) -> Optional[torch.dtype]:
    """The dtype ``key`` is loaded in: ``dtype`` for floating tensors (fp32 for ``keep_in_fp32_modules``), else its own."""
    if dtype is None or current is None or not current.is_floating_point():
        return None
    if keep_fp32 and dtype == torch.float16:
        for name in keep_fp32:
            if (name in key and name + "." in key) or name == key:
                return torch.float32
    return dtype


def _load_in_place(model: nn.Module, key: str, value: torch.Tensor, current: Optional[torch.Tensor], dtype: Optional[torch.dtype], path: str) -> None:
    _check_shape(key, value, current, path)
    if current is None or current.device == torch.device("meta"):
        set_module_tensor_to_device(model, key, "cpu", value=value, dtype=dtype if current is None or current.is_floating_point() else None)
        return
    with torch.no_grad():
        if dtype is not None and current.is_floating_point() and current.dtype != dtype:
            set_module_tensor_to_device(model, key, current.device, value=value, dtype=dtype)
        else:
            current.copy_(value)


def _offload_from_checkpoint(
    model: nn.Module,
    key: str,
    source: _CheckpointFile,
    dtype: Optional[torch.dtype],
    folder: Union[str, os.PathLike],
    index: dict[str, Any],
    current: Optional[torch.Tensor],
) -> None:
    """Leave ``key`` on the meta device and record where its value lives on disk."""
    if source.is_safetensors:
        info = source._handle.get_slice(key)
        shape = tuple(info.get_shape())
        if current is not None and shape != tuple(current.shape):
            raise ValueError(
                f"Shape mismatch for {key!r}: the checkpoint {source.path!r} has {shape}, the model expects {tuple(current.shape)}."
            )
        stored = _safetensors_dtype(info.get_dtype())
        target = dtype or stored
        index[key] = {
            "safetensors_file": os.path.abspath(source.path),
            "weight_name": key,
            "dtype": _dtype_name(target),
        }
        set_module_tensor_to_device(model, key, "meta", dtype=target)
        return
    value = source.get(key)
    _check_shape(key, value, current, source.path)
    if dtype is not None and value.dtype != dtype and value.is_floating_point():
        value = value.to(dtype)
    set_module_tensor_to_device(model, key, "meta", dtype=value.dtype)
    offload_weight(value, key, folder, index=index)


def _safetensors_dtype(code: str) -> torch.dtype:
    from .offload import _SAFETENSORS_DTYPES

    try:
        return _SAFETENSORS_DTYPES[code]
    except KeyError:
        raise ValueError(f"unsupported safetensors dtype {code!r}") from None


# ---------------------------------------------------------------------------------------------- offloaded models
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


# ---------------------------------------------------------------------------------------------------
# mixed-precision helpers with Accelerate's names (the Accelerator itself plans precision in accel.precision)
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"


def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> Any:
    """A gradient scaler for the active backend (FSDP's sharded scaler under FSDP); ``kwargs`` go to its constructor.

    A backend without fp16 autocast raises ``UnsupportedFeatureError`` saying why, instead of
    returning a scaler that would not scale anything.
    """
    from .dataclasses import DistributedType

    if distributed_type == DistributedType.FSDP:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=_backend().autocast_device_type, **kwargs)
    return _backend().grad_scaler(**kwargs)


def get_mixed_precision_context_manager(native_amp: bool = False, autocast_kwargs: Any = None) -> Any:
    """Autocast for the state's mixed precision (fp16, else bf16 for bf16/fp8) on its device; a null context
    when ``native_amp`` is False. ``autocast_kwargs`` is an :class:`AutocastKwargs`."""
    import contextlib

    if not native_amp:
        return contextlib.nullcontext()
    from ..state import AcceleratorState

    state = AcceleratorState()
    kwargs = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    enabled = kwargs.pop("enabled", True)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}.get(str(state.mixed_precision))
    if dtype is None:
        return torch.autocast(state.device.type, enabled=enabled, **kwargs)
    return state.hardware_backend.autocast(dtype, enabled=enabled, **kwargs)


__all__ += ["WEIGHTS_INDEX_NAME", "get_grad_scaler", "get_mixed_precision_context_manager"]
