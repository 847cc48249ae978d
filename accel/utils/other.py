"""Model unwrapping, regional compilation, saving and small system helpers (``accelerate.utils.other``)."""

from __future__ import annotations

import logging
import os
import platform
import re
import sys
from collections import OrderedDict
from types import MethodType
from typing import Any

import torch
from packaging.version import InvalidVersion, Version

from ..facts import network
from ..facts.precision import check_precision
from ..facts.versions import LINUX_KERNEL

logger = logging.getLogger(__name__)

__all__ = [
    "check_os_kernel",
    "clean_state_dict_for_safetensors",
    "compile_regions",
    "convert_bytes",
    "extract_model_from_parallel",
    "get_free_port",
    "get_model_tp_size",
    "get_pretty_name",
    "has_compiled_regions",
    "has_repeated_blocks",
    "is_compiled_module",
    "is_port_in_use",
    "is_repeated_blocks",
    "load",
    "merge_dicts",
    "model_has_dtensor",
    "recursive_getattr",
    "save",
    "wait_for_everyone",
    "write_basic_config",
]

#: kernels older than this can hang multi-process runs
MIN_KERNEL_VERSION = LINUX_KERNEL


# ---------------------------------------------------------------------------- compiled modules
def _optimized_module_type() -> type | None:
    dynamo = getattr(torch, "_dynamo", None)
    eval_frame = getattr(dynamo, "eval_frame", None) if dynamo is not None else None
    return getattr(eval_frame, "OptimizedModule", None)


def is_compiled_module(module: Any) -> bool:
    """Whether ``module`` is the wrapper ``torch.compile(module)`` returns."""
    optimized = _optimized_module_type()
    return optimized is not None and isinstance(module, optimized)


def has_compiled_regions(module: torch.nn.Module) -> bool:
    """Whether some submodule of ``module`` (or ``module`` itself) is a compiled module."""
    optimized = _optimized_module_type()
    if optimized is None or not module._modules:
        return False
    return any(isinstance(sub, optimized) for sub in module.modules())


