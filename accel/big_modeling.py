"""Big-model inference with Accelerate's names: empty init, CPU/disk offload, device-map dispatch.

A model too large for one device is built without memory (``init_empty_weights``), given a device map
(``infer_auto_device_map``: accelerators first, then CPU, then disk), loaded tensor by tensor straight
to where each weight lives (``load_checkpoint_in_model``) and wrapped with hooks that move inputs and
onload offloaded weights for each forward (``dispatch_model``). ``load_checkpoint_and_dispatch`` does all
of it in one call. Integer device ids are devices of the active backend (``accel.backends``).
"""

from __future__ import annotations

import logging
import os
import re
from contextlib import contextmanager
from functools import wraps
from typing import Any, Iterator, Optional, Union

import torch
import torch.nn as nn

from accel.backends import is_host_device
from accel.facts.checkpoint import OFFLOAD_INDEX_NAME
from accel.facts.environment import env_flag
from accel.hooks import (
    WRAPPED_METHODS_ATTR,
    AlignDevicesHook,
    CpuOffload,
    LayerwiseCastingHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
)
from accel.utils.modeling import (
    _as_torch_device,
    _getattr_path,
    check_device_map,
    find_tied_parameters,
    get_balanced_memory,
    infer_auto_device_map,
    load_checkpoint_in_model,
    retie_parameters,
)
from accel.utils.constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
from accel.utils.offload import OffloadedWeightsLoader, extract_submodules_state_dict, offload_state_dict

logger = logging.getLogger(__name__)

__all__ = [
    "attach_layerwise_casting_hooks",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
]

@contextmanager
def init_empty_weights(include_buffers: Optional[bool] = None) -> Iterator[None]:
    """Build models inside this context without allocating their parameters (they land on the meta device).

    Buffers are allocated normally unless ``include_buffers`` (default: ``ACCELERATE_INIT_INCLUDE_BUFFERS``
    or ``ACCEL_INIT_INCLUDE_BUFFERS``). Load weights afterwards with ``load_checkpoint_and_dispatch``.
    """
    if include_buffers is None:
        include_buffers = env_flag("ACCEL_INIT_INCLUDE_BUFFERS", "ACCELERATE_INIT_INCLUDE_BUFFERS")
    with init_on_device(torch.device("meta"), include_buffers=include_buffers) as ctx:
        yield ctx


