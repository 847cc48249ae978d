"""The checkpoint folder's one table of names: Accelerate's file names, accel's manifest and switches,
the patterns of checkpoint and working folders, and the error every checkpoint problem raises.

Plain names and patterns, with no import of torch or of the other parts, so every part can use it.
"""

from __future__ import annotations

import re

# Accelerate's file names (accelerate.utils.constants), so its checkpoints and accel's share a layout
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
STATE_FILE = re.compile(
    r"(model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin|(optimizer|scheduler|sampler)(_\d+)?\.bin"
    r"|scaler\.pt|random_states_\d+\.(json|pkl)|custom_checkpoint_\d+\.pkl|" + re.escape(MANIFEST_NAME) + r")"
)


class CheckpointError(ValueError, RuntimeError):
    """A checkpoint is missing, incomplete, corrupt, unsafe to load, or does not fit what was prepared.

    A ``ValueError`` and a ``RuntimeError`` both, so code written for the errors Accelerate raises in
    the same situations still catches it.
    """


def index_suffix(i: int) -> str:
    """Accelerate's suffix of the i-th object's file: nothing for the first, ``_{i}`` after it."""
    return f"_{i}" if i > 0 else ""


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, pluralised when n != 1 (for error messages)."""
    return f"{n} {word}{'' if n == 1 else ('es' if word.endswith('s') else 's')}"