def is_repeated_blocks(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a non-empty ``ModuleList`` whose children all have the first child's class."""
    if not isinstance(module, torch.nn.ModuleList) or len(module) == 0:
        return False
    first = type(module[0])
    return all(isinstance(child, first) for child in module)


def has_repeated_blocks(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds a repeated-block ``ModuleList`` at any depth."""
    return bool(module._modules) and any(is_repeated_blocks(sub) for sub in module.modules())


def _compile_tree(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    if is_repeated_blocks(module):
        # each block compiled on its own: the compiler's cache makes blocks 2..n cheap
        return torch.nn.ModuleList(torch.compile(block, **compile_kwargs) for block in module)
    if not has_repeated_blocks(module):
        return torch.compile(module, **compile_kwargs)
    # a shallow copy whose children are compiled regions; the original module is left untouched
    clone = module.__class__.__new__(module.__class__)
    clone.__dict__.update(module.__dict__)
    for key, value in list(clone.__dict__.items()):
        if getattr(value, "__self__", None) is module and hasattr(value, "__func__"):
            clone.__dict__[key] = MethodType(value.__func__, clone)  # methods bound to the original
    clone._modules = OrderedDict()
    for name, child in module.named_children():
        clone.add_module(name, _compile_tree(child, **compile_kwargs))
    return clone


def compile_regions(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Regional compilation: compile each block of repeated ``ModuleList``s separately, the rest whole.

    Compiling the first of N identical blocks fills the compiler's cache for the others, so a deep
    transformer compiles in about the time of one layer. Returns a new module (the input is not
    changed) that keeps the original under ``__dict__["_orig_mod"]`` for
    :func:`extract_model_from_parallel`. ``compile_kwargs`` go to ``torch.compile``.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"compile_regions needs a torch.nn.Module, got {type(module).__name__}")
    compiled = _compile_tree(module, **compile_kwargs)
    compiled.__dict__.setdefault("_orig_mod", module)
    return compiled


# ---------------------------------------------------------------------------- unwrapping
def _wrapper_types() -> tuple[type, ...]:
    types: list[type] = [torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel]
    # a DeepSpeed engine exists only if deepspeed was imported already: never import it (seconds) just to look
    if "deepspeed" in sys.modules:
        try:
            from deepspeed import DeepSpeedEngine

            types.append(DeepSpeedEngine)
        except Exception:  # a broken deepspeed install must not break unwrapping
            pass
    import torch.distributed as dist

    if dist.is_available():
        from torch.distributed.fsdp import FullyShardedDataParallel

        types.append(FullyShardedDataParallel)
    return tuple(types)


def _unwrap_children(module: Any) -> Any:
    inner = _unwrap_children(module.module) if hasattr(module, "module") else module
    for name, child in inner.named_children():
        setattr(inner, name, _unwrap_children(child))
    return inner


def extract_model_from_parallel(model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True,
                                recursive: bool = False) -> Any:
    """The user's model inside DDP / DataParallel / FSDP / DeepSpeed wrappers.

    ``keep_torch_compile``: a compiled model (or one from :func:`compile_regions`) is returned still
    compiled, around the unwrapped model; otherwise the uncompiled module. ``keep_fp32_wrapper=False``
    removes the mixed-precision forward wrapper ``prepare`` installed (the model's original
    ``forward`` is put back). ``recursive`` also unwraps ``.module`` wrappers of every submodule.
    """
    compiled = None
    if is_compiled_module(model):
        compiled, model = model, model._orig_mod
    elif isinstance(model, torch.nn.Module) and has_compiled_regions(model) and "_orig_mod" in model.__dict__:
        compiled, model = model, model.__dict__["_orig_mod"]

    wrappers = _wrapper_types()
    while isinstance(model, wrappers):
        model = model.module
    if recursive:
        model = _unwrap_children(model)

    if not keep_fp32_wrapper:
        original = model.__dict__.pop("_original_forward", None)
        if original is not None:
            forward = model.forward
            while hasattr(forward, "__wrapped__"):
                forward = forward.__wrapped__
                if forward == original:
                    break
            model.forward = MethodType(forward, model)

    if keep_torch_compile and compiled is not None:
        if is_compiled_module(compiled):
            compiled._orig_mod = model
        else:
            compiled.__dict__["_orig_mod"] = model
        return compiled
    return model


def model_has_dtensor(model: torch.nn.Module) -> bool:
    """Whether some parameter of ``model`` is a DTensor (tensor- or FSDP2-sharded)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def get_model_tp_size(model: Any) -> int | None:
    """The tensor-parallel degree a transformers model was sharded with, or None.

    transformers < 5 keeps it in ``model.tp_size``; transformers >= 5 in
    ``model.config.distributed_config`` (an object or, after a JSON round trip, a dict).
    """
    size = getattr(model, "tp_size", None)
    if size is not None:
        return size
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)
    if isinstance(distributed, dict):
        return distributed.get("tp_size")
    return getattr(distributed, "tp_size", None)


# ---------------------------------------------------------------------------- saving
def wait_for_everyone() -> None:
    """Barrier: return once every process has reached this call."""
    from ..state import PartialState

    PartialState().wait_for_everyone()


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    try:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        size = storage.nbytes()
    except (NotImplementedError, RuntimeError):  # tensors without storage (meta, some subclasses)
        return (id(tensor),)
    return (tensor.device, pointer, size)


def clean_state_dict_for_safetensors(state_dict: dict) -> dict:
    """A state dict safetensors can write: tied (storage-sharing) entries after the first dropped, with a
    warning naming them, and every tensor contiguous."""
    seen: dict[tuple[Any, ...], str] = {}
    removed = []
    for name, value in list(state_dict.items()):
        if not isinstance(value, torch.Tensor) or value.device.type == "meta":
            continue
        key = _storage_key(value)
        if key in seen:
            removed.append(name)
            del state_dict[name]
        else:
            seen[key] = name
    if removed:
        logger.warning(
            f"Removed shared tensor {set(removed)} while saving. This should be OK, but check by verifying that "
            "you don't receive any warning while reloading"
        )
    return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state_dict.items()}