@contextmanager
def init_on_device(device: Union[int, str, torch.device], include_buffers: Optional[bool] = None) -> Iterator[None]:
    """Create the parameters (and with ``include_buffers`` every tensor) of models built inside on ``device``.

    With ``include_buffers`` this is torch's own device context (``with torch.device(device):``);
    otherwise ``nn.Module.register_parameter`` is patched for the duration of the context and restored
    after it, even on error.
    """
    if include_buffers is None:
        include_buffers = env_flag("ACCEL_INIT_INCLUDE_BUFFERS", "ACCELERATE_INIT_INCLUDE_BUFFERS")
    target = _as_torch_device(device)
    if include_buffers:
        with target:
            yield
        return

    original = nn.Module.register_parameter

    def register_parameter_on_device(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        original(module, name, param)
        if param is None:
            return
        current = module._parameters[name]
        if current.device == target:
            return  # already there: keep the object, so weights tied in __init__ stay tied
        extra = dict(current.__dict__)
        hf_initialized = extra.pop("_is_hf_initialized", None)
        extra["requires_grad"] = param.requires_grad
        moved = type(current)(current.to(target), **extra)
        if hf_initialized is not None:
            moved._is_hf_initialized = hf_initialized
        module._parameters[name] = moved

    nn.Module.register_parameter = register_parameter_on_device
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def _first_param_device(model: nn.Module) -> torch.device:
    param = next(iter(model.parameters()), None)
    if param is None:
        raise ValueError(f"{type(model).__name__} has no parameters: pass `execution_device`")
    return param.device


def cpu_offload(
    model: nn.Module,
    execution_device: Optional[Union[int, str, torch.device]] = None,
    offload_buffers: bool = False,
    state_dict: Optional[dict[str, torch.Tensor]] = None,
    preload_module_classes: Optional[list[str]] = None,
) -> nn.Module:
    """Keep all weights in CPU RAM (the model holds meta tensors) and onload each layer for its forward.

    ``execution_device`` defaults to the device of the first parameter. Returns the model.
    """
    if execution_device is None:
        execution_device = _first_param_device(model)
    if state_dict is None:
        state_dict = {name: t.to("cpu") for name, t in model.state_dict().items()}
    # the root hook also moves the inputs to the execution device: a forward that combines its
    # input with a submodule's output (a residual) would otherwise mix host and device tensors
    add_hook_to_module(model, AlignDevicesHook(execution_device=execution_device, io_same_device=True), append=True)
    attach_align_device_hook(
        model,
        execution_device=execution_device,
        offload=True,
        offload_buffers=offload_buffers,
        weights_map=state_dict,
        preload_module_classes=preload_module_classes,
    )
    return model


def cpu_offload_with_hook(
    model: nn.Module,
    execution_device: Optional[Union[int, str, torch.device]] = None,
    prev_module_hook: Optional[UserCpuOffloadHook] = None,
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keep ``model`` on the CPU and move it whole to ``execution_device`` when called; it stays there until
    the returned hook's ``offload()`` (or the next model's forward, chained with ``prev_module_hook``)."""
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def disk_offload(
    model: nn.Module,
    offload_dir: Union[str, os.PathLike],
    execution_device: Optional[Union[int, str, torch.device]] = None,
    offload_buffers: bool = False,
    preload_module_classes: Optional[list[str]] = None,
) -> nn.Module:
    """Write the weights to ``offload_dir`` (unless it already holds an offload index) and read each layer's
    weights from there, memory-mapped, for its forward. Returns the model."""
    if not os.path.isfile(os.path.join(offload_dir, OFFLOAD_INDEX_NAME)):
        offload_state_dict(offload_dir, model.state_dict())
    if execution_device is None:
        execution_device = _first_param_device(model)
    weights_map = OffloadedWeightsLoader(save_folder=offload_dir)
    # the root hook also moves the inputs to the execution device: a forward that combines its
    # input with a submodule's output (a residual) would otherwise mix host and device tensors
    add_hook_to_module(model, AlignDevicesHook(execution_device=execution_device, io_same_device=True), append=True)
    attach_align_device_hook(
        model,
        execution_device=execution_device,
        offload=True,
        offload_buffers=offload_buffers,
        weights_map=weights_map,
        preload_module_classes=preload_module_classes,
    )
    return model


def _target_of_to(*args: Any, **kwargs: Any) -> Optional[Any]:
    """The device a ``Module.to(...)`` call asks for, or None (a dtype-only call)."""
    if kwargs.get("device") is not None:
        return kwargs["device"]
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device
        if isinstance(arg, (str, int, torch.device)) and not isinstance(arg, bool):
            return arg
    return None


def _guard_moves(model: nn.Module, method_names: list[str]) -> None:
    """Warn when a dispatched model is moved; refuse when some of its weights are offloaded (meta)."""
    wrapped = []
    for method_name in method_names:
        method = getattr(model, method_name, None)
        if method is None:
            continue

        def make(fn):
            @wraps(fn)
            def guarded(*args: Any, **kwargs: Any):
                if fn.__name__ != "to" or _target_of_to(*args, **kwargs) is not None:
                    logger.warning("You shouldn't move a model that is dispatched using accelerate hooks.")
                    if any(p.device == torch.device("meta") for p in model.parameters()):
                        raise RuntimeError("You can't move a model that has some modules offloaded to cpu or disk.")
                return fn(*args, **kwargs)

            return guarded

        model.__dict__[method_name] = make(method)
        wrapped.append(method_name)
    model.__dict__[WRAPPED_METHODS_ATTR] = tuple(wrapped)


def _device_key(device: Any) -> Any:
    return str(device) if isinstance(device, torch.device) else device


def dispatch_model(
    model: nn.Module,
    device_map: dict[str, Union[str, int, torch.device]],
    main_device: Optional[Union[str, int, torch.device]] = None,
    state_dict: Optional[dict[str, torch.Tensor]] = None,
    offload_dir: Optional[Union[str, os.PathLike]] = None,
    offload_index: Optional[dict[str, str]] = None,
    offload_buffers: bool = False,
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    force_hooks: bool = False,
) -> nn.Module:
    """Spread ``model`` over the devices of ``device_map`` and hook it so a plain ``model(x)`` runs.

    Modules mapped to ``"cpu"`` or ``"disk"`` are offloaded (weights onloaded to ``main_device`` for their
    forward) unless the main device is the CPU itself, where CPU modules just run there. Disk modules
    need ``offload_dir`` (written here unless it already holds ``index.json``) or ``offload_index``.
    A map with a single device just moves the model (no hooks unless ``force_hooks``). The model's
    ``to`` is guarded: it warns, and refuses while weights are offloaded. Sets ``model.hf_device_map``.
    """
    check_device_map(model, device_map)
    values = list(device_map.values())
    distinct = {_device_key(v) for v in values}
    if len(distinct) > 1 or "disk" in distinct or force_hooks:
        if main_device is None:
            on_devices = [v for v in values if v not in ("cpu", "disk")]
            main_device = on_devices[0] if on_devices else "cpu"
        main_is_host = is_host_device(_as_torch_device(main_device))
        if not main_is_host:
            cpu_modules = [name for name, d in device_map.items() if d == "cpu"]
            if state_dict is None and cpu_modules:
                state_dict = extract_submodules_state_dict(model.state_dict(), cpu_modules)
        disk_modules = [name for name, d in device_map.items() if d == "disk"]
        if disk_modules and offload_dir is None and offload_index is None:
            raise ValueError(
                "We need an `offload_dir` to dispatch this model according to this `device_map`, the following submodules "
                f"need to be offloaded: {', '.join(disk_modules)}."
            )
        if disk_modules and offload_index is None and not os.path.isfile(os.path.join(offload_dir, OFFLOAD_INDEX_NAME)):
            offload_state_dict(offload_dir, extract_submodules_state_dict(model.state_dict(), disk_modules))

        execution_device = {name: main_device if d in ("cpu", "disk") else d for name, d in device_map.items()}
        execution_device[""] = main_device
        offloaded = ("disk",) if main_is_host else ("cpu", "disk")
        offload = {name: d in offloaded for name, d in device_map.items()}
        save_folder = offload_dir if disk_modules else None
        if state_dict is not None or save_folder is not None or offload_index is not None:
            weights_map = OffloadedWeightsLoader(
                state_dict=state_dict,
                save_folder=save_folder,
                index=offload_index,
                device=main_device if offload_index is not None else None,
            )
        else:
            weights_map = None

        tied_params = find_tied_parameters(model)
        tied_params_map: dict[int, dict[Any, torch.Tensor]] = {}
        for group in tied_params:
            for name in group:
                param = _getattr_path(model, name)
                if param.device.type != "meta":
                    tied_params_map[param.data_ptr()] = {}

        attach_align_device_hook_on_blocks(
            model,
            execution_device=execution_device,
            offload=offload,
            offload_buffers=offload_buffers,
            weights_map=weights_map,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
        )
        where = " and ".join(sorted({d for d in values if d in ("cpu", "disk")}))
        if where:
            logger.warning(f"Some parameters are on the meta device because they were offloaded to the {where}.")
        retie_parameters(model, tied_params)
        from accel.backends import get_backend

        backend = get_backend()
        device_type = backend.device_type
        _guard_moves(model, ["to"] + ([device_type] if not backend.is_host and hasattr(model, device_type) else []))
    else:
        model.to(_as_torch_device(values[0]))
    model.hf_device_map = dict(device_map)
    return model


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: Union[str, os.PathLike],
    device_map: Optional[Union[str, dict[str, Union[int, str, torch.device]]]] = None,
    max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None,
    no_split_module_classes: Optional[list[str]] = None,
    offload_folder: Optional[Union[str, os.PathLike]] = None,
    offload_buffers: bool = False,
    dtype: Optional[Union[str, torch.dtype]] = None,
    offload_state_dict: Optional[bool] = None,
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    force_hooks: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> nn.Module:
    """Load ``checkpoint`` into a (typically empty-initialised) model and dispatch it.

    ``device_map`` is a dict, or one of ``"auto"``/``"balanced"``/``"balanced_low_0"`` (spread evenly
    over the accelerators; the last keeps device 0 light) or ``"sequential"`` (fill devices in order),
    computed from ``max_memory``. What does not fit goes to the CPU, then to ``offload_folder`` on disk.
    Without a device map the checkpoint is just loaded.
    """
    strategies = ("auto", "balanced", "balanced_low_0", "sequential")
    if isinstance(device_map, str) and device_map not in strategies:
        raise ValueError(
            "If passing a string for `device_map`, please choose 'auto', 'balanced', 'balanced_low_0' or 'sequential'."
        )
    if isinstance(device_map, str):
        if device_map != "sequential":
            max_memory = get_balanced_memory(
                model,
                max_memory=max_memory,
                no_split_module_classes=no_split_module_classes,
                dtype=dtype,
                low_zero=(device_map == "balanced_low_0"),
            )
        device_map = infer_auto_device_map(
            model,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            offload_buffers=offload_buffers,
        )
    if offload_state_dict is None and device_map is not None and "disk" in device_map.values():
        offload_state_dict = True
    load_checkpoint_in_model(
        model,
        checkpoint,
        device_map=device_map,
        offload_folder=offload_folder,
        dtype=dtype,
        offload_state_dict=bool(offload_state_dict),
        offload_buffers=offload_buffers,
        strict=strict,
        full_state_dict=full_state_dict,
        broadcast_from_rank0=broadcast_from_rank0,
    )
    if device_map is None:
        return model
    return dispatch_model(
        model,
        device_map=device_map,
        offload_dir=offload_folder,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        force_hooks=force_hooks,
    )


def attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: Optional[Union[str, tuple[str, ...]]] = None,
    skip_modules_classes: Optional[tuple[type[nn.Module], ...]] = None,
    non_blocking: bool = False,
) -> None:
    """Store the weights of Linear/Conv layers in ``storage_dtype`` and compute in ``compute_dtype``.

    Layers whose qualified name matches a regex of ``skip_modules_pattern``, or whose class is in
    ``skip_modules_classes``, are left alone (with their whole subtree).
    """
    patterns = (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else skip_modules_pattern
    _cast_layers(module, storage_dtype, compute_dtype, patterns, skip_modules_classes, non_blocking, "")


def _cast_layers(module, storage_dtype, compute_dtype, patterns, skip_classes, non_blocking, prefix: str) -> None:
    skip = (skip_classes is not None and isinstance(module, skip_classes)) or (
        patterns is not None and any(re.search(p, prefix) for p in patterns)
    )
    if skip:
        logger.debug(f'Skipping layerwise casting for layer "{prefix}"')
        return
    if isinstance(module, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
        add_hook_to_module(module, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking), append=True)
        return
    for name, child in module.named_children():
        _cast_layers(child, storage_dtype, compute_dtype, patterns, skip_classes, non_blocking, f"{prefix}.{name}" if prefix else name)


def _refuse_recurrent_layers_under_sequence_parallelism(model: Any) -> None:
    """Refuse models with layers that carry a recurrent state along the sequence (``*linear_attention*``
    layer types): sharding the sequence would restart that state on every rank and silently give wrong
    gradients."""
    config = getattr(model, "config", None)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    layer_types = getattr(config, "layer_types", None) or []
    recurrent = sorted({t for t in layer_types if "linear_attention" in t})
    if recurrent:
        raise ValueError(
            f"Sequence parallelism does not support attention layers of type {recurrent} (model "
            f"{type(model).__name__}): they carry a recurrent state along the sequence, so sharding the sequence "
            "restarts that state on every rank and gives wrong gradients without failing. Use a full-attention "
            "model, or disable sequence parallelism."
        )
