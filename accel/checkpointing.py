"""Checkpoints: ``save``, ``save_model``, ``save_state`` / ``load_state`` with Accelerate's names and layout.

Two promises beyond Accelerate's:

* **Atomic.** ``save_state`` writes the whole checkpoint into a hidden sibling directory
  (``.{name}.tmp-{token}``), fsyncs every file, waits for every process, and only then renames it into
  place (an existing directory is first moved aside to ``.{name}.old-{token}`` and deleted after the
  rename). A crash at any moment leaves the previous checkpoint intact and loadable; leftovers are
  ignored by ``load_state`` and cleaned up (or, for a moved-aside checkpoint whose replacement never
  arrived, put back) by the next ``save_state``. ``total_limit`` rotation deletes old checkpoints only
  after the new one is in place, and retires the folders Accelerate would (lowest numbers first, counted
  before the save), never the one just written. A replaced or retired folder is deleted even when it
  is read-only; one that cannot be deleted is named in a warning. ``save`` and ``save_model`` write each
  file through a temporary file and ``os.replace``.
* **Verified.** The manifest records every file's sha256 and size (the strategy's own files, e.g.
  DeepSpeed engine folders, included); ``load_state`` checks them before reading anything and raises
  :class:`CheckpointError` naming the file that changed. Every file the manifest names (checksum keys
  and the strategy's files included) must lie inside the checkpoint folder: an absolute path, a ``..``
  component or a symbolic link leading out is refused before any file is opened. For very large checkpoints,
  ``load_state(..., verify_checksums=False)`` skips the check, and ``ACCEL_CHECKPOINT_CHECKSUMS=0``
  skips both writing and checking (cost on 1 GB: suites/benchmarks/checkpoint_checksum.py).
* **Nothing from a checkpoint is unpickled as code.** Tensors are safetensors files; everything else is
  written with ``torch.save`` and read back with ``torch.load(weights_only=True)`` (tensors, numbers,
  strings, lists, tuples, dicts only), and RNG states are JSON (Accelerate's pkl twin is read only when it
  is alone, weights-only, allowing just the numpy array types of numpy's RNG state). A file holding
  anything else is refused with :class:`CheckpointError` (so are missing, truncated and corrupt files,
  each named).

Layout of a ``save_state`` directory (``_{i}`` is appended for the i-th object when i > 0, as in
Accelerate)::

    model.safetensors            unwrapped state_dict of accelerator._models[0] (pytorch_model.bin when
                                 safe_serialization=False); model_1.safetensors for the second model ...
    optimizer.bin                optimizer.state_dict()
    scheduler.bin                scheduler.state_dict()
    sampler.bin                  data loader position: its epoch ("iteration") and, for a
                                 SeedableRandomSampler, epoch and seed
    scaler.pt                    GradScaler.state_dict() (fp16 only)
    custom_checkpoint_0.pkl      state_dict() of the objects passed to register_for_checkpointing
                                 (torch.save archive, loaded weights-only)
    random_states_{rank}.json    per process: python, numpy, torch CPU and device RNG states, the data
                                 loaders' generators, and accelerator.step (what accel reads)
    random_states_{rank}.pkl     the same states in Accelerate's format, for accelerate's load_state
                                 (accel reads it only when the JSON is absent, weights-only)
    accel_checkpoint.json        manifest, written last: format version, the files above, counts

What ``load_state`` restores by itself: model weights (strict), optimizer state (moved to the parameters'
device), scheduler, grad scaler, registered objects, every prepared data loader's epoch and
SeedableRandomSampler epoch/seed (so the next epoch shuffles exactly as it would have), this process's
RNG states and sampler generators, ``accelerator.step`` and, with automatic checkpoint naming,
``project_configuration.iteration`` (numbering continues after the newest checkpoint).
What the user does, as with Accelerate: resuming in the middle of an epoch means skipping the batches
already seen, ``accelerator.skip_first_batches(train_dataloader, n)`` for the current epoch only, with
``n`` taken from the user's own step counter (it is also in the manifest, ``step``, when the training
loop uses ``accelerator.accumulate``); the outer epoch/step loop counters are the script's own.
A bitwise-identical continuation mid-epoch needs ``DataLoaderConfiguration(use_seedable_sampler=True)``
(or a sampler with its own generator): a plain shuffling sampler draws the epoch's order from the global
RNG when the epoch starts, which happened before the checkpoint. Likewise ``iter(DataLoader)`` draws one
seed from the global torch RNG unless the DataLoader has a ``generator``, so with dropout (or anything else
using the global RNG) a mid-epoch resume is bitwise only when the DataLoader was given a generator.
At epoch boundaries the restored RNG and epoch reproduce the run either way.

Processes: the main process writes the shared files (every node's local main with
``save_on_each_node``, meant for node-local disks) and every process writes its own
``random_states_{rank}.json`` into the same directory, so without ``save_on_each_node`` the directory
must be on a file system all processes share. ``save_state`` and ``load_state`` are collective: call
them on every process.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import re
import secrets
import shutil
import warnings
from collections import OrderedDict
from pathlib import Path, PureWindowsPath
from typing import Any, Callable

import torch

from .strategies.base import Strategy
from .utils import heartbeat
from .utils.files import atomic_write, file_digest, fsync_dir, fsync_file, remove_tree

logger = logging.getLogger(__name__)

__all__ = [
    "CheckpointError",
    "load_state",
    "HookHandle",
    "parse_size",
    "register_hook",
    "save",
    "save_model",
    "save_state",
]

SAFE_MODEL_NAME = "model"
MODEL_NAME = "pytorch_model"
SAFE_WEIGHTS_NAME = "model.safetensors"
WEIGHTS_NAME = "pytorch_model.bin"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"
CUSTOM_NAME = "custom_checkpoint"
MANIFEST_NAME = "accel_checkpoint.json"
CHECKPOINTS_FOLDER = "checkpoints"
FORMAT = "accel-checkpoint"
FORMAT_VERSION = 1
#: hashlib algorithm of the per-file checksums in the manifest ("checksums": {relative path: {algorithm: hex, "size": n}})
CHECKSUM_ALGORITHM = "sha256"
#: set to 0/false/no/off to neither write nor verify checksums (very large checkpoints); see load_state(verify_checksums=)
CHECKSUM_ENV = "ACCEL_CHECKPOINT_CHECKSUMS"

_CHECKPOINT_DIR = re.compile(r"checkpoint_(\d+)")
_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old|del)-(?P<token>[0-9a-f]+-[0-9a-f]+)")
# files save_state owns: stale ones are not carried over when an existing directory is replaced
_STATE_FILE = re.compile(
    r"(model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin|(optimizer|scheduler|sampler)(_\d+)?\.bin"
    r"|scaler\.pt|random_states_\d+\.(json|pkl)|custom_checkpoint_\d+\.pkl|" + re.escape(MANIFEST_NAME) + r")"
)


class CheckpointError(ValueError, RuntimeError):
    """A checkpoint is missing, incomplete, corrupt, unsafe to load, or does not fit what was prepared.

    A ``ValueError`` and a ``RuntimeError`` both, so code written for the errors Accelerate raises in
    the same situations still catches it.
    """


# ---------------------------------------------------------------------------------------------- small helpers
def _ending(i: int) -> str:
    return f"_{i}" if i > 0 else ""


def _is_writer(accelerator: Any) -> bool:
    """The process that writes shared files: the main one, or each node's local main with save_on_each_node."""
    if accelerator.project_configuration.save_on_each_node:
        return accelerator.is_local_main_process
    return accelerator.is_main_process


