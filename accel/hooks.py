"""Forward hooks with Accelerate's names: run code around a module's ``forward`` without subclassing it.

``add_hook_to_module`` replaces ``module.forward`` by a wrapper (same name and signature) calling the
hook's ``pre_forward`` / ``post_forward``; ``remove_hook_from_module`` restores the original forward and
lets the hook undo what it did (``detach_hook``), so a model is unchanged after removal. The hook is
stored as ``module._hf_hook`` and the original forward as ``module._old_forward``, as in Accelerate, so
tools written against Accelerate's attributes keep working.

``AlignDevicesHook`` is what big-model inference builds on: it keeps a module's weights on an execution
device, or offloads them (to the meta device, values kept in a ``weights_map`` in RAM or on disk) and
brings them back just for the forward.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Optional, Union

import torch
import torch.nn as nn

from accel.utils.modeling import (
    check_device_same,
    get_non_persistent_buffers,
    named_module_tensors,
    set_module_tensor_to_device,
)
from accel.utils.offload import PrefixedDataset
from accel.utils.modeling.placement import as_torch_device as _as_torch_device
from accel.utils.operations import find_device, send_to_device

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "LayerwiseCastingHook",
    "ModelHook",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
]

#: attribute where big_modeling records the methods it wrapped on a module (removed with the hooks)
WRAPPED_METHODS_ATTR = "_accel_wrapped_methods"


def _no_compile(fn):
    """Keep ``torch.compile`` from tracing into hook bodies (they move weights around); resolved lazily."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        compiled = wrapper.__dict__.get("_disabled")
        if compiled is None:
            compiled = wrapper._disabled = torch.compiler.disable(fn)
        return compiled(*args, **kwargs)

    return wrapper


def _device_or_none(device: Any) -> Optional[torch.device]:
    return None if device is None else _as_torch_device(device)


class ModelHook:
    """Base hook: override ``init_hook`` / ``pre_forward`` / ``post_forward`` / ``detach_hook``.

    Set ``no_grad = True`` to run the wrapped forward under ``torch.no_grad()``.
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is attached; returns the module."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        """Called before forward with its inputs; returns the (possibly changed) ``args, kwargs``."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called after forward with its output; returns the (possibly changed) output."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed; undoes ``init_hook``."""
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order (``post_forward`` in the same order as ``pre_forward``)."""

    def __init__(self, *hooks: ModelHook):
        self.hooks = hooks

    def init_hook(self, module):
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    @_no_compile
    def pre_forward(self, module, *args, **kwargs):
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    @_no_compile
    def post_forward(self, module, output):
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module):
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _is_fx_graph_module(module: nn.Module) -> bool:
    # torch.fx GraphModules get a per-instance class whose forward is generated code
    return "GraphModuleImpl" in str(type(module))


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    hook = module._hf_hook
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = module._old_forward(*args, **kwargs)
    else:
        output = module._old_forward(*args, **kwargs)
    return module._hf_hook.post_forward(module, output)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Attach ``hook`` to ``module`` (replacing an existing hook, or chaining after it with ``append``).

    The wrapped ``forward`` keeps the original's name and signature. Returns the module.
    """
    if append and getattr(module, "_hf_hook", None) is not None:
        previous = module._hf_hook
        remove_hook_from_module(module)
        hook = SequentialHook(previous, hook)
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        old_forward = module._old_forward  # replacing a hook: keep the true original
    else:
        old_forward = module.forward
        module._old_forward = old_forward
    module = hook.init_hook(module)
    module._hf_hook = hook
    wrapped = functools.update_wrapper(functools.partial(_hooked_forward, module), old_forward)
    if _is_fx_graph_module(module):
        type(module).forward = wrapped
    else:
        module.forward = wrapped
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook of ``module`` (and of all submodules with ``recurse``) and restore its forward."""
    if hasattr(module, "_hf_hook"):
        module._hf_hook.detach_hook(module)
        delattr(module, "_hf_hook")
    if hasattr(module, "_old_forward"):
        old_forward = module._old_forward
        if _is_fx_graph_module(module):
            type(module).forward = old_forward
        elif getattr(old_forward, "__self__", None) is module and getattr(old_forward, "__func__", None) is getattr(type(module), "forward", None):
            module.__dict__.pop("forward", None)  # it was the class's forward: leave no instance attribute behind
        else:
            module.forward = old_forward
        delattr(module, "_old_forward")
    for name in module.__dict__.pop(WRAPPED_METHODS_ATTR, ()):
        module.__dict__.pop(name, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse)
    return module