def save(obj: Any, f: Any, save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """``torch.save`` (or safetensors with ``safe_serialization``) on the main process only.

    With ``save_on_each_node`` the local main process of every node writes. A state dict written
    as safetensors loses its tied duplicates (see :func:`clean_state_dict_for_safetensors`).
    """
    from ..state import PartialState

    state = PartialState()
    writer = state.is_local_main_process if save_on_each_node else state.is_main_process
    if not writer:
        return
    if safe_serialization:
        from safetensors.torch import save_file

        if isinstance(obj, OrderedDict):
            obj = clean_state_dict_for_safetensors(obj)
        if not isinstance(obj, dict):
            raise TypeError(f"safe_serialization needs a dict of tensors, got {type(obj).__name__}")
        save_file(obj, f, metadata={"format": "pt"})
    else:
        torch.save(obj, f)


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` with ``weights_only=True`` unless the caller says otherwise (no pickle code runs)."""
    kwargs.setdefault("weights_only", True)
    return torch.load(f, map_location=map_location, **kwargs)


# ---------------------------------------------------------------------------- small helpers
def get_pretty_name(obj: Any) -> str:
    """The qualified name of ``obj`` (or of its class), else ``str(obj)``."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or str(obj)


def merge_dicts(source: dict, destination: dict) -> dict:
    """Merge ``source`` into ``destination`` recursively (nested dicts merged, other values replaced)."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def is_port_in_use(port: int | None = None) -> bool:
    """Whether something listens on ``localhost:port`` (the default rendezvous port when not given)."""
    return network.is_port_in_use(port)


def get_free_port() -> int:
    """A TCP port the operating system reports free right now."""
    return network.free_port()


def convert_bytes(size: float) -> str:
    """``size`` bytes in the largest unit that keeps it under 1024 (``"1.5 MB"``)."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def check_os_kernel() -> None:
    """Warn (main process) when a Linux kernel is older than 5.5, which can hang multi-process runs."""
    info = platform.uname()
    if info.system != "Linux":
        return
    match = re.search(r"\d+\.\d+\.\d+", str(info.release))
    if match is None:
        return
    try:
        too_old = Version(match.group(0)) < Version(MIN_KERNEL_VERSION)
    except InvalidVersion:
        return
    if too_old:
        from ..state import PartialState, is_initialized

        if is_initialized() and not PartialState().is_main_process:
            return
        logger.warning(
            f"Detected kernel version {match.group(0)}, which is below the recommended minimum of "
            f"{MIN_KERNEL_VERSION}; this can cause the process to hang. It is recommended to upgrade the kernel "
            "to the minimum version or higher."
        )


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``getattr`` along a dotted path (``recursive_getattr(model, "encoder.layer.0")``)."""
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def write_basic_config(mixed_precision: str = "no", save_location: str | os.PathLike[str] | None = None) -> Any:
    """Write a default launch config for this machine (like ``accel config default``).

    Returns the path written, or False (with a message) when a file already exists there.
    ``save_location`` defaults to the config file ``accel launch`` reads.
    """
    from pathlib import Path

    from ..launch.config_file import default_config_path, save_config
    from ..launch.machine_config import default_config

    mixed_precision = check_precision(mixed_precision, "`mixed_precision`")
    path = Path(save_location) if save_location is not None else default_config_path()
    if path.exists():
        print(f"Configuration already exists at {path}, will not override. Run `accel config` manually or pass a "
              "different `save_location`.")
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_config(default_config(mixed_precision=mixed_precision), path)


# ---------------------------------------------------------------------------- in-place regional compilation
def _compile_in_place(module: torch.nn.Module, **compile_kwargs: Any) -> None:
    if is_repeated_blocks(module):
        for block in module:
            block.compile(**compile_kwargs)
    elif has_repeated_blocks(module):
        for child in module.children():
            _compile_in_place(child, **compile_kwargs)
    else:
        module.compile(**compile_kwargs)


def compile_regions_deepspeed(module: torch.nn.Module, **compile_kwargs: Any) -> None:
    """Regional compilation of a DeepSpeed engine's module, in place (``nn.Module.compile``).

    ``torch.compile(module)`` would return a new module that bypasses the hooks DeepSpeed installed;
    compiling in place keeps them.
    """
    _compile_in_place(module, **compile_kwargs)


def compile_regions_fsdp2(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Regional compilation in place, before ``fully_shard``: the module keeps ``nn.Module.__call__``, so the
    hooks FSDP2 adds later (all-gather, reshard) still run. Returns ``module``."""
    _compile_in_place(module, **compile_kwargs)
    return module


def get_module_children_bottom_up(model: torch.nn.Module, return_fqns: bool = False) -> list[Any]:
    """Every submodule of ``model``, children before parents, ``model`` last (with qualified names if ``return_fqns``).

    The order FSDP2 wraps a model in: inner blocks first.
    """
    order: list[tuple[str, torch.nn.Module]] = []
    stack = [("", model)]
    while stack:
        name, current = stack.pop()
        order.append((name, current))
        stack.extend((f"{name}.{child_name}" if name else child_name, child) for child_name, child in current.named_children())
    order.reverse()
    return order if return_fqns else [module for _, module in order]


def _torch_safe_globals() -> list[Any]:
    import codecs

    import numpy as np

    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, np.ndarray, codecs.encode, np.dtype]
    if hasattr(np, "dtypes"):
        allowed.append(np.dtypes.UInt32DType)
    return allowed


def __getattr__(name: str) -> Any:
    # TORCH_SAFE_GLOBALS imports numpy, so it is built on first use
    if name == "TORCH_SAFE_GLOBALS":
        value = globals()["TORCH_SAFE_GLOBALS"] = _torch_safe_globals()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ += ["TORCH_SAFE_GLOBALS", "compile_regions_deepspeed", "compile_regions_fsdp2", "get_module_children_bottom_up"]