def _torch_save(obj: Any, path: Path) -> None:
    with open(path, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    heartbeat.alive()  # a long save is work, not a hang (accel launch's watchdog)


def _safetensors_save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt", **(metadata or {})})
    fsync_file(path)
    heartbeat.alive()  # a long save is work, not a hang (accel launch's watchdog)


def _json_save(data: Any, path: Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    heartbeat.alive()  # a long save is work, not a hang (accel launch's watchdog)


def _tensors_for_safetensors(obj: Any, what: str) -> dict[str, torch.Tensor]:
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


def _check_plain(obj: Any, where: str) -> None:
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


def _b64(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().contiguous().numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text.encode("ascii"))), dtype=torch.uint8).clone()


# ---------------------------------------------------------------------------------------------- hooks
class HookHandle:
    """Returned by ``register_*_state_pre_hook``: ``remove()`` unregisters the hook (also usable as a context)."""

    _next_id = 0

    def __init__(self, hooks: dict[int, Callable[..., None]]):
        self._hooks = hooks
        self.id = HookHandle._next_id
        HookHandle._next_id += 1

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self) -> "HookHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def register_hook(hook_dict: dict[int, Callable[..., None]], hook: Callable[..., None]) -> HookHandle:
    """Add ``hook`` to ``hook_dict``; the returned handle's ``remove()`` takes it out again."""
    if not callable(hook):
        raise TypeError(f"a state hook must be callable, got {type(hook).__name__}")
    handle = HookHandle(hook_dict)
    hook_dict[handle.id] = hook
    return handle


# ---------------------------------------------------------------------------------------------- save
def save(accelerator: Any, obj: Any, f: Any, safe_serialization: bool = False) -> None:
    """``torch.save`` (or safetensors for a dict of tensors) on the process that writes, atomically."""
    if not _is_writer(accelerator):
        return
    if safe_serialization:
        tensors = _tensors_for_safetensors(obj, "the object to save")
        if isinstance(f, (str, os.PathLike)):
            atomic_write(Path(f), lambda tmp: _safetensors_save(tensors, tmp))
        else:
            from safetensors.torch import save as to_bytes

            f.write(to_bytes(tensors, metadata={"format": "pt"}))
        return
    if isinstance(f, (str, os.PathLike)):
        atomic_write(Path(f), lambda tmp: _torch_save(obj, tmp))
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


def save_model(accelerator: Any, model: torch.nn.Module, save_directory: str | os.PathLike,
               max_shard_size: int | str = "10GB", safe_serialization: bool = True) -> None:
    """The unwrapped model's weights in the Hugging Face layout (sharded with an index above max_shard_size)."""
    limit = parse_size(max_shard_size)
    directory = Path(os.path.expanduser(os.fspath(save_directory)))
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"save_model: {directory} is a file, not a directory")
    # under ZeRO-3/FSDP the full state dict is a gather every process joins, so it comes before the
    # writer check (a non-writer returning first would leave the writer waiting forever)
    state_dict = accelerator.get_state_dict(model)
    if not _is_writer(accelerator):
        return
    directory.mkdir(parents=True, exist_ok=True)
    if safe_serialization:
        tensors = _tensors_for_safetensors(state_dict, "the model's state_dict")
        prefix, ext, index_name = SAFE_MODEL_NAME, "safetensors", SAFE_WEIGHTS_INDEX_NAME
    else:
        tensors = {k: v.detach().cpu() for k, v in state_dict.items()}
        prefix, ext, index_name = MODEL_NAME, "bin", WEIGHTS_INDEX_NAME
    shards = _shard(tensors, limit)
    count = len(shards)
    names = [f"{prefix}.{ext}"] if count == 1 else [f"{prefix}-{i + 1:05d}-of-{count:05d}.{ext}" for i in range(count)]
    for name, shard in zip(names, shards):
        if safe_serialization:
            atomic_write(directory / name, lambda tmp, shard=shard: _safetensors_save(shard, tmp))
        else:
            atomic_write(directory / name, lambda tmp, shard=shard: _torch_save(shard, tmp))
    written = set(names)
    if count > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
            "weight_map": {key: name for name, shard in zip(names, shards) for key in shard},
        }
        atomic_write(directory / index_name, lambda tmp: _json_save(index, tmp))
        written.add(index_name)
    # remove what a previous save of this format left behind (other shard counts, single file vs index)
    stale = re.compile(re.escape(prefix) + r"(-\d{5}-of-\d{5})?\." + ext + r"(\.index\.json)?")
    for entry in directory.iterdir():
        if entry.name not in written and stale.fullmatch(entry.name) and entry.is_file():
            entry.unlink()
    logger.info("model weights saved in %s (%d file%s)", directory, count, "s" if count > 1 else "")


# ---------------------------------------------------------------------------------------------- save_state
def _shared_token(accelerator: Any) -> str:
    token = [f"{os.getpid():x}-{secrets.token_hex(4)}"]
    if accelerator.use_distributed:
        from .utils.operations import broadcast_object_list

        broadcast_object_list(token, from_process=0)
    return token[0]


def _clean_leftovers(parent: Path, names: Callable[[str], bool]) -> None:
    """Remove temp dirs of interrupted saves; put back a moved-aside checkpoint whose replacement never landed."""
    if not parent.is_dir():
        return
    for entry in sorted(parent.iterdir()):
        match = _LEFTOVER.fullmatch(entry.name)
        if match is None or not names(match.group("name")) or not entry.is_dir():
            continue
        original = parent / match.group("name")
        if match.group("kind") == "old" and not original.exists():
            logger.warning("restoring %s, moved aside by a save that did not finish", original)
            os.replace(entry, original)
            continue
        _remove_or_warn(entry, "left by an interrupted save")


