"""The checkpoint folder's names: Accelerate's file names (from accel.facts.checkpoint), accel's manifest
and switches, the patterns of checkpoint and working folders, and the error every checkpoint problem raises.

Plain names and patterns, with no import of torch or of the other parts, so every part can use it.
"""

from __future__ import annotations

import re

# Accelerate's file names, so its checkpoints and accel's share a layout
from ..facts.checkpoint import (  # noqa: F401 (re-exported for the checkpointing modules)
    CUSTOM_NAME,
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
    index_suffix,
)

# accel's own
MANIFEST_NAME = "accel_checkpoint.json"
CHECKPOINTS_FOLDER = "checkpoints"
FORMAT = "accel-checkpoint"
FORMAT_VERSION = 1
#: hashlib algorithm of the per-file checksums in the manifest ("checksums": {relative path: {algorithm: hex, "size": n}})
CHECKSUM_ALGORITHM = "sha256"
#: set to 0/false/no/off to neither write nor verify checksums (very large checkpoints); see load_state(verify_checksums=)
CHECKSUM_ENV = "ACCEL_CHECKPOINT_CHECKSUMS"

#: a folder of automatic checkpoint naming, ``checkpoint_<iteration>``
CHECKPOINT_DIR = re.compile(r"checkpoint_(\d+)")
#: a hidden working folder of save_state: ``.{name}.tmp-{token}`` (being written), ``.old-`` (moved aside),
#: ``.del-`` (being deleted by total_limit)
LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old|del)-(?P<token>[0-9a-f]+-[0-9a-f]+)")
#: files save_state owns: stale ones are not carried over when an existing directory is replaced
STATE_FILE = re.compile("(" + "|".join((
    rf"{SAFE_MODEL_NAME}(_\d+)?\.safetensors",
    rf"{MODEL_NAME}(_\d+)?\.bin",
    rf"({OPTIMIZER_NAME}|{SCHEDULER_NAME}|{SAMPLER_NAME})(_\d+)?\.bin",
    re.escape(SCALER_NAME),
    rf"{RNG_STATE_NAME}_\d+\.(json|pkl)",
    rf"{CUSTOM_NAME}_\d+\.pkl",
    re.escape(MANIFEST_NAME),
)) + ")")


class CheckpointError(ValueError, RuntimeError):
    """A checkpoint is missing, incomplete, corrupt, unsafe to load, or does not fit what was prepared.

    A ``ValueError`` and a ``RuntimeError`` both, so code written for the errors Accelerate raises in
    the same situations still catches it.
    """


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, pluralised when n != 1 (for error messages)."""
    return f"{n} {word}{'' if n == 1 else ('es' if word.endswith('s') else 's')}"
