"""``Accelerator.save`` and ``Accelerator.save_model``: single objects and model weights in the Hugging
Face layout (sharded with an index), each file written through a temporary file."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

from ..io.files import atomic_write
from . import serialization
from .context import CheckpointContext
from .layout import MODEL_NAME, SAFE_MODEL_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME
from .serialization import json_save, tensors_for_safetensors
from .transaction import is_writer

logger = logging.getLogger(__name__)


def save(ctx: CheckpointContext, obj: Any, f: Any, safe_serialization: bool = False) -> None:
    """``torch.save`` (or safetensors for a dict of tensors) on the process that writes, atomically."""
    if not is_writer(ctx):
        return
    if safe_serialization:
        tensors = tensors_for_safetensors(obj, "the object to save")
        if isinstance(f, (str, os.PathLike)):
            atomic_write(Path(f), lambda tmp: serialization.safetensors_save(tensors, tmp))
        else:
            from safetensors.torch import save as to_bytes

            f.write(to_bytes(tensors, metadata={"format": "pt"}))
        return
    if isinstance(f, (str, os.PathLike)):
        atomic_write(Path(f), lambda tmp: serialization.torch_save(obj, tmp))
    else:
        torch.save(obj, f)


_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?b|b)?\s*", re.IGNORECASE)


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(size: int | str, name: str = "max_shard_size") -> int:
    """Bytes in ``size``: an int, or a string like "10GB", "200MB", "5KB", "1.5GiB" (case-insensitive)."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise TypeError(f"{name} must be an int number of bytes or a string like '10GB', got {type(size).__name__}")
    if isinstance(size, int):
        value = size
    else:
        match = _SIZE.fullmatch(size)
        if match is None:
            raise ValueError(
                f"{name}={size!r} is not a size: use an int number of bytes or a string such as "
                "'10GB', '200MB', '5KB' or '2GiB'"
            )
        value = int(float(match.group(1)) * _UNITS[(match.group(2) or "b").lower()])
    if value <= 0:
        raise ValueError(f"{name}={size!r} must be more than 0 bytes")
    return value


def _shard(tensors: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    current = 0
    for key, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and current + size > limit:
            shards.append({})
            current = 0
        shards[-1][key] = tensor
        current += size
    return shards


def save_model(ctx: CheckpointContext, model: torch.nn.Module, save_directory: str | os.PathLike,
               max_shard_size: int | str = "10GB", safe_serialization: bool = True) -> None:
    """The unwrapped model's weights in the Hugging Face layout (sharded with an index above max_shard_size)."""
    limit = parse_size(max_shard_size)
    directory = Path(os.path.expanduser(os.fspath(save_directory)))
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"save_model: {directory} is a file, not a directory")
    # under ZeRO-3/FSDP the full state dict is a gather every process joins, so it comes before the
    # writer check (a non-writer returning first would leave the writer waiting forever)
    state_dict = ctx.get_state_dict(model)
    if not is_writer(ctx):
        return
    directory.mkdir(parents=True, exist_ok=True)
    if safe_serialization:
        tensors = tensors_for_safetensors(state_dict, "the model's state_dict")
        prefix, ext, index_name = SAFE_MODEL_NAME, "safetensors", SAFE_WEIGHTS_INDEX_NAME
    else:
        tensors = {k: v.detach().cpu() for k, v in state_dict.items()}
        prefix, ext, index_name = MODEL_NAME, "bin", WEIGHTS_INDEX_NAME
    shards = _shard(tensors, limit)
    count = len(shards)
    names = [f"{prefix}.{ext}"] if count == 1 else [f"{prefix}-{i + 1:05d}-of-{count:05d}.{ext}" for i in range(count)]
    for name, shard in zip(names, shards):
        if safe_serialization:
            atomic_write(directory / name, lambda tmp, shard=shard: serialization.safetensors_save(shard, tmp))
        else:
            atomic_write(directory / name, lambda tmp, shard=shard: serialization.torch_save(shard, tmp))
    written = set(names)
    if count > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
            "weight_map": {key: name for name, shard in zip(names, shards) for key in shard},
        }
        atomic_write(directory / index_name, lambda tmp: json_save(index, tmp))
        written.add(index_name)
    # remove what a previous save of this format left behind (other shard counts, single file vs index)
    stale = re.compile(re.escape(prefix) + r"(-\d{5}-of-\d{5})?\." + ext + r"(\.index\.json)?")
    for entry in directory.iterdir():
        if entry.name not in written and stale.fullmatch(entry.name) and entry.is_file():
            entry.unlink()
    logger.info("model weights saved in %s (%d file%s)", directory, count, "s" if count > 1 else "")
