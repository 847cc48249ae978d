"""The strategy interface and the single-process strategy.

A strategy owns everything that differs between distribution schemes: joint setup of models,
optimizers and schedulers (``prepare`` hands it all of them at once, as DeepSpeed and FSDP need),
backward, gradient clipping, skipping gradient sync, unwrapping, state dicts and the parts of a
checkpoint it stores itself. The Accelerator facade only forwards to it; it never branches on the
distributed type.

Optional abilities are small mixins (Lightning's pattern) rather than flags: a strategy whose
``get_state_dict`` is a collective (ZeRO-3, FSDP) sets ``state_dict_is_collective``; one that stores
models/optimizers itself in a checkpoint (DeepSpeed's engine files, FSDP's DCP shards) overrides
``save_checkpoint`` / ``load_checkpoint`` and names what it stored.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import torch

from ..utils.dataclasses import DistributedType

if TYPE_CHECKING:  # pragma: no cover
    from ..accelerator import Accelerator


@dataclass
class StrategyCheckpoint:
    """What a strategy wrote into a checkpoint itself; recorded in the manifest under ``strategy``.

    ``owns`` lists the object kinds (``"models"``, ``"optimizers"``, ``"schedulers"``) the generic
    checkpoint code must not write or read, because the strategy's own files hold them.
    """

    name: str
    owns: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_manifest(self) -> dict[str, Any]:
        return {"name": self.name, "owns": list(self.owns), "files": list(self.files), **self.extra}


class Strategy:
    """How one distribution scheme sets up and steps models, optimizers and schedulers."""

    name = "base"
    #: True where ``get_state_dict`` gathers shards: every rank must call it (save_model does)
    state_dict_is_collective = False
    #: whether the Accelerator's dynamo plugin compiles the prepared models (an engine may compile itself)
    compiles_models = True

    def __init__(self, accelerator: "Accelerator"):
        # a weak reference: the Accelerator owns its strategy, and a cycle would keep both (and every
        # prepared loader) alive until the garbage collector runs
        self._accelerator = weakref.ref(accelerator)

    def __getstate__(self) -> dict[str, Any]:
        # a weak reference does not pickle; the Accelerator re-attaches itself when it is unpickled
        state = self.__dict__.copy()
        state["_accelerator"] = None
        return state

    def _attach(self, accelerator: "Accelerator") -> None:
        self._accelerator = weakref.ref(accelerator)

    @property
    def accelerator(self) -> "Accelerator":
        accelerator = self._accelerator() if self._accelerator is not None else None
        if accelerator is None:
            raise RuntimeError("the Accelerator this strategy belonged to no longer exists")
        return accelerator

    # ------------------------------------------------------------------ context
    @property
    def state(self) -> Any:
        return self.accelerator.state

    @property
    def precision(self) -> Any:
        return self.accelerator.precision

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def distributed_type(self) -> DistributedType:
        """The ``DistributedType`` this strategy runs as (what ``AcceleratorState`` reports)."""
        return DistributedType.NO

    def describe(self) -> str:
        """One line for ``accel env`` and ``Accelerator.state``."""
        return self.name

    def plan_precision(self, requested: str, autocast_handler: Any = None, scaler_handler: Any = None) -> Any:
        """The precision this strategy runs for ``requested`` (accel's autocast + scaler by default)."""
        from ..precision import plan_precision

        return plan_precision(requested, self.accelerator.backend, autocast_handler, scaler_handler,
                              fp8_handler=getattr(self.accelerator, "fp8_recipe_handler", None))

    # ------------------------------------------------------------------ setup
    def prepare(self, models: Sequence[torch.nn.Module], optimizers: Sequence[Any], schedulers: Sequence[Any],
                model_placement: Sequence[bool], optimizer_placement: Sequence[bool],
                evaluation_mode: bool = False, dataloaders: Sequence[Any] = ()) -> tuple[list[Any], list[Any], list[Any]]:
        """Set up everything passed to one ``prepare`` call together; returns them in the same order.

        ``dataloaders`` are the (unprepared) data loaders of the same call, for strategies that size
        themselves from the batch size (DeepSpeed).
        """
        before = [dict(m.named_parameters(remove_duplicate=False)) for m in models]
        prepared_models = [self.setup_model(m, p, evaluation_mode) for m, p in zip(models, model_placement)]
        replaced = _replaced_parameters(before, models)
        for optimizer in optimizers:
            _follow_replaced_parameters(optimizer, replaced)
        prepared_optimizers = [self.setup_optimizer(o, p) for o, p in zip(optimizers, optimizer_placement)]
        known = list(self.accelerator._optimizers) + prepared_optimizers
        prepared_schedulers = [self.setup_scheduler(s, known) for s in schedulers]
        return prepared_models, prepared_optimizers, prepared_schedulers

    def setup_model(self, model: torch.nn.Module, device_placement: bool, evaluation_mode: bool = False) -> torch.nn.Module:
        """Place the model, give it the precision's forward, and wrap it for this scheme."""
        if device_placement:
            model = model.to(self.device)
        self.precision.wrap_forward(model, self.accelerator.backend)
        return model if evaluation_mode else self.wrap_model(model)

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def setup_optimizer(self, optimizer: Any, device_placement: bool) -> Any:
        from ..optimizer import AcceleratedOptimizer

        if isinstance(optimizer, AcceleratedOptimizer):
            optimizer = optimizer.optimizer
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not a torch optimizer; DummyOptim only works with DeepSpeed "
                            f"(this run uses the {self.name!r} strategy)")
        self.precision.adopt_parameters(optimizer)  # fp8 conversion may have replaced the model's parameters
        return AcceleratedOptimizer(optimizer, device_placement=device_placement, scaler=self.precision.scaler)

    def setup_scheduler(self, scheduler: Any, optimizers: Sequence[Any]) -> Any:
        from ..scheduler import AcceleratedScheduler

        owner = [opt for opt in optimizers if getattr(opt, "optimizer", opt) is getattr(scheduler, "optimizer", None)]
        return AcceleratedScheduler(
            scheduler,
            owner or list(optimizers),
            step_with_optimizer=self.accelerator.step_scheduler_with_optimizer,
            split_batches=self.accelerator.split_batches,
        )

    # ------------------------------------------------------------------ training step
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided for gradient accumulation and scaled by the precision."""
        steps = self.accelerator.gradient_accumulation_steps
        if steps > 1:
            loss = loss / steps
        self.precision.backward(loss, **kwargs)

    def unscale_gradients(self, optimizers: Iterable[Any]) -> None:
        for optimizer in optimizers:
            self.precision.unscale_(optimizer)

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2) -> torch.Tensor | float | None:
        self.unscale_gradients(self.accelerator._optimizers)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        self.unscale_gradients(self.accelerator._optimizers)
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def trigger_sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Force gradient sync in the next backward even inside ``no_sync`` (a no-op without sync)."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ models and state
    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def is_wrapped(self, model: torch.nn.Module) -> bool:
        return False

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The full state dict. Where ``state_dict_is_collective``, every rank must call this."""
        target = self.unwrap_model(model) if unwrap else model
        from ..utils.modeling import get_state_dict_offloaded_model, has_offloaded_params

        if any(has_offloaded_params(m) for m in target.modules()):
            # big-model hooks keep weights on the meta device: read them back from where they were offloaded
            return get_state_dict_offloaded_model(target)
        return target.state_dict()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, output_dir: Path, **kwargs: Any) -> StrategyCheckpoint | None:
        """Write what this strategy stores itself (called on every rank); None: nothing."""
        return None

    def load_checkpoint(self, input_dir: Path, saved: dict[str, Any], **kwargs: Any) -> None:
        """Restore what ``save_checkpoint`` wrote (called on every rank)."""

    def release(self) -> None:
        """Drop engines and references (``Accelerator.free_memory``)."""


