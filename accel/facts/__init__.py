"""Facts several parts of accel share, one table each, in torch-free modules (cheap to import anywhere,
also by the pytest plugin at start-up and by the CI scripts before accel's dependencies are installed).

=====================  ===============================================================
``backends``           built-in backend names in probe order
``precision``          the ``mixed_precision`` names and their check
``reasons``            skip reason codes with a one-line description each
``checkpoint``         checkpoint file names (Accelerate's layout)
``network``            the default rendezvous port and the free-port helper
``versions``           version floors (torch for FSDP2, torchao for fp8, ...)
``environment``        the true/false parser and the launcher <-> library variable table
``requirements``       what each Accelerate-style test decorator needs
=====================  ===============================================================

These modules import nothing from the rest of accel.
"""

from __future__ import annotations

from .backends import BUILTIN_BACKENDS
from .checkpoint import index_suffix
from .environment import ENV_FAMILIES, ENV_VARS, FALSE_WORDS, TRUE_WORDS, env_flag, env_text, parse_bool
from .network import DEFAULT_PORT, free_port, is_port_in_use
from .precision import PRECISIONS, check_precision
from .reasons import SKIP_CODES, SKIP_REASONS, UNSPECIFIED
from .requirements import REQUIREMENT_TABLE

__all__ = [
    "BUILTIN_BACKENDS", "DEFAULT_PORT", "ENV_FAMILIES", "ENV_VARS", "FALSE_WORDS", "PRECISIONS", "REQUIREMENT_TABLE",
    "SKIP_CODES", "SKIP_REASONS", "TRUE_WORDS", "UNSPECIFIED", "check_precision", "env_flag", "env_text", "free_port",
    "index_suffix", "is_port_in_use", "parse_bool",
]
