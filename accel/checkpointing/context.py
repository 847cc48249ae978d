"""``CheckpointContext``: what checkpointing reads of the Accelerator that calls it, as values.

Checkpointing never holds the Accelerator: it is handed who this process is (index, count, main or
not), how to meet the other processes, the project configuration (folders, naming, limits), the
strategy and backend, the current step, and the two model operations it needs (a full state dict and
unwrapping). The facade builds one per call, so the values are current when the call starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:
    from ..backends import Backend
    from ..strategies.base import Strategy
    from ..utils.dataclasses import ProjectConfiguration

__all__ = ["CheckpointContext"]


@dataclass(frozen=True)
class CheckpointContext:
    """The process layout, settings and operations ``save``, ``save_model``, ``save_state`` and ``load_state`` use.

    ``wait_for_everyone`` is a barrier over every process; ``get_state_dict(model)`` gives the model's full
    (gathered) state dict; ``unwrap_model(model)`` the model under its wrappers. ``project_configuration``
    is the caller's own object: checkpointing reads it and returns what should change instead of writing it.
    """

    project_configuration: ProjectConfiguration
    strategy: Strategy
    backend: Backend
    device: torch.device
    process_index: int
    num_processes: int
    is_main_process: bool
    is_local_main_process: bool
    use_distributed: bool
    step: int
    wait_for_everyone: Callable[[], None]
    get_state_dict: Callable[[torch.nn.Module], dict[str, Any]]
    unwrap_model: Callable[[torch.nn.Module], torch.nn.Module]
