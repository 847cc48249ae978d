"""FSDP checkpoints through ``torch.distributed.checkpoint.state_dict``, in Accelerate's file layout.

``FULL_STATE_DICT`` files on rank 0 or DCP shards (``SHARDED_STATE_DICT``) that another world size can
load; named as Accelerate names them (``pytorch_model_fsdp_<i>``, ``optimizer_<i>``), so
``merge_fsdp_weights`` reads them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from ...facts.checkpoint import FSDP_MODEL_NAME, OPTIMIZER_NAME
from .peft import get_adapter_state_dict, set_adapter_state_dict
from .sharding import _is_fsdp1

logger = logging.getLogger(__name__)


def _options(full: bool, model: Any = None, **kwargs: Any) -> Any:
    """State dict options: full or sharded, copied to host memory.

    FSDP1 frees the gathered storage it would copy from, so when its parameters already live in host
    memory the "copy to host" is skipped there (it would return tensors over freed storage); the
    tensors are cloned instead. FSDP1's sharded state dicts of a model on a device are copied to host
    memory by :func:`_to_host`, not by torch (see :func:`_host_copy_is_accels`).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    offload = not (model is not None and _is_fsdp1(model) and (_on_host(model) or not full))
    return StateDictOptions(full_state_dict=full, cpu_offload=offload, **kwargs)


def _host_copy_is_accels(full: bool, model: Any) -> bool:
    """True for FSDP1's sharded state dicts of a model on a device: torch's copy to host moves each
    ShardedTensor with ``ShardedTensor.to``, which asks CUDA's runtime for the current device on a rank
    that holds no shard of it (a small parameter lives on one rank only) unless the group is plain
    gloo, and so fails on every accelerator but CUDA; ``ShardedTensor.cpu`` has no such branch."""
    return model is not None and not full and _is_fsdp1(model) and not _on_host(model)


def _to_host(value: Any) -> Any:
    """``value`` (a state dict, or anything in one) with every tensor copied to host memory; a
    ShardedTensor stays sharded the same way, its shards on the host and, where it was sharded over
    the whole world, over the world's host (gloo) group: a rank that holds no shard of it asks its
    group for the device it lives on (``ShardedTensor.device``, which DCP's loading reads), and
    torch answers "cpu" only for a gloo group and CUDA's current device otherwise."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if isinstance(value, ShardedTensor):
        return value.cpu(process_group=_host_group(value))
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: _to_host(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(item) for item in value)
    return value


_world_host_group: list[Any] = []  # [(the world group it was made for, the gloo group)]


def _host_group(sharded: Any) -> Any:
    """The process group for ``sharded``'s host copy: its own when that is gloo or not the whole world
    (a subgroup's gloo twin would have to be made by every rank of the world), else a gloo group over
    the world, made once per world group (every rank copies the same state dict, so every rank makes it)."""
    import torch.distributed as dist

    group = sharded._process_group
    world = dist.GroupMember.WORLD
    if group is not world or dist.get_backend(group) == "gloo":
        return group
    if not _world_host_group or _world_host_group[0][0] is not world:
        _world_host_group[:] = [(world, dist.new_group(backend="gloo"))]
    return _world_host_group[0][1]


def _host_state(state: Any, full: bool, model: Any) -> Any:
    """``state`` as :func:`_options` promised it: in host memory (see :func:`_host_copy_is_accels`)."""
    return _to_host(state) if _host_copy_is_accels(full, model) else state


def _on_host(model: torch.nn.Module) -> bool:
    param = next(iter(model.parameters()), None)
    return param is None or param.device == torch.device("cpu")


def _checkpoint_name(base: str, index: int, ext: str = "") -> str:
    return f"{base}{ext}" if index == 0 else f"{base}_{index}{ext}"


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _write(state: Any, key: str, output_dir: Path, base: str, index: int, sharded: bool) -> Path:
    """Write ``state``: the DCP folder ``<base>_<index>`` (every rank its shards) or ``<base>[_i].bin`` on rank 0."""
    import torch.distributed.checkpoint as dcp

    if sharded:
        target = output_dir / f"{base}_{index}"
        target.mkdir(parents=True, exist_ok=True)
        dcp.save({key: state}, checkpoint_id=str(target))
    else:
        target = output_dir / _checkpoint_name(base, index, ".bin")
        if _rank() == 0:
            output_dir.mkdir(parents=True, exist_ok=True)
            torch.save(state, target)
        _barrier()
    return target


def save_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: torch.nn.Module, output_dir: str | os.PathLike,
                    model_index: int = 0, adapter_only: bool = False, use_dcp: bool = True) -> str:
    """Save an FSDP model: ``pytorch_model_fsdp[_i].bin`` on rank 0 (FULL_STATE_DICT) or the DCP folder
    ``pytorch_model_fsdp_<i>`` (SHARDED_STATE_DICT, every rank writes its shards). Every rank must call it.

    ``adapter_only`` keeps a PEFT model's adapters alone (:func:`accel.strategies.fsdp.peft.get_adapter_state_dict`)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    get_state = get_adapter_state_dict if adapter_only else get_model_state_dict
    output_dir = Path(output_dir)
    sharded = fsdp_plugin.is_sharded_state_dict
    state = _host_state(get_state(model, options=_options(full=not sharded, model=model)), not sharded, model)
    target = _write(state, "model", output_dir, FSDP_MODEL_NAME, model_index, sharded)
    logger.info("FSDP model %d saved to %s", model_index, target)
    return target.name


def load_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: torch.nn.Module, input_dir: str | os.PathLike,
                    model_index: int = 0, adapter_only: bool = False, use_dcp: bool = True) -> Any:
    """Load what :func:`save_fsdp_model` wrote into the sharded ``model`` (any world size for DCP shards).

    ``adapter_only`` must match the save: the adapters are loaded and the frozen base weights left as they are."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    get_state, set_state = ((get_adapter_state_dict, set_adapter_state_dict) if adapter_only
                            else (get_model_state_dict, set_model_state_dict))
    input_dir = Path(input_dir)
    if fsdp_plugin.is_sharded_state_dict:
        folder = input_dir if (input_dir / ".metadata").is_file() else input_dir / f"{FSDP_MODEL_NAME}_{model_index}"
        if not (folder / ".metadata").is_file():
            raise FileNotFoundError(f"no sharded FSDP model checkpoint (DCP .metadata) in {folder}")
        state = _host_state(get_state(model, options=_options(full=False, model=model)), False, model)
        dcp.load({"model": state}, checkpoint_id=str(folder))
        return set_state(model, state, options=_options(full=False, model=model))
    path = input_dir / _checkpoint_name(FSDP_MODEL_NAME, model_index, ".bin")
    if not path.is_file():
        raise FileNotFoundError(f"no full FSDP model checkpoint at {path}")
    full = torch.load(path, map_location="cpu", weights_only=True) if _rank() == 0 else {}
    return set_state(model, full, options=_options(full=True, model=model, broadcast_from_rank0=True))


def save_fsdp_optimizer(fsdp_plugin: Any, accelerator: Any, optimizer: Any, model: torch.nn.Module,
                        output_dir: str | os.PathLike, optimizer_index: int = 0, use_dcp: bool = True) -> str:
    """Save the optimizer of an FSDP model: ``optimizer[_i].bin`` on rank 0 (FULL) or the DCP folder ``optimizer_<i>``."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    output_dir = Path(output_dir)
    sharded = fsdp_plugin.is_sharded_state_dict
    options = _options(full=not sharded, model=model, **({"flatten_optimizer_state_dict": True} if sharded else {}))
    state = _host_state(get_optimizer_state_dict(model, _torch_optimizer(optimizer), options=options), not sharded, model)
    return _write(state, "optimizer", output_dir, OPTIMIZER_NAME, optimizer_index, sharded).name