class AlignDevicesHook(ModelHook):
    """Keep a module's weights on ``execution_device``, or offload them and onload them for each forward.

    Args:
        execution_device: where inputs and weights are put for the forward (an int is a device of the
            active backend).
        offload: keep weights on the meta device between forwards; values come from ``weights_map``
            (by default a CPU copy taken when the hook is attached).
        io_same_device: move the output back to the device the first input tensor was on.
        weights_map: mapping name -> tensor holding the offloaded values (RAM or disk).
        offload_buffers: offload the buffers too (otherwise they live on the execution device).
        place_submodules: handle the tensors of all submodules, not only the direct ones.
        skip_keys: keys of dict inputs/outputs that are not moved.
        tied_params_map: shared map (data pointer -> {device: tensor}) so tied weights are onloaded once.
    """

    #: how accel.utils.modeling.has_offloaded_params recognises this hook without importing this module
    aligns_devices = True

    def __init__(
        self,
        execution_device: Optional[Union[int, str, torch.device]] = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Optional[Mapping] = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: Optional[Union[str, list[str]]] = None,
        tied_params_map: Optional[dict[int, dict[Any, torch.Tensor]]] = None,
    ):
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.input_device = None
        self.param_original_devices: dict[str, torch.device] = {}
        self.buffer_original_devices: dict[str, torch.device] = {}
        self.tied_params_names: set[str] = set()
        self.tied_params_map = tied_params_map
        self.tied_pointers_to_remove: set[tuple[int, torch.device]] = set()

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})"
        )

    def _offloaded_tensors(self, module: nn.Module):
        return named_module_tensors(
            module, include_buffers=self.offload_buffers, recurse=self.place_submodules, remove_non_persistent=True
        )

    def init_hook(self, module):
        device = _device_or_none(self.execution_device)
        if device == torch.device("meta"):
            self.tied_params_map = None
        if not self.offload:
            if device is not None:
                for name, _ in named_module_tensors(module, recurse=self.place_submodules):
                    set_module_tensor_to_device(module, name, device, tied_params_map=self.tied_params_map)
            return module
        self.original_devices = {name: t.device for name, t in named_module_tensors(module, recurse=self.place_submodules)}
        if self.weights_map is None:
            self.weights_map = {
                name: t.to("cpu")
                for name, t in named_module_tensors(module, include_buffers=self.offload_buffers, recurse=self.place_submodules)
            }
        for name, tensor in list(self._offloaded_tensors(module)):
            if self.tied_params_map is not None and tensor.data_ptr() in self.tied_params_map:
                self.tied_params_names.add(name)
            set_module_tensor_to_device(module, name, "meta")
        if device is not None:
            if not self.offload_buffers:
                for name, _ in list(module.named_buffers(recurse=self.place_submodules)):
                    set_module_tensor_to_device(module, name, device, tied_params_map=self.tied_params_map)
            else:
                for name in get_non_persistent_buffers(module, recurse=self.place_submodules):
                    set_module_tensor_to_device(module, name, device, tied_params_map=self.tied_params_map)
        return module

    def _fp16_statistics(self, name: str, value: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if value is None or value.dtype != torch.int8 or "weight" not in name:
            return None
        stats = name.replace("weight", "SCB")
        return self.weights_map[stats] if stats in self.weights_map else None

    @_no_compile
    def pre_forward(self, module, *args, **kwargs):
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        device = _device_or_none(self.execution_device)
        if self.offload:
            self.tied_pointers_to_remove = set()
            for name, _ in list(self._offloaded_tensors(module)):
                value = self.weights_map[name]
                if self.tied_params_map is not None:
                    pointer = value.data_ptr()
                    if name in self.tied_params_names and pointer not in self.tied_params_map:
                        self.tied_params_map[pointer] = {}
                    if pointer in self.tied_params_map and device not in self.tied_params_map[pointer]:
                        self.tied_pointers_to_remove.add((pointer, device))
                set_module_tensor_to_device(
                    module,
                    name,
                    device if device is not None else value.device,
                    value=value,
                    fp16_statistics=self._fp16_statistics(name, value),
                    tied_params_map=self.tied_params_map,
                    clear_cache=False,
                )
        if device is None:
            return args, kwargs
        return send_to_device(args, device), send_to_device(kwargs, device, skip_keys=self.skip_keys)

    @_no_compile
    def post_forward(self, module, output):
        if self.offload:
            for name, _ in list(self._offloaded_tensors(module)):
                set_module_tensor_to_device(module, name, "meta")
            for pointer, device in self.tied_pointers_to_remove:
                self.tied_params_map.get(pointer, {}).pop(device, None)
            self.tied_pointers_to_remove = set()
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module):
        if self.offload:
            for name, device in self.original_devices.items():
                if device != torch.device("meta"):
                    value = self.weights_map.get(name, None) if isinstance(self.weights_map, Mapping) else None
                    set_module_tensor_to_device(
                        module, name, device, value=value, fp16_statistics=self._fp16_statistics(name, value)
                    )
        return module


