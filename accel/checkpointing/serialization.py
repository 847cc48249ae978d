"""How each kind of checkpoint file is written and read: torch.save archives of plain data (read
weights-only), safetensors and JSON; every file fsynced on write, every read failure a CheckpointError
naming the file."""

from __future__ import annotations

import base64
import json
import os
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from ..launch import heartbeat
from ..io.files import fsync_file
from .layout import CheckpointError


def torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path``, flushed and fsynced (a long write also tells the launcher's watchdog it is alive)."""
    with open(path, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    heartbeat.alive()  # a long save is work, not a hang (accel launch's watchdog)


def safetensors_save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """A safetensors file of ``tensors`` at ``path``, fsynced."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt", **(metadata or {})})
    fsync_file(path)
    heartbeat.alive()  # a long save is work, not a hang (accel launch's watchdog)


def json_save(data: Any, path: Path) -> None:
    """``data`` as JSON at ``path``, fsynced."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    heartbeat.alive()  # a long save is work, not a hang (accel launch's watchdog)


def tensors_for_safetensors(obj: Any, what: str) -> dict[str, torch.Tensor]:
    """A dict of contiguous CPU tensors safetensors accepts; tensors sharing memory (tied weights) are cloned."""
    if not isinstance(obj, dict):
        raise TypeError(f"safe_serialization saves a dict of tensors; {what} is a {type(obj).__name__}")
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, value in obj.items():
        if not isinstance(key, str):
            raise TypeError(f"safe_serialization needs string keys; {what} has key {key!r}")
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"safe_serialization saves tensors only; {what}[{key!r}] is a {type(value).__name__} "
                "(pass safe_serialization=False to use torch.save)"
            )
        tensor = value.detach().cpu()
        ptr = tensor.untyped_storage().data_ptr() if tensor.numel() else 0
        if ptr and ptr in seen:
            tensor = tensor.clone()  # safetensors refuses tensors that share memory
        elif ptr:
            seen.add(ptr)
        out[key] = tensor.contiguous()
    return out


_PLAIN_SCALARS = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device, torch.Size)


def check_plain(obj: Any, where: str) -> None:
    """Raise at save time for what ``torch.load(weights_only=True)`` would refuse at load time."""
    stack = [(obj, where)]
    while stack:
        value, path = stack.pop()
        kind = type(value)
        if isinstance(value, torch.Tensor) or kind in _PLAIN_SCALARS:
            continue
        if kind in (dict, OrderedDict):
            for k, v in value.items():
                stack.append((k, f"{path} key"))
                stack.append((v, f"{path}[{k!r}]"))
        elif kind in (list, tuple, set):
            for i, v in enumerate(value):
                stack.append((v, f"{path}[{i}]"))
        else:
            raise TypeError(
                f"{path} is a {kind.__module__}.{kind.__qualname__}: checkpoints hold tensors, numbers, strings, "
                "lists, tuples, sets and dicts only (accel never unpickles code when loading); convert it, "
                "e.g. a numpy scalar with float()/int() or an array with torch.from_numpy()"
            )


def b64encode_tensor(tensor: torch.Tensor) -> str:
    """A tensor's raw bytes as base64 text (RNG states in JSON)."""
    return base64.b64encode(tensor.cpu().contiguous().numpy().tobytes()).decode("ascii")


def b64decode_tensor(text: str) -> torch.Tensor:
    """The uint8 tensor whose bytes ``b64encode_tensor`` wrote."""
    return torch.frombuffer(bytearray(base64.b64decode(text.encode("ascii"))), dtype=torch.uint8).clone()


def torch_load(path: Path, expected: str, load_kwargs: dict[str, Any] | None = None) -> Any:
    """``torch.load(weights_only=True)`` of a checkpoint file; every failure is a CheckpointError naming the file and what was expected there."""
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: expected {expected}")
    kwargs = dict(load_kwargs or {})
    if kwargs.pop("weights_only", True) is not True:
        raise ValueError("load_state never unpickles code: weights_only=False is not accepted in load_kwargs")
    kwargs.setdefault("map_location", "cpu")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, weights_only=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a CheckpointError naming the file
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        code = next((line for line in lines if "GLOBAL" in line or "global" in line), None)
        if code is not None:
            raise CheckpointError(
                f"{path} was refused: it holds Python objects other than tensors and plain data, and loading it "
                f"could run code ({code}); expected {expected}"
            ) from None
        detail = next((line for line in lines if "Unsupported" in line), lines[0] if lines else "no detail")
        raise CheckpointError(
            f"{path} is corrupt or truncated, or not a torch.save archive of plain data "
            f"({type(exc).__name__}: {detail}); it was not unpickled; expected {expected}"
        ) from None


def load_safetensors(path: Path, expected: str) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors on the host; a missing or damaged file is a CheckpointError naming it."""
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: expected {expected}")
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"{path} is corrupt or truncated: {exc}; expected {expected}") from None


def load_json(path: Path, expected: str) -> Any:
    """A JSON file; a missing or damaged file is a CheckpointError naming it."""
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: expected {expected}")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is corrupt or truncated (not valid JSON: {exc}); expected {expected}") from None
