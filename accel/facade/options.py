"""Checks on the Accelerator's constructor options that need more than a line.

``kwargs_handlers`` are sorted by kind (at most one of each kind accel knows), and the gradient
accumulation settings (``gradient_accumulation_steps``, a plugin, or the launcher's variable) become
one :class:`~accel.utils.dataclasses.GradientAccumulationPlugin`.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..utils.dataclasses import GradientAccumulationPlugin

__all__ = ["accumulation_plugin", "sort_kwargs_handlers"]


def sort_kwargs_handlers(handlers: Iterable[Any]) -> dict[type, Any]:
    """``handlers`` by the handler class each is an instance of; an unknown handler or a second of one kind is refused."""
    from ..utils.dataclasses import (
        AORecipeKwargs,
        AutocastKwargs,
        DistributedDataParallelKwargs,
        FP8RecipeKwargs,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        MSAMPRecipeKwargs,
        ProfileKwargs,
        TERecipeKwargs,
    )

    found: dict[type, Any] = {}
    known = (DistributedDataParallelKwargs, GradScalerKwargs, AutocastKwargs, InitProcessGroupKwargs, ProfileKwargs,
             FP8RecipeKwargs, TERecipeKwargs, AORecipeKwargs, MSAMPRecipeKwargs)
    for handler in handlers:
        kind = next((k for k in known if isinstance(handler, k)), None)
        if kind is None:
            raise TypeError(f"unsupported kwargs handler {type(handler).__name__}; accel takes {', '.join(k.__name__ for k in known)}")
        if kind in found:
            raise ValueError(f"only one {kind.__name__} may be passed in kwargs_handlers")
        found[kind] = handler
    return found


def accumulation_plugin(steps: int, plugin: GradientAccumulationPlugin | None) -> GradientAccumulationPlugin:
    """The accumulation plugin of a run: ``plugin`` as given, else one of ``steps`` batches.

    ``steps`` left at 1 takes the launcher's ``GRADIENT_ACCUMULATION_STEPS`` variable when set; giving
    both a plugin and ``steps`` other than 1 is refused, as is a ``steps`` that is no positive integer.
    """
    from ..utils.environment import env_value

    if plugin is not None:
        if steps != 1:
            raise ValueError("pass either gradient_accumulation_steps or gradient_accumulation_plugin, not both")
        return plugin
    env_steps = env_value("GRADIENT_ACCUMULATION_STEPS")
    if steps == 1 and env_steps is not None:
        steps = int(env_steps)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be a positive integer, got {steps!r}")
    return GradientAccumulationPlugin(num_steps=steps)
