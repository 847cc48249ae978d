"""Checkpoints: ``save``, ``save_model``, ``save_state`` / ``load_state`` with Accelerate's names and layout.

Beyond Accelerate's: a checkpoint is written atomically (a crash leaves the previous one loadable), its
manifest records every file's sha256 and is verified on load, no manifest entry may lead out of the
folder, nothing is unpickled as code, and the RNG states are written twice, as accel's JSON and as
Accelerate's ``random_states_N.pkl``, so either library resumes the same draws. docs/checkpoints.md
describes the folder, the checks and what is refused.

The parts: ``layout`` (file names, the error), ``serialization`` (how each file is written and read),
``transaction`` (hidden working folders, the rename into place, ``total_limit``), ``manifest``
(checksums, entry checks), ``rng`` and ``loaders`` (RNG states and data loader positions), ``export``
(``save``, ``save_model``), ``hooks`` (pre-hook handles) and ``api`` (``save_state``, ``load_state``,
which take what was prepared as a value and return what the Accelerator applies).
"""

from __future__ import annotations

from .api import LoadedState, SavedState, load_state, save_state
from .custom import load_custom_state, save_custom_state
from .export import parse_size, save, save_model
from .hooks import HookHandle, register_hook
from .layout import (
    CHECKPOINTS_FOLDER,
    CHECKSUM_ALGORITHM,
    CHECKSUM_ENV,
    CUSTOM_NAME,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    CheckpointError,
)

__all__ = [
    "CheckpointError",
    "LoadedState",
    "SavedState",
    "load_state",
    "load_custom_state",
    "HookHandle",
    "parse_size",
    "register_hook",
    "save",
    "save_model",
    "save_state",
    "save_custom_state",
]