def load_fsdp_optimizer(fsdp_plugin: Any, accelerator: Any, optimizer: Any, model: torch.nn.Module,
                        input_dir: str | os.PathLike, optimizer_index: int = 0, adapter_only: bool = False,
                        use_dcp: bool = True) -> None:
    """Load what :func:`save_fsdp_optimizer` wrote into ``optimizer`` (any world size for DCP shards)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    torch_optimizer = _torch_optimizer(optimizer)
    input_dir = Path(input_dir)
    if fsdp_plugin.is_sharded_state_dict:
        folder = input_dir if (input_dir / ".metadata").is_file() else input_dir / f"{OPTIMIZER_NAME}_{optimizer_index}"
        if not (folder / ".metadata").is_file():
            raise FileNotFoundError(f"no sharded FSDP optimizer checkpoint (DCP .metadata) in {folder}")
        # flat keys (state.<param>.<name>, param_groups.<param>.<name>): DCP reshards each entry on its own
        options = _options(full=False, model=model, flatten_optimizer_state_dict=True)
        state = _host_state(get_optimizer_state_dict(model, torch_optimizer, options=options), False, model)
        dcp.load({"optimizer": state}, checkpoint_id=str(folder))
        set_optimizer_state_dict(model, torch_optimizer, state, options=options)
        return
    path = input_dir / _checkpoint_name(OPTIMIZER_NAME, optimizer_index, ".bin")
    if not path.is_file():
        raise FileNotFoundError(f"no full FSDP optimizer checkpoint at {path}")
    full = torch.load(path, map_location="cpu", weights_only=False) if _rank() == 0 else {}
    set_optimizer_state_dict(model, torch_optimizer, full, options=_options(full=True, model=model, broadcast_from_rank0=True))


def fsdp2_load_full_state_dict(accelerator: Any, model: torch.nn.Module, full_sd: dict[str, torch.Tensor],
                               cpu_offload: bool = False) -> None:
    """Fill the sharded ``model`` from rank 0's full state dict (the other ranks pass anything; rank 0's is broadcast)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, full_sd if _rank() == 0 else {}, options=_options(full=True, broadcast_from_rank0=True))
