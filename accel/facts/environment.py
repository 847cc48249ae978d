"""Environment variables: the one true/false parser, and the table of every variable accel reads.

The table is the launcher <-> library contract: ``accel launch`` (and ``notebook_launcher``) write
the launch's settings into the ranks' environment under Accelerate's names, the library reads them
back. Where accel has its own ``ACCEL_*`` spelling, it wins over Accelerate's ``ACCELERATE_*`` one.
Families whose members follow a launch option's name (``FSDP_*``, ``ACCELERATE_FP8_*``, ...) are
rows of :data:`ENV_FAMILIES`.

The parser is what nearly every module needs, the table only a few tools and tests: the table's rows
live in :mod:`accel.facts.env_table` and are reached here by name (``ENV_VARS``, ``ENV_FAMILIES``,
``EnvVar``, ``EnvFamily``, ``contract_entry``), loaded on first use, so reading a flag stays cheap.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Mapping

__all__ = [
    "ENV_FAMILIES", "ENV_VARS", "FALSE_WORDS", "TRUE_WORDS", "EnvFamily", "EnvVar", "contract_entry", "env_flag",
    "env_text", "parse_bool",
]

#: the words read as true and as false (Accelerate's ``str_to_bool``), compared case-insensitively
TRUE_WORDS: frozenset[str] = frozenset({"1", "y", "yes", "t", "true", "on"})
FALSE_WORDS: frozenset[str] = frozenset({"0", "n", "no", "f", "false", "off"})
_ACCEPTED = "1/0, yes/no, y/n, true/false, t/f, on/off"


def parse_bool(value: object, name: str | None = None) -> bool:
    """``value`` as a bool: a bool as is, a yes/no word from :data:`TRUE_WORDS`/:data:`FALSE_WORDS` (any case,
    surrounding blanks ignored); anything else is a ValueError naming ``name`` (the variable or option)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    subject = name or "the value"
    raise ValueError(f"{subject} must be yes or no ({_ACCEPTED}), got {value!r}")


def env_text(*names: str, default: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of the first of ``names`` that is set and not empty, else ``default``.

    Give accel's name first and Accelerate's after it: ``env_text("ACCEL_X", "ACCELERATE_X")``.
    An empty value counts as unset, so ``ACCEL_X=`` does not hide ``ACCELERATE_X=1``.
    """
    if not names:
        raise ValueError("env_text needs at least one variable name")
    environ = os.environ if environ is None else environ
    for name in names:
        value = environ.get(name)
        if value is not None and value.strip() != "":
            return value
    return default


def env_flag(*names: str, default: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """The yes/no variable: the first of ``names`` that is set and not empty, parsed by :func:`parse_bool`.

    Unset (or empty) gives ``default``; a value that is no yes/no word is a ValueError naming the variable.
    """
    if not names:
        raise ValueError("env_flag needs at least one variable name")
    environ = os.environ if environ is None else environ
    for name in names:
        value = environ.get(name)
        if value is not None and value.strip() != "":
            return parse_bool(value, name)
    return bool(default)


# ---------------------------------------------------------------------------------------------- the contract
#: the table's names, defined in accel.facts.env_table
_TABLE_NAMES = frozenset({"ENV_FAMILIES", "ENV_VARS", "EnvFamily", "EnvVar", "contract_entry", "LAUNCH", "USER"})


def __getattr__(name: str) -> Any:
    """The variable table's names (``ENV_VARS``, ``contract_entry``, ...), loaded on first use."""
    if name not in _TABLE_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__package__}.env_table"), name)
    globals()[name] = value  # later lookups skip this function
    return value
