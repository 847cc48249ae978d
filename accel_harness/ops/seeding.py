"""Seeding in a sweep worker: the generators a sample or a module can draw from, and nothing else.

``torch.manual_seed`` also seeds CUDA, XPU and MTIA; on a build or machine without them each of
those seedings is queued with a formatted stack, which costs more per call than making an
operator's samples. A worker serves one backend, so it seeds Python's, NumPy's and the host's
generators and that backend's devices (set once with :func:`use_backend`).
"""

from __future__ import annotations

import random
from typing import Any, Callable

import torch

__all__ = ["seed_all", "use_backend"]

_device_seed: Callable[[int], None] | None = None


def use_backend(backend: Any | None) -> None:
    """Seed ``backend``'s devices from now on (the host's generator is always seeded); None: every device again."""
    global _device_seed
    if backend is None:
        _device_seed = None
    else:
        _device_seed = _host_only if backend.is_host else backend.manual_seed


def _host_only(value: int) -> None:
    """The host's generator is the cpu backend's device generator: nothing more to seed."""


def seed_all(value: int) -> None:
    """Seed Python's, NumPy's and torch's host generator, and the devices of the backend in use.

    Outside a worker (no backend set) this is ``torch.manual_seed`` with Python's and NumPy's seeds."""
    random.seed(value)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(value)
    if _device_seed is None:
        torch.manual_seed(value)
        return
    torch.default_generator.manual_seed(value)
    _device_seed(value)
