"""PEP 562 lazy exports: a package names what it offers and imports each module on first use.

This keeps ``import accel`` and ``import accel.utils`` cheap (no torch submodules, no pandas) while
``from accel import Accelerator`` still works as in Accelerate.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, namespace: dict[str, Any], table: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` resolving names through ``table`` (name -> module)."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(list(namespace) + list(table))

    return __getattr__, __dir__
