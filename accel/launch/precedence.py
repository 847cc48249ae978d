"""The one precedence rule for every setting, in every command and the library.

A value given on the command line wins; else the environment variable; else the config file; else
what detection finds. Where two sources name different values, the choice says which one was used
and why, so a command never silently follows one and ignores the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ORDER", "Choice", "choose"]

#: the sources of a setting, strongest first
ORDER = ("flag", "environment", "config file", "detection")


@dataclass(frozen=True)
class Choice:
    """The value a setting takes, the source it came from, and a note when a weaker source disagreed."""

    value: Any
    source: str
    note: str | None = None
    #: where exactly it came from: the variable's name, the config file's path, "the command line"
    origin: str = ""

    def describe(self, setting: str) -> str:
        """``setting = value (from source)``, with the disagreement when there was one."""
        text = f"{setting} = {self.value} (from {self.source})"
        return f"{text}; {self.note}" if self.note else text


def choose(setting: str, *, flag: Any = None, environment: tuple[str, Any] | None = None,
           config: tuple[str, Any] | None = None, detected: Any = None) -> Choice:
    """Pick ``setting`` by :data:`ORDER`.

    ``flag``: the command-line value (None: not given). ``environment``: ``(variable, value)``.
    ``config``: ``(file, value)``. ``detected``: what detection would give (None: let the caller
    detect). Empty values count as not given.
    """
    candidates: list[tuple[str, Any, str]] = []
    if flag not in (None, ""):
        candidates.append(("flag", flag, "the command line"))
    if environment is not None and environment[1] not in (None, ""):
        candidates.append(("environment", environment[1], environment[0]))
    if config is not None and config[1] not in (None, ""):
        candidates.append(("config file", config[1], f"the config file {config[0]}"))
    if not candidates:
        return Choice(detected, "detection", origin="detection")
    source, value, label = candidates[0]
    overruled = [(s, v, lbl) for s, v, lbl in candidates[1:] if str(v).strip().lower() != str(value).strip().lower()]
    note = None
    if overruled:
        others = ", ".join(f"{lbl} says {v}" for _, v, lbl in overruled)
        note = (f"{label} ({value}) is used over what {others}: the precedence is "
                f"{' > '.join(ORDER)}")
    return Choice(value, source, note, origin=label)
