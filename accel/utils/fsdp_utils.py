"""FSDP helpers with Accelerate's names. For now: merging a sharded (DCP) FSDP checkpoint into one file.

An FSDP run saved with ``SHARDED_STATE_DICT`` leaves a torch.distributed.checkpoint (DCP) folder: a
``.metadata`` file plus one ``__<rank>_0.distcp`` file per rank. :func:`merge_fsdp_weights` reads it in
one process (no process group needed) with DCP's own reader and writes ``model.safetensors`` (or
``pytorch_model.bin``), which ``from_pretrained``/``load_checkpoint_in_model`` and plain
``torch.load``/``safetensors`` read. Used by ``accel merge-weights``; the FSDP strategy may add its
own helpers to this module.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from accel.facts.checkpoint import FSDP_MODEL_NAME, OPTIMIZER_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME

__all__ = ["SAFE_WEIGHTS_NAME", "WEIGHTS_NAME", "merge_fsdp_weights"]

logger = logging.getLogger(__name__)

#: sub-folders Accelerate's save_state writes for a sharded FSDP model and optimizer (the first of each)
_MODEL_FOLDER, _OPTIMIZER_FOLDER = f"{FSDP_MODEL_NAME}_0", f"{OPTIMIZER_NAME}_0"


def _check_checkpoint_dir(checkpoint_dir: Path) -> None:
    """ValueError naming the folder when it holds no DCP checkpoint, pointing at the model/optimizer
    sub-folder when the user passed the save_state folder that contains them."""
    if (checkpoint_dir / ".metadata").is_file():
        return
    message = f"Tried to load from {checkpoint_dir} but couldn't find a valid metadata file (no DCP checkpoint there: expected {checkpoint_dir / '.metadata'})."
    candidates = [checkpoint_dir / name for name in (_MODEL_FOLDER, _OPTIMIZER_FOLDER) if (checkpoint_dir / name / ".metadata").is_file()]
    if candidates:
        message += " It contains " + " and ".join(str(c) for c in candidates) + ": pass one of those instead."
    elif not checkpoint_dir.exists():
        message += " The folder does not exist."
    raise ValueError(message)


def _flatten(state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _load_dcp(checkpoint_dir: Path) -> dict[str, Any]:
    """Every entry of the DCP checkpoint, loaded whole in this process (no process group)."""
    # DCP's format utilities (what dcp_to_torch_save runs): an empty-state planner loads every entry
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner, _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=FileSystemReader(str(checkpoint_dir)), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    if len(state) == 1 and isinstance(next(iter(state.values())), dict):  # {"model": {...}} as Accelerate saves it
        state = next(iter(state.values()))
    return state


def _write(state: dict[str, Any], folder: Path, safe_serialization: bool) -> Path:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    if not safe_serialization:
        target = folder / WEIGHTS_NAME
        torch.save(state, target)
        return target
    from safetensors.torch import save_file

    flat = _flatten(state)
    not_tensors = sorted(k for k, v in flat.items() if not isinstance(v, torch.Tensor))
    if not_tensors:
        raise ValueError(
            f"safetensors holds tensors only, but the checkpoint has other values ({', '.join(not_tensors[:5])}"
            f"{', ...' if len(not_tensors) > 5 else ''}); merge the model folder, or pass safe_serialization=False "
            "(--unsafe_serialization) to write pytorch_model.bin"
        )
    target = folder / SAFE_WEIGHTS_NAME
    save_file({k: v.contiguous() for k, v in flat.items()}, str(target), metadata={"format": "pt"})
    return target


def merge_fsdp_weights(checkpoint_dir: str, output_path: str, safe_serialization: bool = True, remove_checkpoint_dir: bool = False) -> Path | None:
    """Merge a sharded FSDP checkpoint (a DCP folder, model or optimizer) into one file in ``output_path``:
    ``model.safetensors``, or ``pytorch_model.bin`` when ``safe_serialization`` is False.

    Runs in one process; inside a distributed run only rank 0 merges and the others wait. With
    ``remove_checkpoint_dir`` the sharded folder is deleted after a successful merge. Returns the file
    written (None on the ranks that did not write). ValueError names a folder without a checkpoint.
    """
    import torch.distributed as dist

    checkpoint_dir = Path(checkpoint_dir)
    _check_checkpoint_dir(checkpoint_dir)
    distributed = dist.is_available() and dist.is_initialized()
    written = None
    if not distributed or dist.get_rank() == 0:
        logger.info("Merging FSDP weights from %s", checkpoint_dir)
        written = _write(_load_dcp(checkpoint_dir), Path(output_path), safe_serialization)
        logger.info("Merged FSDP weights saved to %s", written)
        if remove_checkpoint_dir:
            logger.info("Removing the sharded checkpoint %s", checkpoint_dir)
            shutil.rmtree(checkpoint_dir)
    if distributed:
        dist.barrier()
    return written


# ---------------------------------------------------------------------------------------------- FSDP strategy
# Accelerate's other fsdp_utils names. The checkpoint and sharding helpers live with the FSDP strategy
# (accel.strategies.fsdp) that uses them; importing them here costs nothing beyond torch.
from ..strategies.fsdp import (  # noqa: E402
    fsdp2_apply_ac,
    fsdp2_canonicalize_names,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
    get_fsdp2_grad_scaler,
    load_fsdp_model,
    load_fsdp_optimizer,
    save_fsdp_model,
    save_fsdp_optimizer,
)

__all__ += [
    "disable_fsdp_ram_efficient_loading", "enable_fsdp_ram_efficient_loading", "fsdp2_apply_ac", "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict", "fsdp2_prepare_model", "fsdp2_switch_optimizer_parameters", "get_fsdp2_grad_scaler",
    "load_fsdp_model", "load_fsdp_optimizer", "save_fsdp_model", "save_fsdp_optimizer",
]


def enable_fsdp_ram_efficient_loading() -> None:
    """Ask transformers' ``from_pretrained`` to load real weights on rank 0 only (FSDP_CPU_RAM_EFFICIENT_LOADING)."""
    import os

    os.environ.setdefault("ACCELERATE_USE_FSDP", "True")
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "True"


def disable_fsdp_ram_efficient_loading() -> None:
    """Every rank loads the full weights again (FSDP_CPU_RAM_EFFICIENT_LOADING=False)."""
    import os

    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "False"


def ensure_weights_retied(param_init_fn: Any, model: Any, device: Any) -> Any:
    """Wrap FSDP's ``param_init_fn`` so parameters tied in ``model._tied_weights_keys`` stay tied.

    Materialising meta parameters replaces them module by module, which silently unties shared
    weights (embeddings and LM head); the wrapper re-ties every later occurrence to the first new one.
    Models without tied keys get ``param_init_fn`` back unchanged.
    """
    tied_names = getattr(model, "_tied_weights_keys", None)
    if not tied_names:
        return param_init_fn
    first_new: dict[int, Any] = {}
    for name in tied_names:
        owner, _, attr = name.rpartition(".")
        first_new[id(getattr(model.get_submodule(owner), attr))] = None

    def init_keeping_ties(module: Any) -> Any:
        tied_here = [(attr, id(p)) for attr, p in module.named_parameters(recurse=False) if id(p) in first_new]
        module = param_init_fn(module)
        for attr, key in tied_here:
            if first_new[key] is None:
                first_new[key] = getattr(module, attr)
            else:
                setattr(module, attr, first_new[key])
        return module

    return init_keeping_ties


__all__ += ["ensure_weights_retied"]