class SingleDeviceStrategy(Strategy):
    """One process: the model stays as it is."""

    name = "single"


def _replaced_parameters(before: Sequence[dict[str, torch.nn.Parameter]],
                         models: Sequence[torch.nn.Module]) -> dict[torch.nn.Parameter, torch.nn.Parameter]:
    """Old -> new for the parameters that placing the models replaced instead of moving in place.

    ``Module.to`` keeps a parameter object only when host and device tensors are shallow-copy
    compatible (cpu, cuda, xpu, mps, hpu); for other devices (PrivateUse1 devices, XLA) it puts new
    parameter objects in, and an optimizer built before ``prepare`` would keep updating the old ones.
    """
    replaced: dict[torch.nn.Parameter, torch.nn.Parameter] = {}
    for names, model in zip(before, models):
        after = dict(model.named_parameters(remove_duplicate=False))
        for name, old in names.items():
            new = after.get(name)
            if new is not None and new is not old:
                replaced.setdefault(old, new)
    return replaced


def _follow_replaced_parameters(optimizer: Any, replaced: dict[torch.nn.Parameter, torch.nn.Parameter]) -> None:
    """Point ``optimizer`` (and its state) at the replacements of the parameters it was built with."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if not replaced or not isinstance(inner, torch.optim.Optimizer):
        return
    for group in inner.param_groups:
        group["params"] = [replaced.get(p, p) for p in group["params"]]
    for old, new in replaced.items():
        if old in inner.state:
            inner.state[new] = inner.state.pop(old)
