"""accel's built-in backends, in probe order: the one list the registry and device profiles read."""

from __future__ import annotations

from typing import Callable, Union

from .base import Backend

BackendFactory = Union[type[Backend], Callable[[], Backend]]


def builtin_factories() -> list[BackendFactory]:
    """The built-in Backend classes, imported on call (each module is cheap; torch is already loaded)."""
    from .cpu import CPUBackend
    from .cuda import CUDABackend
    from .hpu import HPUBackend
    from .mlu import MLUBackend
    from .mps import MPSBackend
    from .musa import MUSABackend
    from .neuron import NeuronBackend
    from .npu import NPUBackend
    from .sdaa import SDAABackend
    from .xla import XLABackend
    from .xpu import XPUBackend

    return [CUDABackend, XPUBackend, HPUBackend, MPSBackend, NPUBackend, MLUBackend, MUSABackend, SDAABackend,
            NeuronBackend, XLABackend, CPUBackend]
