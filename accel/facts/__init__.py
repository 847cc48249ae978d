"""Facts several parts of accel share, one table each, in torch-free modules (cheap to import anywhere,
also by the pytest plugin at start-up and by the CI scripts before accel's dependencies are installed).

=====================  ===============================================================
``backends``           built-in backend names in probe order
``precision``          the ``mixed_precision`` names and their check
``reasons``            skip reason codes with a one-line description each
``checkpoint``         checkpoint file names (Accelerate's layout)
``network``            the default rendezvous port and the free-port helper
``versions``           version floors (torch for FSDP2, torchao for fp8, ...)
``environment``        the true/false parser; the launcher <-> library variable table by name
``env_table``          that variable table's rows (loaded when first asked for)
``requirements``       what each Accelerate-style test decorator needs
``model_gates``        the model suite's modes and each one's gate factors
=====================  ===============================================================

These modules import nothing from the rest of accel. Importing the package imports none of them:
each name below loads its module on first use (PEP 562), so ``from accel.facts.network import
DEFAULT_PORT`` does not also build the variable table or the requirement table.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the submodule that defines it
_EXPORTS: dict[str, str] = {
    "BUILTIN_BACKENDS": "backends",
    "index_suffix": "checkpoint",
    "ENV_FAMILIES": "environment", "ENV_VARS": "environment", "FALSE_WORDS": "environment",
    "TRUE_WORDS": "environment", "env_flag": "environment", "env_text": "environment", "parse_bool": "environment",
    "DEFAULT_PORT": "network", "free_port": "network", "is_port_in_use": "network",
    "PRECISIONS": "precision", "check_precision": "precision",
    "SKIP_CODES": "reasons", "SKIP_REASONS": "reasons", "UNSPECIFIED": "reasons",
    "REQUIREMENT_TABLE": "requirements",
    "MODE_GATES": "model_gates", "MODEL_MODES": "model_gates",
}
_SUBMODULES = ("backends", "checkpoint", "environment", "model_gates", "network", "precision", "reasons", "requirements",
               "versions")

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Load the submodule behind ``name`` (a table's name or a submodule's) on first access."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    """The public names and the submodules, loaded or not."""
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))