def _remove_or_warn(path: Path, why: str) -> None:
    """Delete a hidden working folder; one that cannot be deleted is named in a warning, never left silently."""
    if not remove_tree(path):
        warnings.warn(f"could not delete {path} ({why}); remove it by hand to free its space", stacklevel=4)


def _carry_user_files(old: Path, new: Path) -> None:
    """Hard-link (or copy) files a user kept in an existing checkpoint directory into its replacement."""
    for entry in old.iterdir():
        target = new / entry.name
        if target.exists() or _STATE_FILE.fullmatch(entry.name):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, target, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, target)


def _link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _commit(tmp: Path, target: Path, token: str, carry: bool = True) -> None:
    """Rename the finished ``tmp`` onto ``target``; an existing ``target`` is moved aside, then deleted
    (read-only parts included). ``carry``: keep the user's own files of the replaced ``target``."""
    if not tmp.exists():
        if target.is_dir():
            return  # another node's local main already renamed it (shared file system)
        raise CheckpointError(f"the checkpoint being written at {tmp} disappeared before it could be renamed to {target}")
    aside = None
    if target.exists():
        if carry:
            _carry_user_files(target, tmp)
            fsync_dir(tmp)
        aside = target.parent / f".{target.name}.old-{token}"
        os.replace(target, aside)
    os.replace(tmp, target)
    fsync_dir(target.parent)
    if aside is not None:
        _remove_or_warn(aside, f"the previous {target.name}, replaced")


def _checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``checkpoint_N`` directories under ``root``, oldest first by N (hidden temp dirs never match)."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _CHECKPOINT_DIR.fullmatch(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def _rotation(root: Path, limit: int) -> list[Path]:
    """The checkpoints ``total_limit`` retires to make room for the next one, as Accelerate picks them:
    of the ``checkpoint_N`` folders present *before* the save, the lowest N first, so many that the new
    one makes ``limit``. The checkpoint being written is never among them (it does not exist yet, or it
    is the folder it replaces)."""
    existing = _checkpoints(root)
    return [path for _, path in existing[: max(0, len(existing) + 1 - limit)]]


def _rotate(doomed: list[Path], keep: Path, limit: int, token: str) -> None:
    for path in doomed:
        if path.name == keep.name or not path.is_dir():
            continue
        hidden = path.parent / f".{path.name}.del-{token}"
        os.replace(path, hidden)  # gone from view at once; a crash mid-delete leaves only a hidden dir
        _remove_or_warn(hidden, f"checkpoint {path.name} retired by total_limit={limit}")
        logger.info("total_limit=%d: deleted %s", limit, path)


def _dataloader_state(loader: Any) -> dict[str, Any]:
    state: dict[str, Any] = {"type": type(loader).__name__}
    iteration = getattr(loader, "iteration", None)
    if isinstance(iteration, int):
        state["iteration"] = iteration
    sampler = _sampler_of(loader)
    from .data_loader import SeedableRandomSampler

    if isinstance(sampler, SeedableRandomSampler):
        state["sampler"] = {"type": "SeedableRandomSampler", "epoch": int(sampler.epoch),
                            "initial_seed": int(sampler.initial_seed)}
    if getattr(loader, "use_stateful_dataloader", False):
        # torchdata's StatefulDataLoader knows its position inside the epoch: resume mid-epoch exactly
        state["stateful"] = loader.state_dict()
    return state


def _sampler_of(loader: Any) -> Any:
    from .data_loader import get_sampler

    try:
        return get_sampler(loader)
    except Exception:
        return None


def _generator_of(loader: Any) -> torch.Generator | None:
    sampler = _sampler_of(loader)
    generator = getattr(sampler, "generator", None)
    if not isinstance(generator, torch.Generator):
        generator = getattr(loader, "synchronized_generator", None)
    return generator if isinstance(generator, torch.Generator) else None


def _rng_snapshot(accelerator: Any) -> dict[str, Any]:
    """This process's RNG states, taken once so that accel's JSON file and Accelerate's pkl agree exactly."""
    snapshot: dict[str, Any] = {"step": int(accelerator.step), "python": random.getstate(),
                                "torch": torch.get_rng_state(), "numpy": None, "device": None, "generators": {}}
    try:
        import numpy as np

        snapshot["numpy"] = np.random.get_state()
    except ImportError:
        pass
    backend = accelerator.backend
    if backend.device_type != "cpu":
        # the process's own device for accel; every visible device for Accelerate (its get_rng_state_all)
        snapshot["device"] = {"index": accelerator.device.index,
                              "current": backend.get_rng_state(accelerator.device.index),
                              "all": [backend.get_rng_state(i) for i in range(backend.device_count())]}
    for i, loader in enumerate(accelerator._dataloaders):
        generator = _generator_of(loader)
        if generator is not None:
            snapshot["generators"][str(i)] = generator.get_state()
    return snapshot


