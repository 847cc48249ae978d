"""A data loader's position in a checkpoint: saved as plain data, put back on load."""

from __future__ import annotations

import logging
from typing import Any

import torch

from .layout import CheckpointError

logger = logging.getLogger(__name__)


def dataloader_state(loader: Any) -> dict[str, Any]:
    """A data loader's position as plain data: its epoch, a SeedableRandomSampler's epoch and seed, a stateful loader's own state."""
    state: dict[str, Any] = {"type": type(loader).__name__}
    iteration = getattr(loader, "iteration", None)
    if isinstance(iteration, int):
        state["iteration"] = iteration
    sampler = sampler_of(loader)
    from ..data_loader import SeedableRandomSampler

    if isinstance(sampler, SeedableRandomSampler):
        state["sampler"] = {"type": "SeedableRandomSampler", "epoch": int(sampler.epoch),
                            "initial_seed": int(sampler.initial_seed)}
    if getattr(loader, "use_stateful_dataloader", False):
        # torchdata's StatefulDataLoader knows its position inside the epoch: resume mid-epoch exactly
        state["stateful"] = loader.state_dict()
    return state


def sampler_of(loader: Any) -> Any:
    """The sampler behind a (prepared) data loader, or None when it has none to find."""
    from ..data_loader import get_sampler

    try:
        return get_sampler(loader)
    except Exception:
        return None


def generator_of(loader: Any) -> torch.Generator | None:
    """The torch.Generator a data loader shuffles with (its sampler's, else its synchronized one), or None."""
    sampler = sampler_of(loader)
    generator = getattr(sampler, "generator", None)
    if not isinstance(generator, torch.Generator):
        generator = getattr(loader, "synchronized_generator", None)
    return generator if isinstance(generator, torch.Generator) else None


def restore_dataloader(loader: Any, state: Any) -> None:
    """Put a data loader back at the position ``dataloader_state`` recorded."""
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
        sampler = sampler_of(loader)
        if hasattr(sampler, "initial_seed") and "initial_seed" in sampler_state:
            sampler.initial_seed = int(sampler_state["initial_seed"])
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(int(sampler_state["epoch"]))
        elif sampler is not None:
            logger.warning("the checkpoint has a %s state but data loader uses %s; not restored",
                           sampler_state.get("type"), type(sampler).__name__)
