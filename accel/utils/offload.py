"""Disk offload of weights, with Accelerate's names and on-disk format.

Offloaded tensors live in ``<folder>/<name>.dat`` (raw bytes, as ``numpy.memmap`` writes them) next to an
``index.json`` giving each tensor's dtype and shape, the layout Accelerate uses, so offload folders are
interchangeable between the two libraries. An index entry may instead point into a safetensors file
(``{"safetensors_file": ..., "weight_name": ..., "dtype": ...}``): ``load_checkpoint_in_model`` offloads
weights of a safetensors checkpoint that way, without writing a copy.

Reading is memory-mapped and zero-copy: a loaded weight is a copy-on-write private mapping of its bytes,
so a forward pass over disk-offloaded layers reads them straight from the page cache (no ``memcpy`` into
fresh memory), and writing into the tensor never touches the file. The mapping is released with the
tensor, so offloaded weights stop counting in the process's memory after their layer ran.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Mapping
from typing import Any, Iterator

import numpy as np
import torch

from accel.backends import is_host_device
from accel.facts.checkpoint import OFFLOAD_INDEX_NAME

__all__ = [
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "extract_submodules_state_dict",
    "load_offloaded_weight",
    "offload_state_dict",
    "offload_weight",
    "save_offload_index",
]

INDEX_NAME = OFFLOAD_INDEX_NAME

# dtypes numpy cannot hold: stored through an integer view of the same width
_VIEW_AS = {torch.bfloat16: torch.int16}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
    if hasattr(torch, _name):
        _VIEW_AS[getattr(torch, _name)] = torch.int8

_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
for _code, _name in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")):
    if hasattr(torch, _name):
        _SAFETENSORS_DTYPES[_code] = getattr(torch, _name)


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in an offload index")
    return dtype


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).split(".", 1)[1]


def _check_writable(folder: str | os.PathLike) -> None:
    """Create ``folder`` if needed; raise an error naming it when files cannot be written there."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise PermissionError(f"offload folder {str(folder)!r} cannot be created: {exc}") from exc
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"offload folder {str(folder)!r} is not writable")


def offload_weight(weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike, index: dict | None = None) -> dict | None:
    """Write ``weight`` to ``<offload_folder>/<weight_name>.dat`` and record its dtype and shape in ``index``."""
    dtype = weight.dtype
    tensor = weight.detach()
    if not is_host_device(tensor.device):
        tensor = tensor.cpu()
    if dtype in _VIEW_AS:
        tensor = tensor.view(_VIEW_AS[dtype])
    array = tensor.contiguous().numpy()
    if index is not None:
        index[weight_name] = {"dtype": _dtype_name(dtype), "shape": list(array.shape)}
    if array.ndim == 0:  # numpy cannot map a 0-d array
        array = array.reshape(1)
    path = os.path.join(offload_folder, f"{weight_name}.dat")
    try:
        mapped = np.memmap(path, dtype=array.dtype, mode="w+", shape=array.shape)
    except OSError as exc:
        raise PermissionError(f"cannot offload {weight_name!r}: writing {path!r} failed: {exc}") from exc
    mapped[...] = array
    mapped.flush()
    del mapped
    return index


