"""Mixed precision: decide what really runs on this backend, and provide autocast and the scaler.

The requested precision is checked against the backend's capabilities. Where the installed torch
supports it (torch 2.13 runs fp16 autocast and GradScaler on CPU) it really runs; where it does not,
accel warns loudly and records the precision actually used, so nothing trains fp32 under an "fp16"
label. fp8 training runs through torchao (:mod:`.fp8`): real fp8 GEMMs where the device has
them, torchao's emulation elsewhere, refused with one clear message where torchao is missing.

The package: the precision plan and autocast (here), fp8 through torchao (:mod:`.fp8`) and the
Accelerator's fp8 recipe attributes (:mod:`.fp8_handlers`). Accelerate's torchao and Transformer Engine
helpers keep their import paths (``accel.utils.ao``, ``accel.utils.transformer_engine``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..backends import Backend
from ..utils.dataclasses import AutocastKwargs, GradScalerKwargs, PrecisionType

logger = logging.getLogger(__name__)

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class MixedPrecisionFallbackWarning(UserWarning):
    """The requested mixed precision cannot run on this backend; training uses fp32 instead."""


@dataclass
class PrecisionPlan:
    """What was asked, what runs, and why."""

    requested: str
    used: str
    reason: str = ""
    autocast_kwargs: dict[str, Any] = field(default_factory=dict)
    scaler: torch.amp.GradScaler | None = None
    #: who runs the precision: "accel" (autocast + scaler here) or a strategy's engine ("deepspeed")
    managed_by: str = "accel"
    #: for fp8: the torchao plan (:class:`accel.precision.fp8.Fp8Plan`) and whether bf16 autocast runs around it
    fp8: Any = None
    fp8_autocast: bool = False

    @property
    def dtype(self) -> torch.dtype | None:
        if self.used == "fp8":
            return torch.bfloat16 if self.fp8_autocast else None
        return _DTYPES.get(self.used)

    @property
    def label(self) -> str:
        """What runs, as shown to people: the precision, or "fp8 (emulated)" where torchao emulates fp8 (a recipe's
        fp8 layers under another precision: "bf16 + fp8 layers")."""
        if self.fp8 is None:
            return self.used
        return self.fp8.label if self.used == "fp8" else f"{self.used} + {self.fp8.label} layers"

    @property
    def autocast_enabled(self) -> bool:
        return self.dtype is not None and self.autocast_kwargs.get("enabled", True)

    @property
    def fell_back(self) -> bool:
        return self.used != self.requested

    # ------------------------------------------------------------------ behaviour
    def convert_fp8(self, model: torch.nn.Module) -> None:
        """Give ``model`` torchao's ``Float8Linear`` layers when fp8 is planned and accel runs it (once; a no-op
        otherwise). Strategies that wrap a model's layers (FSDP) call this before wrapping."""
        if self.managed_by == "accel" and self.fp8 is not None:
            self.fp8.convert(model)

    def wrap_forward(self, model: torch.nn.Module, backend: Backend) -> None:
        """Convert ``model`` for fp8 (if planned), then run ``model.forward`` under autocast with fp32 outputs
        (once; nothing in full precision)."""
        self.convert_fp8(model)
        if self.managed_by != "accel" or not self.autocast_enabled or isinstance(model.forward, AutocastForward):
            return
        model.forward = AutocastForward(model.forward, lambda: autocast_context(self, backend))

    def adopt_parameters(self, optimizer: torch.optim.Optimizer) -> None:
        """Point ``optimizer`` at the parameters fp8 conversion put in place of the ones it was built with
        (torchao wraps weights for FSDP's float8 all-gather); nothing to do otherwise."""
        replaced = self.fp8.replaced if self.fp8 is not None else {}
        if not replaced:
            return
        for group in optimizer.param_groups:
            group["params"] = [replaced.get(p, p) for p in group["params"]]
        for old, new in replaced.items():
            if old in optimizer.state:
                optimizer.state[new] = optimizer.state.pop(old)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, through the grad scaler when fp16 needs one."""
        if self.scaler is not None:
            self.scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    def unscale_(self, optimizer: Any) -> None:
        """Divide the gradients of ``optimizer`` by the loss scale (before clipping); no-op without a scaler."""
        if self.scaler is None:
            return
        while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
            optimizer = optimizer.optimizer  # the scaler tracks the torch optimizer, not accel's wrapper
        self.scaler.unscale_(optimizer)


def plan_precision(
    requested: str | PrecisionType | None,
    backend: Backend,
    autocast_handler: AutocastKwargs | None = None,
    scaler_handler: GradScalerKwargs | None = None,
    fp8_handler: Any = None,
) -> PrecisionPlan:
    """Resolve ``requested`` against ``backend``; warn (never silently) on fallback.

    ``fp8_handler`` is the fp8 recipe (``AORecipeKwargs``; default: Accelerate's torchao defaults).
    """
    requested = str(requested or "no").lower()
    if requested not in PrecisionType.list():
        raise ValueError(f"mixed_precision must be one of {PrecisionType.list()}, got {requested!r}")
    if requested == "fp8":
        from .fp8 import plan_fp8

        fp8 = plan_fp8(backend, fp8_handler)  # UnsupportedFeatureError with the reason where it cannot run
        bf16 = backend.amp_capability(torch.bfloat16)
        autocast_kwargs = {"enabled": True}
        if autocast_handler is not None:
            autocast_kwargs.update(autocast_handler.to_kwargs())
        reason = f"{fp8.reason}; other layers under bf16 autocast" if bf16 else f"{fp8.reason}; no bf16 autocast ({bf16.reason})"
        return PrecisionPlan("fp8", "fp8", reason, autocast_kwargs, fp8=fp8, fp8_autocast=bool(bf16))
    if requested == "no":
        return PrecisionPlan("no", "no", "full precision requested")

    capability = backend.amp_capability(_DTYPES[requested])
    if not capability:
        message = (
            f"mixed_precision={requested!r} cannot run on backend {backend.name!r}: {capability.reason}. "
            f"Training runs in fp32 and is recorded as mixed_precision='no'."
        )
        warnings.warn(message, MixedPrecisionFallbackWarning, stacklevel=3)
        logger.warning(message)
        return PrecisionPlan(requested, "no", capability.reason)

    autocast_kwargs = {"enabled": True}
    if autocast_handler is not None:
        autocast_kwargs.update(autocast_handler.to_kwargs())
    plan = PrecisionPlan(requested, requested, capability.reason, autocast_kwargs)
    if requested == "fp16":
        scaler_kwargs = scaler_handler.to_kwargs() if scaler_handler is not None else {}
        plan.scaler = backend.grad_scaler(**scaler_kwargs)
    return plan


def with_recipe_layers(plan: PrecisionPlan, backend: Backend, fp8_handler: Any) -> PrecisionPlan:
    """``plan`` with the ``Float8Linear`` layers of a torchao recipe passed beside another ``mixed_precision``.

    Under FSDP and DeepSpeed Accelerate converts the model whenever a torchao recipe handler is passed, whatever
    ``mixed_precision`` says (elsewhere that is an error); the rest of the model keeps ``plan``'s precision.
    Only torchao recipes: Transformer Engine and MS-AMP recipes change nothing here (see the limits).
    """
    from .fp8 import fp8_backend_name, plan_fp8

    if fp8_handler is None or plan.used == "fp8" or fp8_backend_name(fp8_handler) != "AO":
        return plan
    plan.fp8 = plan_fp8(backend, fp8_handler)
    plan.reason = f"{plan.reason}; {plan.fp8.reason} (the recipe's layers, as Accelerate converts them)"
    return plan


def engine_managed_precision(requested: str | PrecisionType | None, engine: str, supported: Callable[[str], str | None]) -> PrecisionPlan:
    """A precision an engine (DeepSpeed) runs itself: no autocast wrapper, no scaler here.

    ``supported(dtype_name)`` returns None when the engine can run it, else the reason it cannot;
    an unsupported precision is an error, since the engine's config asked for it explicitly.
    """
    requested = str(requested or "no").lower()
    if requested not in PrecisionType.list():
        raise ValueError(f"mixed_precision must be one of {PrecisionType.list()}, got {requested!r}")
    if requested == "no":
        return PrecisionPlan("no", "no", "full precision requested", managed_by=engine)
    reason = supported(requested)
    if reason is not None:
        from ..backends import UnsupportedFeatureError

        raise UnsupportedFeatureError(engine, f"mixed_precision={requested!r}", reason)
    return PrecisionPlan(requested, requested, f"run by {engine}", managed_by=engine)


def autocast_context(plan: PrecisionPlan, backend: Backend, handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager:
    """Autocast for the planned dtype (a null context in full precision)."""
    if plan.dtype is None:
        return contextlib.nullcontext()
    kwargs = dict(plan.autocast_kwargs)
    if handler is not None:
        kwargs.update(handler.to_kwargs())
    enabled = kwargs.pop("enabled", True)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return backend.autocast(plan.dtype, enabled=enabled, **kwargs)


def _to_fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if isinstance(value, dict):
        return type(value)((k, _to_fp32(v)) for k, v in value.items()) if type(value) is dict else _map_mapping(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_to_fp32(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_fp32(v) for v in value)
    return value


def _map_mapping(value: Any) -> Any:
    for key in list(value.keys()):
        value[key] = _to_fp32(value[key])
    return value


class AutocastForward:
    """Replaces ``model.forward``: runs the original under autocast and returns fp32 outputs.

    A class (not a closure) so ``unwrap_model(keep_fp32_wrapper=False)`` can find and restore the
    original, and so the wrapped model still pickles.
    """

    def __init__(self, forward: Callable[..., Any], make_context: Callable[[], contextlib.AbstractContextManager]):
        self.original = forward
        self.make_context = make_context
        functools.update_wrapper(self, forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.make_context():
            out = self.original(*args, **kwargs)
        return _to_fp32(out)