def attach_execution_device_hook(
    module: nn.Module,
    execution_device: Union[int, str, torch.device],
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    tied_params_map: Optional[dict[int, dict[Any, torch.Tensor]]] = None,
) -> None:
    """Give every submodule holding tensors (and no hook yet) a hook that moves its inputs to ``execution_device``."""
    if not hasattr(module, "_hf_hook") and len(module.state_dict()) > 0:
        add_hook_to_module(module, AlignDevicesHook(execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map))
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(
            child, execution_device, skip_keys=skip_keys, preload_module_classes=preload_module_classes, tied_params_map=tied_params_map
        )


def attach_align_device_hook(
    module: nn.Module,
    execution_device: Optional[Union[int, str, torch.device]] = None,
    offload: bool = False,
    weights_map: Optional[Mapping] = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    tied_params_map: Optional[dict[int, dict[Any, torch.Tensor]]] = None,
) -> None:
    """Attach an ``AlignDevicesHook`` to every submodule that has direct tensors.

    Modules whose class is in ``preload_module_classes`` get one hook for their whole subtree (their
    weights are onloaded before their forward even if submodules are not called).
    """
    whole = offload and preload_module_classes is not None and type(module).__name__ in preload_module_classes
    has_direct = next(iter(named_module_tensors(module)), None) is not None
    if has_direct or whole:
        prefixed = None
        if weights_map is not None:
            prefixed = PrefixedDataset(weights_map, f"{module_name}." if module_name else "")
        hook = AlignDevicesHook(
            execution_device=execution_device,
            offload=offload,
            weights_map=prefixed,
            offload_buffers=offload_buffers,
            place_submodules=whole,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        add_hook_to_module(module, hook, append=True)
    if whole:
        return
    for child_name, child in module.named_children():
        attach_align_device_hook(
            child,
            execution_device=execution_device,
            offload=offload,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=f"{module_name}.{child_name}" if module_name else child_name,
            preload_module_classes=preload_module_classes,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of ``module`` and all its submodules."""
    remove_hook_from_module(module)
    for child in module.children():
        remove_hook_from_submodules(child)


def attach_align_device_hook_on_blocks(
    module: nn.Module,
    execution_device: Optional[Union[int, str, torch.device, Mapping[str, Any]]] = None,
    offload: Union[bool, Mapping[str, bool]] = False,
    weights_map: Optional[Mapping] = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    tied_params_map: Optional[dict[int, dict[Any, torch.Tensor]]] = None,
) -> None:
    """Attach hooks per block of a device map: ``execution_device`` and ``offload`` map block names to values.

    A block that is not offloaded gets one hook placing its whole subtree on its device; an offloaded
    block gets per-submodule offload hooks; the root moves outputs back to the input's device.
    """
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if not offload:
            add_hook_to_module(
                module,
                AlignDevicesHook(
                    execution_device=execution_device,
                    io_same_device=True,
                    skip_keys=skip_keys,
                    place_submodules=True,
                    tied_params_map=tied_params_map,
                ),
            )
        else:
            attach_align_device_hook(
                module,
                execution_device=execution_device,
                offload=True,
                weights_map=weights_map,
                offload_buffers=offload_buffers,
                module_name=module_name,
                skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            )
        return

    if not isinstance(execution_device, Mapping):
        execution_device = {key: execution_device for key in offload}
    if not isinstance(offload, Mapping):
        offload = {key: offload for key in execution_device}

    if module_name in execution_device and module_name in offload and not offload[module_name]:
        add_hook_to_module(
            module,
            AlignDevicesHook(
                execution_device=execution_device[module_name],
                offload_buffers=offload_buffers,
                io_same_device=(module_name == ""),
                place_submodules=True,
                skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            ),
        )
        attach_execution_device_hook(module, execution_device[module_name], skip_keys=skip_keys, tied_params_map=tied_params_map)
    elif module_name in execution_device and module_name in offload:
        attach_align_device_hook(
            module,
            execution_device=execution_device[module_name],
            offload=True,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=module_name,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
        )
        if not hasattr(module, "_hf_hook"):
            add_hook_to_module(
                module,
                AlignDevicesHook(
                    execution_device=execution_device[module_name],
                    io_same_device=(module_name == ""),
                    skip_keys=skip_keys,
                    tied_params_map=tied_params_map,
                ),
            )
        attach_execution_device_hook(
            module,
            execution_device[module_name],
            preload_module_classes=preload_module_classes,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
    elif module_name == "":
        add_hook_to_module(
            module,
            AlignDevicesHook(
                execution_device=execution_device.get(""), io_same_device=True, skip_keys=skip_keys, tied_params_map=tied_params_map
            ),
        )

    for child_name, child in module.named_children():
        attach_align_device_hook_on_blocks(
            child,
            execution_device=execution_device,
            offload=offload,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=f"{module_name}.{child_name}" if module_name else child_name,
            preload_module_classes=preload_module_classes,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )


class CpuOffload(ModelHook):
    """Keep a whole model on the CPU and move it to ``execution_device`` when it is called.

    With ``prev_module_hook`` (a ``UserCpuOffloadHook``), the previous model of a pipeline is sent back
    to the CPU first, so only one model occupies the device at a time.
    """

    def __init__(
        self,
        execution_device: Optional[Union[str, int, torch.device]] = None,
        prev_module_hook: Optional["UserCpuOffloadHook"] = None,
    ):
        self.prev_module_hook = prev_module_hook
        if execution_device is None:
            from accel.state import PartialState

            execution_device = PartialState().default_device
        self.execution_device = execution_device

    def init_hook(self, module):
        return module.to("cpu")

    @_no_compile
    def pre_forward(self, module, *args, **kwargs):
        if isinstance(self.prev_module_hook, UserCpuOffloadHook):
            previous = self.prev_module_hook.model
            first = next(previous.parameters(), None)
            if first is not None and first.device != torch.device("cpu"):
                self.prev_module_hook.offload()
                from accel.utils.memory import clear_device_cache

                clear_device_cache()
        device = _as_torch_device(self.execution_device)
        first = next(module.parameters(), None)
        if first is not None and check_device_same(first.device, device):
            return args, kwargs
        module.to(device)
        return send_to_device(args, device), send_to_device(kwargs, device)


class UserCpuOffloadHook:
    """Handle returned by ``cpu_offload_with_hook``: ``offload()`` sends the model back to the CPU, ``remove()`` detaches."""

    def __init__(self, model: nn.Module, hook: CpuOffload):
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        remove_hook_from_module(self.model)


class LayerwiseCastingHook(ModelHook):
    """Store a layer's weights in ``storage_dtype`` (e.g. fp8) and upcast them to ``compute_dtype`` for its forward."""

    _is_stateful = False

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool):
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module):
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return module

    @_no_compile
    def pre_forward(self, module, *args, **kwargs):
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    @_no_compile
    def post_forward(self, module, output):
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output
