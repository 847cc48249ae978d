"""The Accelerator's fp8 recipe attributes, as Accelerate names them.

Accelerate keeps one attribute per recipe kind (``fp8_recipe_handler`` for the deprecated
``FP8RecipeKwargs``, ``ao_recipe_handler``, ``te_recipe_handler``, ``msamp_recipe_handler``), fills the
one its fp8 backend uses when ``mixed_precision="fp8"`` came without a recipe, and derives
``has_fp8_handler`` and ``fp8_backend`` from them. Scripts and Accelerate's tests read these, so accel
computes them the same way here; which recipe accel's precision then runs is decided in
:mod:`accel.precision.fp8` from the same choice.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from ..utils.dataclasses import (
    AORecipeKwargs,
    DistributedType,
    FP8BackendType,
    FP8RecipeKwargs,
    MSAMPRecipeKwargs,
    TERecipeKwargs,
)

__all__ = ["Fp8Handlers", "delays_fp8_autocast", "fp8_backend_of", "fp8_handlers"]

#: the recipe class -> the Accelerator attribute holding it (Accelerate's names)
RECIPE_ATTRIBUTES = {
    FP8RecipeKwargs: "fp8_recipe_handler",
    AORecipeKwargs: "ao_recipe_handler",
    TERecipeKwargs: "te_recipe_handler",
    MSAMPRecipeKwargs: "msamp_recipe_handler",
}
#: the fp8 backend -> the recipe Accelerate builds when fp8 was asked for without one
_DEFAULT_RECIPES = {"AO": AORecipeKwargs, "TE": TERecipeKwargs, "MSAMP": MSAMPRecipeKwargs}


class Fp8Handlers(NamedTuple):
    """The fp8 attributes of one Accelerator."""

    fp8_recipe_handler: Any
    ao_recipe_handler: Any
    te_recipe_handler: Any
    msamp_recipe_handler: Any
    #: a recipe was passed, or built because ``mixed_precision="fp8"`` asked for one
    has_fp8_handler: bool
    #: ``mixed_precision="fp8"`` was asked for (by the argument or the state)
    fp8_enabled: bool

    def recipe(self) -> Any:
        """The one recipe handler in use (the first set, in Accelerate's order), or None."""
        return next((h for h in self[:4] if h is not None), None)


def fp8_handlers(handlers: Mapping[type, Any], fp8_enabled: bool) -> Fp8Handlers:
    """The recipe attributes for ``handlers`` (kwargs handlers by class) and whether fp8 was asked for."""
    found = {attr: handlers.get(cls) for cls, attr in RECIPE_ATTRIBUTES.items()}
    has_handler = any(h is not None for h in found.values())
    if fp8_enabled and not has_handler:
        from .fp8 import fp8_backend_name

        recipe = _DEFAULT_RECIPES.get(fp8_backend_name())
        if recipe is not None:
            found[RECIPE_ATTRIBUTES[recipe]] = recipe()
            has_handler = True
    return Fp8Handlers(**found, has_fp8_handler=has_handler, fp8_enabled=fp8_enabled)


def fp8_backend_of(fp8: Fp8Handlers, deepspeed_plugin: Any = None) -> FP8BackendType:
    """The fp8 backend configured for training (``Accelerator.fp8_backend``), as Accelerate derives it."""
    if fp8.has_fp8_handler:
        if fp8.fp8_recipe_handler is not None:
            return FP8BackendType(str(fp8.fp8_recipe_handler.backend).upper())
        for handler, backend in ((fp8.ao_recipe_handler, "AO"), (fp8.te_recipe_handler, "TE"),
                                 (fp8.msamp_recipe_handler, "MSAMP")):
            if handler is not None:
                return FP8BackendType(backend)
    elif deepspeed_plugin is not None and getattr(deepspeed_plugin, "enable_msamp", False):
        return FP8BackendType.MSAMP
    from ..facts.environment import env_text

    chosen = env_text("ACCEL_FP8_BACKEND", "ACCELERATE_FP8_BACKEND", default="NO")
    try:
        return FP8BackendType(chosen.strip().upper())
    except ValueError:
        raise ValueError(f"ACCELERATE_FP8_BACKEND must be one of {[b.value for b in FP8BackendType]}, "
                         f"got {chosen!r}") from None


def delays_fp8_autocast(backend: FP8BackendType, distributed_type: Any) -> bool:
    """Whether Transformer Engine's fp8 autocast is entered by the wrapped model instead of the step
    (Accelerate's ``delayed_fp8_autocast``: TE under multi-GPU data parallelism or FSDP)."""
    return backend == FP8BackendType.TE and distributed_type in (DistributedType.MULTI_GPU, DistributedType.FSDP)
