"""One registered object's state on its own, in Accelerate's file (``{path}/custom_checkpoint_{index}.pkl``).

``save_state`` already writes registered objects inside its checkpoint; these two functions are
Accelerate's per-object helpers for code that calls them directly. Loading reads plain data only
(``weights_only``): a state dict of tensors, numbers, strings and containers.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .layout import CUSTOM_NAME

__all__ = ["load_custom_state", "save_custom_state"]

logger = logging.getLogger(__name__)


def _location(obj: Any, path: str | os.PathLike, index: int) -> Path:
    for method in ("state_dict", "load_state_dict"):
        if not callable(getattr(obj, method, None)):
            raise TypeError(f"{type(obj).__name__} has no {method}(); custom checkpoint objects need both methods")
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    return Path(path) / f"{CUSTOM_NAME}_{index}.pkl"


def save_custom_state(obj: Any, path: str | os.PathLike, index: int = 0, save_on_each_node: bool = False) -> None:
    """Write ``obj.state_dict()`` to ``{path}/custom_checkpoint_{index}.pkl`` (main process, or each node's)."""
    from ..utils.other import save

    location = _location(obj, path, index)
    logger.info("saving the state of %s to %s", type(obj).__name__, location)
    save(obj.state_dict(), location, save_on_each_node=save_on_each_node)


def load_custom_state(obj: Any, path: str | os.PathLike, index: int = 0) -> None:
    """Load ``{path}/custom_checkpoint_{index}.pkl`` into ``obj.load_state_dict`` (plain data only, no pickled code)."""
    from ..utils.other import load

    location = _location(obj, path, index)
    if not location.is_file():
        raise FileNotFoundError(f"no custom checkpoint {location.name} in {location.parent}")
    logger.info("loading the state of %s from %s", type(obj).__name__, location)
    obj.load_state_dict(load(location, map_location="cpu"))
