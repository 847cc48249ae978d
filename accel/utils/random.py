"""Seeding and RNG synchronisation across processes, through the one backend registry."""

from __future__ import annotations

import random
import warnings
from typing import Iterable

import torch

from ..backends import is_host_device
from .dataclasses import RNGType

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]


def _state():
    from ..state import PartialState

    return PartialState()


def _active_backend():
    from ..state import is_initialized

    if is_initialized():
        return _state().hardware_backend
    from ..backends import get_backend

    return get_backend()


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python, numpy, torch and the active device backend.

    ``device_specific`` adds the process index, so ranks draw different numbers (data augmentation)
    while staying reproducible. ``deterministic`` asks torch for deterministic algorithms.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"set_seed needs an int seed, got {type(seed).__name__}")
    if device_specific:
        seed += _state().process_index
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass
    torch.manual_seed(seed)
    backend = _active_backend()
    if not backend.is_host:
        backend.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


class _PluginRNG(str):
    """An RNG type named by a plug-in backend rather than Accelerate's RNGType list."""

    @property
    def value(self) -> str:
        return str(self)


def synchronize_rng_state(rng_type: RNGType | str | None = None, generator: torch.Generator | None = None) -> None:
    """Copy the main process's RNG state of ``rng_type`` to every process."""
    state = _state()
    backend = state.hardware_backend
    if isinstance(rng_type, str) and not isinstance(rng_type, RNGType):
        # plug-in backends name their own device RNG (e.g. "npu", "privateuseone")
        rng_type = RNGType(rng_type) if rng_type in RNGType.list() else _PluginRNG(rng_type)
    if rng_type is RNGType.TORCH:
        get, put = torch.get_rng_state, torch.set_rng_state
    elif rng_type is RNGType.GENERATOR:
        if generator is None:
            raise ValueError("synchronize_rng_state('generator') needs the generator to synchronise")
        get, put = generator.get_state, generator.set_state
    elif rng_type is not None and rng_type.value in (backend.name, backend.device_type):
        get, put = backend.get_rng_state, backend.set_rng_state
    else:
        warnings.warn(
            f"rng type {rng_type!r} does not belong to the active backend {backend.name!r}: not synchronised",
            stacklevel=2,
        )
        return
    if not state.use_distributed:
        return
    import torch.distributed as dist

    rng = get()
    # collectives on device backends (nccl, xccl, hccl) need device tensors
    carrier = rng.clone() if is_host_device(state.device) else rng.to(state.device)
    dist.broadcast(carrier, src=0)
    put(carrier.cpu())


def synchronize_rng_states(rng_types: Iterable[RNGType | str], generator: torch.Generator | None = None) -> None:
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)
