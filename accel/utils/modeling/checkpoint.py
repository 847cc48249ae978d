"""Read checkpoints into a model one tensor at a time (safetensors or torch files, single or sharded)."""

from __future__ import annotations

import gc
import json
import logging
import os
from collections import defaultdict
from typing import Any, Mapping, Optional, Union

import torch
import torch.nn as nn

from ...backends import is_host_device
from ...facts.checkpoint import SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from ...quantization.bnb_params import quantize_and_offload_8bit
from ..offload import _check_writable, _dtype_name, load_offloaded_weight, offload_weight, save_offload_index
from .placement import as_torch_device as _as_torch_device
from .broadcast import RankZeroStream, require_process_group
from .sizes import _proper_dtype
from .tensors import set_module_tensor_to_device
from .ties import (
    _device_of,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    retie_parameters,
)

logger = logging.getLogger(__name__)



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
            if "invalid" not in str(exc) or is_host_device(device):
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

    def describe(self, key: str) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype of ``key`` without reading its data (a safetensors header, a mapped torch file)."""
        if self._handle is not None:
            info = self._handle.get_slice(key)
            return tuple(info.get_shape()), _safetensors_dtype(info.get_dtype())
        value = self._state[key]
        return tuple(value.shape), value.dtype

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
    a model spread over devices (or use ``load_checkpoint_and_dispatch``). With ``broadcast_from_rank0``
    (an initialised process group, no ``device_map``) only rank 0 reads the checkpoint; every other rank
    receives each tensor by broadcast, so its path need not exist there.
    """
    if broadcast_from_rank0:
        require_process_group(device_map)
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

    model_state = model.state_dict(keep_vars=True)
    model_keys = set(model_state)
    buffer_names = {n for n, _ in model.named_buffers()}
    offload_index: dict[str, Any] = {}
    unexpected: set[str] = set()
    loaded: set[str] = set()

    if broadcast_from_rank0:
        _load_broadcast(model, checkpoint, model_state, dtype, unexpected, loaded)
    for path in [] if broadcast_from_rank0 else _checkpoint_files(checkpoint):
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
                    if offload_8bit_bnb:
                        quantize_and_offload_8bit(model, source.get(key), key, target_dtype, offload_folder, offload_index, None)
                    else:
                        _offload_from_checkpoint(model, key, source, target_dtype, offload_folder, offload_index,
                                                 model_state[key])
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


def _load_broadcast(model: nn.Module, checkpoint: Union[str, os.PathLike], model_state: Mapping[str, Any],
                    dtype: Optional[torch.dtype], unexpected: set[str], loaded: set[str]) -> None:
    """The ``broadcast_from_rank0`` walk: rank 0 reads, every rank loads what it receives in place."""
    stream = RankZeroStream(checkpoint, set(model_state), _checkpoint_files, _CheckpointFile)
    failure: Optional[BaseException] = None
    for path, key, value in stream:
        if failure is not None:
            continue  # keep receiving, so the ranks stay in step until they all learn of the failure
        if value is None or key not in model_state:
            unexpected.add(key)
            continue
        try:
            _load_in_place(model, key, value, model_state[key], dtype, path)
        except Exception as exc:
            failure = exc
        loaded.add(key)
    stream.finish(failure)


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
        shape, stored = source.describe(key)  # the header only: the offloaded value stays in the file
        if current is not None and shape != tuple(current.shape):
            raise ValueError(
                f"Shape mismatch for {key!r}: the checkpoint {source.path!r} has {shape}, the model expects {tuple(current.shape)}."
            )
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
    from ..offload import _SAFETENSORS_DTYPES

    try:
        return _SAFETENSORS_DTYPES[code]
    except KeyError:
        raise ValueError(f"unsupported safetensors dtype {code!r}") from None
