"""The strategy interface and the single-process strategy."""

from __future__ import annotations

import contextlib
from typing import Any

import torch


class Strategy:
    """Wraps models for a distribution scheme and knows how to skip gradient sync and unwrap."""

    name = "base"

    def __init__(self, state: Any):
        self.state = state

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def is_wrapped(self, model: torch.nn.Module) -> bool:
        return False


class SingleDeviceStrategy(Strategy):
    name = "single"
