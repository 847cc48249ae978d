"""How many backend instances the harness makes here: every registered backend but cpu is unavailable."""

from __future__ import annotations


def other_backends() -> int:
    """How many registered backends besides cpu (none of them is available on this machine)."""
    from accel.backends import get_registry

    registry = get_registry()
    assert [b.name for b in registry.available()] == ["cpu"], "these tests expect cpu to be the only available backend"
    return len(registry.names()) - 1