def _map_bytes(path: str, offset: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over ``nbytes`` of ``path`` from ``offset``: private, copy-on-write, zero-copy."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    length = offset + nbytes - start
    with open(path, "rb") as fh:
        if hasattr(mmap, "MAP_PRIVATE"):
            # no MAP_POPULATE: on a private writable mapping it would copy every page up front; pages are
            # faulted in from the page cache (with the kernel's fault-around) as the forward reads them
            mapped = mmap.mmap(fh.fileno(), length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
        else:  # Windows
            mapped = mmap.mmap(fh.fileno(), length, access=mmap.ACCESS_COPY, offset=start)
    # frombuffer keeps ``mapped`` alive as long as the tensor (or a view of it) lives
    return torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=offset - start)


def _bytes_as(raw: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    itemsize = torch.empty((), dtype=dtype).element_size()
    if raw.numel() != int(np.prod(shape, dtype=np.int64)) * itemsize:
        raise ValueError(f"offloaded data has {raw.numel()} bytes, expected {shape} x {dtype}")
    if raw.data_ptr() % itemsize:  # misaligned: viewing would be undefined for vector kernels
        raw = raw.clone()
    return raw.view(dtype).reshape(shape)


def load_offloaded_weight(weight_file: str | os.PathLike, weight_info: Mapping[str, Any]) -> torch.Tensor:
    """Load one ``.dat`` weight described by ``weight_info`` (``dtype``, ``shape``), memory-mapped."""
    dtype = _torch_dtype(weight_info["dtype"])
    shape = tuple(weight_info["shape"])
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize if shape else itemsize
    path = os.fspath(weight_file)
    size = os.path.getsize(path)
    if size < nbytes:
        raise ValueError(f"offloaded weight {path!r} holds {size} bytes, its index entry needs {nbytes}")
    return _bytes_as(_map_bytes(path, 0, nbytes), dtype, shape)


class _SafetensorsHeader:
    """Parsed header of one safetensors file: where each tensor's bytes are."""

    def __init__(self, path: str):
        with open(path, "rb") as fh:
            (length,) = np.frombuffer(fh.read(8), dtype="<u8")
            header = json.loads(fh.read(int(length)))
        header.pop("__metadata__", None)
        self.path = path
        self.data_start = 8 + int(length)
        self.entries = header

    def tensor(self, name: str) -> torch.Tensor:
        try:
            entry = self.entries[name]
        except KeyError:
            raise KeyError(f"{name!r} is not in safetensors file {self.path!r}") from None
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
        start, end = entry["data_offsets"]
        if dtype is None:  # a dtype this reader does not know: let the library decode it
            from safetensors import safe_open

            with safe_open(self.path, framework="pt") as fh:
                return fh.get_tensor(name)
        raw = _map_bytes(self.path, self.data_start + start, end - start)
        return _bytes_as(raw, dtype, tuple(entry["shape"]))


def save_offload_index(index: Mapping[str, Any] | None, offload_folder: str | os.PathLike) -> None:
    """Merge ``index`` into ``<offload_folder>/index.json`` (nothing to do for an empty index)."""
    if not index:
        return
    path = os.path.join(offload_folder, INDEX_NAME)
    current: dict[str, Any] = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            current = json.load(fh)
    current.update(index)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(current, fh, indent=2)


def offload_state_dict(save_dir: str | os.PathLike, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Offload every tensor of ``state_dict`` to ``save_dir`` (one ``.dat`` each plus ``index.json``)."""
    _check_writable(save_dir)
    index: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


class PrefixedDataset(Mapping):
    """A read-only view of ``dataset`` restricted to keys starting with ``prefix`` (given without it)."""

    def __init__(self, dataset: Mapping, prefix: str):
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return iter([key for key in self.dataset if key.startswith(self.prefix)])

    def __len__(self) -> int:
        # Accelerate reports the whole dataset's length; kept for compatibility
        return len(self.dataset)


class OffloadedWeightsLoader(Mapping):
    """One mapping over weights kept in RAM (``state_dict``) and weights offloaded to disk (``save_folder``/``index``).

    The in-memory state dict wins when a key is in both. Disk weights are read on each access,
    memory-mapped; ``device`` (default CPU) is where weights pointed at inside safetensors files land.
    """

    def __init__(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        save_folder: str | os.PathLike | None = None,
        index: Mapping[str, Any] | None = None,
        device: Any = None,
    ):
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("Need either a `state_dict`, a `save_folder` or an `index` containing offloaded weights.")
        self.state_dict = {} if state_dict is None else state_dict
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            path = os.path.join(save_folder, INDEX_NAME)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"offload folder {str(save_folder)!r} has no {INDEX_NAME}: nothing was offloaded there")
            with open(path, encoding="utf-8") as fh:
                index = json.load(fh)
        self.index = {} if index is None else index
        self.all_keys = list(self.state_dict.keys())
        known = set(self.all_keys)
        self.all_keys.extend(key for key in self.index if key not in known)
        self.device = device
        self._headers: dict[str, _SafetensorsHeader] = {}

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        try:
            info = self.index[key]
        except KeyError:
            raise KeyError(f"{key!r} is neither in the in-memory state dict nor in the offload index") from None
        if info.get("safetensors_file") is not None:
            path = info["safetensors_file"]
            header = self._headers.get(path)
            if header is None:
                header = self._headers[path] = _SafetensorsHeader(path)
            tensor = header.tensor(info.get("weight_name", key))
            if "dtype" in info:
                tensor = tensor.to(_torch_dtype(info["dtype"]))
            if self.device is not None:
                from accel.utils.modeling.placement import as_torch_device

                tensor = tensor.to(as_torch_device(self.device))
            return tensor
        if self.save_folder is None:
            raise KeyError(f"{key!r} is offloaded to a .dat file but this loader has no `save_folder`")
        return load_offloaded_weight(os.path.join(self.save_folder, f"{key}.dat"), info)

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


def extract_submodules_state_dict(state_dict: Mapping[str, torch.Tensor], submodule_names: list[str]) -> dict[str, torch.Tensor]:
    """The entries of ``state_dict`` that belong to one of ``submodule_names`` (``a.1`` does not match ``a.10``)."""
    result: dict[str, torch.Tensor] = {}
    for module_name in submodule_names:
        prefix = module_name + "."
        result.update({k: v for k, v in state_dict.items() if k == module_name or k.startswith(prefix) or module_name == ""})
    return result
