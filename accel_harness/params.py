"""How a backend-parametrized test instance names its backend and world size (read by the plugin and the recorder)."""

from __future__ import annotations

import pytest

#: the callspec parameters the plugin adds to each parametrized test instance
BACKEND_PARAM = "accel_backend_name"
WORLD_SIZE_PARAM = "accel_world_size"


def item_backend(item: pytest.Item) -> tuple[str | None, int | None]:
    """(backend name, world size) of a parametrized instance; (None, None) for a plain test."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None, None
    return callspec.params.get(BACKEND_PARAM), callspec.params.get(WORLD_SIZE_PARAM)