def _rng_json(accelerator: Any, snapshot: dict[str, Any]) -> dict[str, Any]:
    """accel's own RNG file (``random_states_N.json``): plain JSON, read back without any unpickling."""
    version, internal, gauss = snapshot["python"]
    state: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "process_index": accelerator.process_index,
        "step": snapshot["step"],
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "torch": _b64(snapshot["torch"]),
    }
    if snapshot["numpy"] is not None:
        name, keys, pos, has_gauss, cached = snapshot["numpy"]
        state["numpy"] = {"name": name, "keys": [int(k) for k in keys], "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    device = snapshot["device"]
    if device is not None:
        state["device"] = {"backend": accelerator.backend.name, "index": device["index"],
                           "state": _b64(device["current"])}
    state["generators"] = {key: _b64(value) for key, value in snapshot["generators"].items()}
    return state


def _rng_accelerate(accelerator: Any, snapshot: dict[str, Any]) -> dict[str, Any]:
    """Accelerate's RNG file (``random_states_N.pkl``), so that ``accelerate.Accelerator.load_state`` resumes
    the same draws: its keys, and only types its weights-only loader accepts (tensors, python's state tuple,
    numpy's state tuple with its uint32 array). accel itself reads the JSON twin."""
    state: dict[str, Any] = {"step": snapshot["step"], "random_state": snapshot["python"],
                             "torch_manual_seed": snapshot["torch"]}
    if snapshot["numpy"] is not None:
        state["numpy_random_seed"] = snapshot["numpy"]
    if snapshot["device"] is not None:
        state[_accelerate_device_key(accelerator.backend)] = snapshot["device"]["all"]
    return state


def _accelerate_device_key(backend: Any) -> str:
    """The key under which Accelerate keeps every device's RNG state of this backend's device type."""
    return f"torch_{backend.device_type}_manual_seed"


def _unwrapped_state_dict(accelerator: Any, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return accelerator.get_state_dict(model)


def save_state(accelerator: Any, output_dir: str | os.PathLike | None = None, safe_serialization: bool = True,
               **save_model_func_kwargs: Any) -> str:
    """Save models, optimizers, schedulers, data loader positions, scaler, registered objects and RNG states."""
    cfg = accelerator.project_configuration
    automatic = cfg.automatic_checkpoint_naming
    strategy = accelerator.strategy
    doomed: list[Path] = []  # checkpoints total_limit retires once this one is in place
    if save_model_func_kwargs and type(strategy).save_checkpoint is Strategy.save_checkpoint:
        warnings.warn(
            f"save_state: {sorted(save_model_func_kwargs)} are used by DeepSpeed's save_checkpoint only and are "
            f"ignored by the {strategy.name!r} strategy", stacklevel=3,
        )
        save_model_func_kwargs = {}
    if automatic:
        if cfg.project_dir is None:
            raise ValueError("automatic_checkpoint_naming needs a project_dir (Accelerator(project_dir=...) or ProjectConfiguration)")
        if output_dir is not None:
            warnings.warn(
                f"save_state({output_dir!r}) ignores output_dir: automatic_checkpoint_naming saves to "
                f"{cfg.project_dir}/{CHECKPOINTS_FOLDER}/checkpoint_<iteration>", stacklevel=3,
            )
        target = Path(os.path.expanduser(cfg.project_dir)) / CHECKPOINTS_FOLDER / f"checkpoint_{cfg.iteration}"
        if cfg.total_limit is not None:
            doomed = _rotation(target.parent, cfg.total_limit)
        if target.exists() and target.name not in {p.name for p in doomed}:
            raise ValueError(
                f"checkpoint directory {target} already exists (iteration {cfg.iteration}); set "
                "accelerator.project_configuration.iteration to the number to continue from"
            )
        in_scope: Callable[[str], bool] = lambda name: _CHECKPOINT_DIR.fullmatch(name) is not None  # noqa: E731
    else:
        if output_dir is None:
            raise ValueError(
                "save_state needs an output_dir, or ProjectConfiguration(project_dir=..., "
                "automatic_checkpoint_naming=True) to name checkpoints itself"
            )
        target = Path(os.path.expanduser(os.fspath(output_dir)))
        if target.is_symlink():
            target = Path(os.path.realpath(target))
        if target.exists() and not target.is_dir():
            raise ValueError(f"save_state: {target} exists and is not a directory")
        in_scope = lambda name: name == target.name  # noqa: E731
    returned = str(target)
    target = Path(os.path.abspath(target))
    parent = target.parent
    writer = _is_writer(accelerator)

    if writer:
        parent.mkdir(parents=True, exist_ok=True)
        _clean_leftovers(parent, in_scope)
    accelerator.wait_for_everyone()  # nobody creates the new temp dir while a writer is still cleaning up
    token = _shared_token(accelerator)
    tmp = parent / f".{target.name}.tmp-{token}"
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        # what the strategy stores itself (DeepSpeed engine files, FSDP shards), on every process
        part = strategy.save_checkpoint(tmp, **save_model_func_kwargs)
        owns = set(part.owns) if part is not None else set()
        weights = [] if "models" in owns else [_unwrapped_state_dict(accelerator, model) for model in accelerator._models]
        # hooks get the directory being written, so whatever they save is part of the atomic checkpoint;
        # a hook that saves a model itself pops its entry from `weights` (Accelerate's protocol)
        for hook in list(accelerator._save_model_state_pre_hook.values()):
            hook(accelerator._models, weights, str(tmp))
        manifest = _write_state_files(accelerator, tmp, weights, safe_serialization, writer, owns)
        if part is not None:
            manifest["strategy"] = part.to_manifest()
        snapshot = _rng_snapshot(accelerator)
        _json_save(_rng_json(accelerator, snapshot), tmp / f"{RNG_STATE_NAME}_{accelerator.process_index}.json")
        _torch_save(_rng_accelerate(accelerator, snapshot), tmp / f"{RNG_STATE_NAME}_{accelerator.process_index}.pkl")
        accelerator.wait_for_everyone()  # every rank's files are in before the manifest marks it complete
        if writer:
            if _checksums_enabled():
                manifest["checksums"] = _checksums(tmp)
            _json_save(manifest, tmp / MANIFEST_NAME)
            fsync_dir(tmp)
            # a folder total_limit retires anyway is replaced outright, as Accelerate deletes it first
            _commit(tmp, target, token, carry=target.name not in {p.name for p in doomed})
    except BaseException:
        if writer:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    accelerator.wait_for_everyone()
    if automatic and cfg.total_limit is not None and accelerator.is_main_process:
        _rotate(doomed, target, cfg.total_limit, token)
    accelerator.wait_for_everyone()
    cfg.iteration += 1
    logger.info("state saved in %s", target)
    return returned


# ---------------------------------------------------------------------------------------------- checksums
def _checksums_enabled() -> bool:
    return os.environ.get(CHECKSUM_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _checksums(folder: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {CHECKSUM_ALGORITHM: hex digest, "size": bytes}}`` for every file under ``folder``
    (the strategy's own files, e.g. DeepSpeed engine folders, included); files hashed on a few threads."""
    from concurrent.futures import ThreadPoolExecutor

    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and p.name != MANIFEST_NAME)
    workers = max(1, min(4, len(files), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(lambda p: (file_digest(p, CHECKSUM_ALGORITHM), heartbeat.alive())[0], files))
    return {p.relative_to(folder).as_posix(): {CHECKSUM_ALGORITHM: d, "size": p.stat().st_size}
            for p, d in zip(files, digests)}


def _verify_checksums(folder: Path, checksums: Any) -> str | None:
    """None when every file listed in the manifest has its recorded size and digest; else the problem, naming the file."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    if not isinstance(checksums, dict):
        return f"{folder / MANIFEST_NAME}: 'checksums' is not a mapping"
    jobs = []
    for name, entry in sorted(checksums.items()):
        path = folder / name
        if not isinstance(entry, dict):
            return f"{folder / MANIFEST_NAME}: the checksum entry of {name} is malformed"
        algorithm = next((a for a in entry if a != "size"), None)
        if algorithm not in hashlib.algorithms_available:
            return f"{path}: checksum algorithm {algorithm!r} is not available in this Python's hashlib"
        if not path.is_file():
            return f"{path} is missing (it is listed in {MANIFEST_NAME})"
        size = path.stat().st_size
        if "size" in entry and size != entry["size"]:
            return f"{path} has {size} bytes but {entry['size']} were saved (truncated or replaced)"
        jobs.append((path, algorithm, entry[algorithm]))
    workers = max(1, min(4, len(jobs), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        found = list(pool.map(lambda job: (file_digest(job[0], job[1]), heartbeat.alive())[0], jobs))
    for (path, algorithm, expected), actual in zip(jobs, found):
        if actual != expected:
            return (f"{path} does not match its {algorithm} checksum in {MANIFEST_NAME} (saved {expected[:16]}..., "
                    f"found {actual[:16]}...): the file changed or is corrupt since it was saved")
    return None


def _check_integrity(accelerator: Any, folder: Path, manifest: dict[str, Any], verify: bool) -> None:
    """Verify the manifest's checksums on each node's local main process; a mismatch is raised on every process."""
    checksums = manifest.get("checksums")
    if not verify or checksums is None:
        return
    problem = _verify_checksums(folder, checksums) if accelerator.is_local_main_process else None
    if accelerator.use_distributed:
        from .utils.operations import gather_object

        problem = next((p for p in gather_object([problem]) if p), None)
    if problem:
        raise CheckpointError(
            f"checkpoint {folder} failed verification: {problem}. To load it anyway, pass "
            f"load_state(..., verify_checksums=False) or set {CHECKSUM_ENV}=0"
        )


def _accel_version() -> str:
    from . import __version__

    return __version__


def _write_state_files(accelerator: Any, out: Path, weights: list[dict[str, torch.Tensor]],
                       safe_serialization: bool, writer: bool, owned: set[str] = frozenset()) -> dict[str, Any]:
    """Write the shared files (on the writer only) and return the manifest describing them."""
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "accel_version": _accel_version(),
        "torch_version": torch.__version__,
        "num_processes": accelerator.num_processes,
        "iteration": accelerator.project_configuration.iteration,
        "step": int(accelerator.step),
        "safe_serialization": bool(safe_serialization),
        "models": [],
        "optimizers": [],
        "schedulers": [],
        "dataloaders": [],
        "custom_objects": [],
        "scaler": None,
        "random_states": [f"{RNG_STATE_NAME}_{r}.json" for r in range(accelerator.num_processes)],
        # the same states in Accelerate's format, for accelerate.Accelerator.load_state (accel reads the JSON)
        "accelerate_random_states": [f"{RNG_STATE_NAME}_{r}.pkl" for r in range(accelerator.num_processes)],
    }
    for i, state_dict in enumerate(weights):
        if safe_serialization:
            name = f"{SAFE_MODEL_NAME}{_ending(i)}.safetensors"
            if writer:
                _safetensors_save(_tensors_for_safetensors(state_dict, f"model {i}'s state_dict"), out / name)
        else:
            name = f"{MODEL_NAME}{_ending(i)}.bin"
            if writer:
                _check_plain(state_dict, f"model {i}'s state_dict")
                _torch_save({k: v.detach().cpu() for k, v in state_dict.items()}, out / name)
        manifest["models"].append(name)

    def plain(kind: str, name: str, obj: Any, label: str) -> None:
        if writer:
            state = obj.state_dict()
            _check_plain(state, label)
            _torch_save(state, out / name)
        manifest[kind].append(name)

    for i, optimizer in enumerate([] if "optimizers" in owned else accelerator._optimizers):
        plain("optimizers", f"{OPTIMIZER_NAME}{_ending(i)}.bin", optimizer, f"optimizer {i}'s state_dict")
    for i, scheduler in enumerate(accelerator._schedulers):
        plain("schedulers", f"{SCHEDULER_NAME}{_ending(i)}.bin", scheduler, f"scheduler {i}'s state_dict")
    for i, loader in enumerate(accelerator._dataloaders):
        name = f"{SAMPLER_NAME}{_ending(i)}.bin"
        if writer:
            _torch_save(_dataloader_state(loader), out / name)
        manifest["dataloaders"].append(name)
    if accelerator.scaler is not None:
        plain_name = SCALER_NAME
        if writer:
            state = accelerator.scaler.state_dict()
            _check_plain(state, "the grad scaler's state_dict")
            _torch_save(state, out / plain_name)
        manifest["scaler"] = plain_name
    for i, obj in enumerate(accelerator._custom_objects):
        plain("custom_objects", f"{CUSTOM_NAME}_{i}.pkl", obj,
              f"registered object {i} ({type(obj).__name__})'s state_dict")
    return manifest


# ---------------------------------------------------------------------------------------------- manifest entries
#: the manifest fields that name files or folders of the checkpoint (each a list of names, or one name, or None)
_ENTRY_FIELDS = ("models", "optimizers", "schedulers", "dataloaders", "custom_objects", "scaler", "random_states",
                 "accelerate_random_states")
_MAX_LINK_HOPS = 40


def _stays_inside(root: str, name: str) -> bool:
    """Whether ``name`` (relative, POSIX) resolves to something strictly inside the real folder ``root``.

    Resolved one component at a time, following symbolic links by reading them, and stopping as soon as
    a step would leave ``root``: nothing outside the folder is ever looked at, so the answer cannot
    depend on (or reveal) what exists there.
    """
    pending = name.split("/")
    current = root
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if current == root:
                return False
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        if not os.path.islink(candidate):
            current = candidate
            continue
        hops += 1
        if hops > _MAX_LINK_HOPS:
            return False  # a loop of links
        target = os.readlink(candidate)
        if os.path.isabs(target):
            target = os.path.normpath(target)
            if target != root and not target.startswith(root.rstrip(os.sep) + os.sep):
                return False
            pending = os.path.relpath(target, root).split(os.sep) + pending
            current = root
        else:
            pending = target.split("/") + pending
    return current != root


def _entry_path(folder: Path, name: Any, what: str) -> Path:
    """``folder / name`` for an entry of the manifest, after refusing one that could leave ``folder``.

    Refused: a name that is not a non-empty string, an absolute path (POSIX or Windows style), a ``..``
    component, a NUL byte, the folder itself, and a path that a symbolic link inside the folder leads out
    of. The error names the entry and says nothing about the place it points to.
    """
    where = f"checkpoint {folder} was refused: {what} entry {name!r}"
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{where} is not a file name (a non-empty string)")
    if "\x00" in name:
        raise CheckpointError(f"{where} contains a NUL byte")
    if "\\" in name or name.startswith("/") or PureWindowsPath(name).anchor or os.path.isabs(name):
        raise CheckpointError(f"{where} is an absolute path or uses backslashes; entries are paths relative to the "
                              "checkpoint folder, with '/' between components")
    parts = name.split("/")
    if ".." in parts:
        raise CheckpointError(f"{where} goes up a folder with '..'; a checkpoint's files lie inside its folder")
    if not any(p not in ("", ".") for p in parts):
        raise CheckpointError(f"{where} names the checkpoint folder itself, not a file in it")
    if not _stays_inside(os.path.realpath(folder), name):
        raise CheckpointError(f"{where} leads out of the checkpoint folder through a symbolic link; a checkpoint's "
                              "files lie inside its folder")
    return folder / name


def _check_entries(folder: Path, manifest: dict[str, Any]) -> None:
    """Refuse a manifest any of whose entries (files, checksum keys, the strategy's files) leaves ``folder``.

    Runs before any file the manifest names is opened.
    """
    for key in _ENTRY_FIELDS:
        value = manifest.get(key)
        if value is None:
            continue
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list):
            raise CheckpointError(f"checkpoint {folder} was refused: the manifest's {key!r} is a "
                                  f"{type(value).__name__}, not a list of file names")
        for name in names:
            _entry_path(folder, name, f"the manifest's {key!r}")
    checksums = manifest.get("checksums")
    if isinstance(checksums, dict):
        for name in checksums:
            _entry_path(folder, name, "the manifest's 'checksums'")
    elif checksums is not None:
        raise CheckpointError(f"checkpoint {folder} was refused: the manifest's 'checksums' is a "
                              f"{type(checksums).__name__}, not a mapping")
    strategy = manifest.get("strategy")
    if strategy is not None:
        if not isinstance(strategy, dict) or not isinstance(strategy.get("files", []), list):
            raise CheckpointError(f"checkpoint {folder} was refused: the manifest's 'strategy' is malformed")
        for name in strategy.get("files", []):
            _entry_path(folder, name, "the manifest's 'strategy' files")


# ---------------------------------------------------------------------------------------------- load
def _torch_load(path: Path, expected: str, load_kwargs: dict[str, Any] | None = None) -> Any:
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


def _load_safetensors(path: Path, expected: str) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: expected {expected}")
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"{path} is corrupt or truncated: {exc}; expected {expected}") from None


def _load_json(path: Path, expected: str) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: expected {expected}")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is corrupt or truncated (not valid JSON: {exc}); expected {expected}") from None


def _legacy_rng_load(path: Path, backend: Any, index: int | None) -> dict[str, Any]:
    """Accelerate's ``random_states_N.pkl``, read weights-only with an allowlist of exactly the numpy types its
    state tuple holds (the array, its dtype, numpy's array rebuild function); nothing else is unpickled.

    Returns the decoded form ``_restore_rng`` applies; a value of the wrong shape is named as corrupt.
    """
    import numpy as np

    allowed: list[Any] = [np.ndarray, np.dtype]
    core = getattr(np, "_core", None) or getattr(np, "core")
    allowed.append(core.multiarray._reconstruct)
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        allowed.append(dtypes.UInt32DType)
    safe_globals = getattr(torch.serialization, "safe_globals", None)
    if safe_globals is None:
        raise CheckpointError(f"{path}: reading Accelerate's pickled RNG states needs torch >= 2.5")
    with safe_globals(allowed):
        raw = _torch_load(path, "Accelerate's RNG states (torch.save of plain data and numpy arrays)")
    try:
        if not isinstance(raw, dict) or not isinstance(raw.get("torch_manual_seed"), torch.Tensor):
            raise ValueError("expected a dict with a 'torch_manual_seed' tensor")
        state: dict[str, Any] = {"step": int(raw.get("step", 0)), "torch_tensor": raw["torch_manual_seed"],
                                 "generators": {}}
        if "random_state" in raw:
            version, internal, gauss = raw["random_state"]
            state["python_state"] = (int(version), tuple(int(x) for x in internal), gauss)
        if "numpy_random_seed" in raw:
            name, keys, pos, has_gauss, cached = raw["numpy_random_seed"]
            state["numpy"] = {"name": str(name), "keys": [int(k) for k in keys], "pos": int(pos),
                              "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
        devices = raw.get(_accelerate_device_key(backend))
        if devices is not None:
            chosen = devices[index or 0]
            if not isinstance(chosen, torch.Tensor):
                raise ValueError(f"{_accelerate_device_key(backend)} holds a {type(chosen).__name__}, not tensors")
            state["device"] = {"backend": backend.name, "tensor": chosen}
    except (TypeError, ValueError, IndexError) as exc:
        raise CheckpointError(f"{path} is corrupt: not Accelerate's RNG states ({exc})") from None
    return state


def _resolve_input_dir(accelerator: Any, input_dir: str | os.PathLike | None) -> Path:
    cfg = accelerator.project_configuration
    if input_dir is not None:
        path = Path(os.path.expanduser(os.fspath(input_dir)))
        if path.is_dir():
            return path
        # a save replacing this directory may have died between moving it aside and renaming the new one in
        aside = sorted(p for p in path.parent.glob(f".{path.name}.old-*") if p.is_dir() and (p / MANIFEST_NAME).is_file()) \
            if path.parent.is_dir() else []
        if aside:
            warnings.warn(f"{path} is missing; loading {aside[-1]}, the copy an interrupted save moved aside", stacklevel=4)
            return aside[-1]
        raise CheckpointError(f"load_state: checkpoint directory {path} does not exist")
    if not cfg.automatic_checkpoint_naming:
        raise ValueError("load_state needs an input_dir unless ProjectConfiguration(automatic_checkpoint_naming=True)")
    if cfg.project_dir is None:
        raise ValueError("automatic_checkpoint_naming needs a project_dir to find checkpoints in")
    root = Path(os.path.expanduser(cfg.project_dir)) / CHECKPOINTS_FOLDER
    found = _checkpoints(root)
    complete = [(n, p) for n, p in found if (p / MANIFEST_NAME).is_file()]
    if not found:
        raise CheckpointError(f"load_state: no checkpoint_<N> directory in {root}")
    return (complete or found)[-1][1]


def _pick_input_dir(accelerator: Any, input_dir: str | os.PathLike | None) -> Path:
    """The main process decides (so every rank loads the same checkpoint); errors are raised everywhere."""
    if not accelerator.use_distributed:
        return _resolve_input_dir(accelerator, input_dir)
    from .utils.operations import broadcast_object_list

    choice: list[Any] = [None]
    if accelerator.is_main_process:
        try:
            choice[0] = ("ok", str(_resolve_input_dir(accelerator, input_dir)))
        except Exception as exc:  # noqa: BLE001
            choice[0] = ("error", f"{type(exc).__name__}: {exc}")
    broadcast_object_list(choice, from_process=0)
    status, value = choice[0]
    if status == "error":
        raise CheckpointError(f"load_state (decided on the main process): {value}")
    return Path(value)


def _legacy_manifest(accelerator: Any, folder: Path, models: list[Any]) -> dict[str, Any]:
    """What an Accelerate-written checkpoint (no manifest) should hold, from what was prepared."""
    names = []
    for i in range(len(models)):
        safe = f"{SAFE_MODEL_NAME}{_ending(i)}.safetensors"
        names.append(safe if (folder / safe).exists() else f"{MODEL_NAME}{_ending(i)}.bin")
    customs = sorted(p.name for p in folder.iterdir() if re.fullmatch(rf"{CUSTOM_NAME}_\d+\.pkl", p.name))
    return {
        "format": "accelerate",
        "models": names,
        "optimizers": [f"{OPTIMIZER_NAME}{_ending(i)}.bin" for i in range(len(accelerator._optimizers))],
        "schedulers": [f"{SCHEDULER_NAME}{_ending(i)}.bin" for i in range(len(accelerator._schedulers))],
        "dataloaders": None,  # Accelerate pickles whole sampler objects: not loadable safely, skipped
        "custom_objects": customs,
        "scaler": SCALER_NAME if (folder / SCALER_NAME).exists() else None,
        "num_processes": None,
    }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else ('es' if word.endswith('s') else 's')}"


def load_state(accelerator: Any, input_dir: str | os.PathLike | None = None, load_kwargs: dict | None = None,
               **load_model_func_kwargs: Any) -> None:
    """Restore what ``save_state`` saved, in place; see the module docstring for what is and is not restored."""
    verify = load_model_func_kwargs.pop("verify_checksums", None)
    verify = _checksums_enabled() if verify is None else bool(verify)
    folder = _pick_input_dir(accelerator, input_dir)
    logger.info("loading state from %s", folder)
    manifest_path = _entry_path(folder, MANIFEST_NAME, "the manifest")  # a link to a file outside is refused
    models = list(accelerator._models)
    for hook in list(accelerator._load_model_state_pre_hook.values()):
        hook(models, str(folder))  # a hook that loads a model itself removes it from `models`

    if manifest_path.exists():
        manifest = _load_json(manifest_path, "the checkpoint manifest written by save_state")
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CheckpointError(f"{manifest_path} is not an accel checkpoint manifest")
        if manifest.get("version", 0) > FORMAT_VERSION:
            raise CheckpointError(
                f"{manifest_path} has checkpoint format version {manifest['version']}; this accel reads up to "
                f"{FORMAT_VERSION} (upgrade accel)"
            )
    else:
        if (folder / f"{RNG_STATE_NAME}_{accelerator.process_index}.json").exists():
            raise CheckpointError(
                f"{manifest_path} is missing: {folder} is an incomplete accel checkpoint (the manifest is written last)"
            )
        warnings.warn(f"{folder} has no {MANIFEST_NAME}: reading it as a checkpoint written by Accelerate", stacklevel=3)
        manifest = _legacy_manifest(accelerator, folder, models)
    _check_entries(folder, manifest)  # before any file the manifest names is opened
    _check_integrity(accelerator, folder, manifest, verify)

    # --- the strategy's own part: the same strategy must load it
    saved_strategy = manifest.get("strategy")
    strategy = accelerator.strategy
    probe = type(strategy).save_checkpoint is not Strategy.save_checkpoint
    if saved_strategy is not None and saved_strategy.get("name") != strategy.name:
        raise CheckpointError(
            f"checkpoint {folder} was saved by the {saved_strategy.get('name')!r} strategy and holds its own files; "
            f"this run uses {strategy.name!r}: load it with the same strategy"
        )
    if saved_strategy is None and probe and manifest_path.exists():
        raise CheckpointError(
            f"checkpoint {folder} has no {strategy.name!r} files: it was saved without {strategy.name}; load it with "
            "the strategy that saved it"
        )
    owned = set(saved_strategy.get("owns", [])) if saved_strategy else set()
    optimizers = [] if "optimizers" in owned else list(accelerator._optimizers)
    if "models" in owned:
        models = []

    # --- check that the checkpoint fits what was prepared, before anything is changed
    for key, prepared, word in (
        ("models", models, "model"),
        ("optimizers", optimizers, "optimizer"),
        ("schedulers", accelerator._schedulers, "scheduler"),
        ("dataloaders", accelerator._dataloaders, "data loader"),
        ("custom_objects", accelerator._custom_objects, "registered object"),
    ):
        saved = manifest.get(key)
        if saved is None:
            continue
        if len(saved) != len(prepared):
            note = " (after load_state pre-hooks)" if key == "models" and accelerator._load_model_state_pre_hook else ""
            raise CheckpointError(
                f"checkpoint {folder} holds {_plural(len(saved), word)} but {_plural(len(prepared), word)} "
                f"{'was' if len(prepared) == 1 else 'were'} prepared{note}; load it into the same set of "
                "objects, in the same order, as when it was saved"
            )
    if accelerator.scaler is not None and manifest.get("scaler") is None:
        raise CheckpointError(
            f"{folder / SCALER_NAME} is missing: this run uses an fp16 grad scaler but the checkpoint was saved without one"
        )
    saved_processes = manifest.get("num_processes")

    map_location = load_model_func_kwargs.pop("map_location", None)
    if map_location not in (None, "cpu", "on_device"):
        raise TypeError("map_location must be None, 'cpu' or 'on_device'")
    strict = load_model_func_kwargs.pop("strict", True)

    # --- read everything (any bad file fails here, with nothing changed yet)
    model_states = []
    for i, name in enumerate(manifest["models"]):
        what = f"the weights of model {i}"
        if name.endswith(".safetensors"):
            model_states.append(_load_safetensors(folder / name, f"{what} (safetensors)"))
        else:
            model_states.append(_torch_load(folder / name, f"{what} (a torch state_dict)", load_kwargs))
    optimizer_states = [_torch_load(folder / n, f"the state_dict of optimizer {i}", load_kwargs)
                        for i, n in enumerate(manifest["optimizers"])]
    scheduler_states = [_torch_load(folder / n, f"the state_dict of scheduler {i}", load_kwargs)
                        for i, n in enumerate(manifest["schedulers"])]
    loader_states = [_torch_load(folder / n, f"the position of data loader {i}", load_kwargs)
                     for i, n in enumerate(manifest["dataloaders"] or [])]
    custom_states = [_torch_load(folder / n, f"the state_dict of registered object {i}", load_kwargs)
                     for i, n in enumerate(manifest["custom_objects"])]
    scaler_state = None
    if accelerator.scaler is not None:
        scaler_state = _torch_load(folder / manifest["scaler"], "the grad scaler's state_dict", load_kwargs)
    elif manifest.get("scaler") is not None:
        logger.warning("%s: the checkpoint has a grad scaler state but this run has no scaler; ignored", folder)
    # a strategy whose shards reshard (FSDP's DCP) may resume at another world size; the per-process RNG
    # files belong to the old layout then, and every rank decides this alike from the manifest
    resharding = (saved_processes is not None and saved_processes != accelerator.num_processes
                  and bool(saved_strategy and saved_strategy.get("reshardable")))
    rng = None if resharding else _read_rng(accelerator, folder, saved_processes)
    if resharding and accelerator.is_main_process:
        warnings.warn(
            f"{folder} was saved by {_plural(saved_processes, 'process')} and is resumed by "
            f"{_plural(accelerator.num_processes, 'process')}: the {saved_strategy.get('name')} shards are resharded, "
            "but per-process RNG states are not restored", stacklevel=3,
        )

    # --- apply
    if saved_strategy is not None:
        strategy.load_checkpoint(folder, saved_strategy, **load_model_func_kwargs)
    for i, (model, state) in enumerate(zip(models, model_states)):
        target = accelerator.unwrap_model(model)
        try:
            target.load_state_dict(state, strict=strict, **load_model_func_kwargs)
        except RuntimeError as exc:
            raise CheckpointError(f"{folder / manifest['models'][i]} does not fit model {i}: {exc}") from None
    if scaler_state is not None:
        accelerator.scaler.load_state_dict(scaler_state)
    for i, (optimizer, state) in enumerate(zip(optimizers, optimizer_states)):
        try:
            optimizer.load_state_dict(state)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"{folder / manifest['optimizers'][i]} does not fit optimizer {i}: {exc}") from None
    for scheduler, state in zip(accelerator._schedulers, scheduler_states):
        scheduler.load_state_dict(state)
    for loader, state in zip(accelerator._dataloaders, loader_states):
        _restore_dataloader(loader, state)
    for obj, state in zip(accelerator._custom_objects, custom_states):
        obj.load_state_dict(state)
    if rng is not None:
        _restore_rng(accelerator, rng, folder)

    cfg = accelerator.project_configuration
    if cfg.automatic_checkpoint_naming and cfg.project_dir is not None:
        existing = _checkpoints(Path(os.path.expanduser(cfg.project_dir)) / CHECKPOINTS_FOLDER)
        if existing:
            cfg.iteration = existing[-1][0] + 1
    logger.info("state loaded from %s", folder)


def _read_rng(accelerator: Any, folder: Path, saved_processes: int | None) -> dict[str, Any]:
    """This process's RNG states: accel's JSON file, or (a checkpoint written by Accelerate) its pkl."""
    rank = accelerator.process_index
    path = _entry_path(folder, f"{RNG_STATE_NAME}_{rank}.json", "the RNG state file")
    legacy = _entry_path(folder, f"{RNG_STATE_NAME}_{rank}.pkl", "the RNG state file")
    if not path.exists() and legacy.exists():
        return _legacy_rng_load(legacy, accelerator.backend, accelerator.device.index)
    if not path.exists() and saved_processes is not None and rank >= saved_processes:
        raise CheckpointError(
            f"{path} is missing: the checkpoint was saved by {_plural(saved_processes, 'process')} and this is "
            f"process {rank}; resume with the same number of processes"
        )
    state = _load_json(path, f"the RNG states of process {rank} (JSON)")
    if not isinstance(state, dict) or "torch" not in state or "python" not in state:
        raise CheckpointError(f"{path} is corrupt: expected the RNG states of process {rank} (keys 'python', 'torch')")
    try:
        state["torch_tensor"] = _unb64(state["torch"])
        if "device" in state:
            state["device"]["tensor"] = _unb64(state["device"]["state"])
        state["generators"] = {int(k): _unb64(v) for k, v in state.get("generators", {}).items()}
        python = state["python"]
        state["python_state"] = (python["version"], tuple(int(x) for x in python["state"]), python["gauss_next"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} is corrupt: {type(exc).__name__}: {exc}") from None
    return state


def _restore_rng(accelerator: Any, state: dict[str, Any], folder: Path) -> None:
    if "python_state" in state:
        random.setstate(state["python_state"])
    elif "python" in state:
        p = state["python"]
        random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    if state.get("numpy") is not None:
        import numpy as np

        n = state["numpy"]
        np.random.set_state((n["name"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    if state.get("torch_tensor") is not None:
        torch.set_rng_state(state["torch_tensor"])
    device = state.get("device")
    backend = accelerator.backend
    if device is not None:
        if device.get("backend") == backend.name and backend.device_type != "cpu":
            backend.set_rng_state(device["tensor"], accelerator.device.index)
        else:
            logger.warning("%s: device RNG state of backend %r not restored on backend %r",
                           folder, device.get("backend"), backend.name)
    for i, loader in enumerate(accelerator._dataloaders):
        saved = state.get("generators", {}).get(i)
        generator = _generator_of(loader)
        if saved is not None and generator is not None:
            generator.set_state(saved)
    if "step" in state:
        accelerator.step = int(state["step"])


def _restore_dataloader(loader: Any, state: Any) -> None:
    if not isinstance(state, dict):
        raise CheckpointError(f"a data loader state must be a dict, got {type(state).__name__}")
    if "iteration" in state and hasattr(loader, "iteration"):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(int(state["iteration"]))
        else:
            loader.iteration = int(state["iteration"])
    if "stateful" in state:
        if not getattr(loader, "use_stateful_dataloader", False):
            raise CheckpointError("the checkpoint holds a stateful data loader position but this loader is not stateful "
                                  "(DataLoaderConfiguration(use_stateful_dataloader=True))")
        loader.load_state_dict(state["stateful"])
    sampler_state = state.get("sampler")
    if sampler_state:
        sampler = _sampler_of(loader)
        if hasattr(sampler, "initial_seed") and "initial_seed" in sampler_state:
            sampler.initial_seed = int(sampler_state["initial_seed"])
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(int(sampler_state["epoch"]))
        elif sampler is not None:
            logger.warning("the checkpoint has a %s state but data loader uses %s; not restored",
                           sampler_state.get("type"), type(sampler).__name__)
