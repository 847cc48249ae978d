"""The strategy contract and the single-process strategy.

A strategy owns everything that differs between distribution schemes: joint setup of models,
optimizers and schedulers (``prepare`` hands it all of them at once, as DeepSpeed and FSDP need),
backward, gradient clipping, skipping gradient sync, unwrapping, state dicts and the parts of a
checkpoint it stores itself. The Accelerator only forwards to it and never branches on the
distributed type.

The contract is :class:`Strategy`: a subclass must say how it wraps, unwraps and recognises a model
and which ``DistributedType`` it runs as; everything else has a default that fits one process.
What only some strategies do is an override, not a flag: a strategy that stores models or optimizers
itself in a checkpoint (DeepSpeed's engine files, FSDP's DCP shards) overrides ``save_checkpoint`` /
``load_checkpoint`` and names what it stored; one whose ``get_state_dict`` is a collective (ZeRO-3,
FSDP) sets ``state_dict_is_collective``; one that runs the precision itself (DeepSpeed) overrides
``plan_precision``. Abilities the Accelerator asks about are answered here too, so it need not ask
the distributed type: ``supports_lomo`` (whether LOMO's fused backward may replace this strategy's),
``is_fsdp2`` (whether models are sharded with FSDP2, by :meth:`Strategy.shards_with_fsdp2`, which the
resolved plan asks as well). A strategy holds no reference to the Accelerator: it gets a
:class:`~accel.strategies.context.StrategyContext` when built and a
:class:`~accel.strategies.context.PreparedObjects` with every call that needs what was prepared.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from ..utils.dataclasses import DistributedType
from .context import EMPTY, PreparedObjects, StrategyContext


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
        """The manifest's ``strategy`` entry."""
        return {"name": self.name, "owns": list(self.owns), "files": list(self.files), **self.extra}


class Strategy(abc.ABC):
    """How one distribution scheme sets up and steps models, optimizers and schedulers."""

    name = "base"
    #: True where ``get_state_dict`` gathers shards: every rank must call it (save_model does)
    state_dict_is_collective = False
    #: whether the Accelerator's dynamo plugin compiles the prepared models (an engine may compile itself)
    compiles_models = True
    #: the engine wrapper of the last engine built (DeepSpeed), for ``Accelerator.deepspeed_engine_wrapped``
    engine_wrapper: Any = None
    #: whether ``Accelerator.backward(loss, learning_rate=...)`` may hand the loss to a prepared LOMO/AdaLomo
    #: optimizer's fused backward instead of this strategy's backward (not where an engine owns backward)
    supports_lomo = True

    def __init__(self, context: StrategyContext):
        self.context = context
        # read once: every training step uses them
        self.state = context.state
        self.gradient_state = context.gradient_state
        self.precision = context.precision
        self.backend = context.state.hardware_backend
        self.device: torch.device = context.state.device

    # ------------------------------------------------------------------ identity
    @property
    @abc.abstractmethod
    def distributed_type(self) -> DistributedType:
        """The ``DistributedType`` this strategy runs as (what ``AcceleratorState`` reports)."""

    def describe(self) -> str:
        """One line for ``accel env`` and ``Accelerator.state``."""
        return self.name

    @classmethod
    def shards_with_fsdp2(cls, fsdp_plugin: Any) -> bool:
        """Whether a run of this strategy with ``fsdp_plugin`` shards its models with FSDP2 (``fully_shard``).

        The one rule behind every ``is_fsdp2`` (the strategy's, the resolved plan's, the state's and the
        Accelerator's): never, except for the FSDP strategy, which overrides it.
        """
        return False

    @property
    def is_fsdp2(self) -> bool:
        """Whether this run shards its models with FSDP2 (``Accelerator.is_fsdp2`` asks this)."""
        return self.shards_with_fsdp2(getattr(self.state, "fsdp_plugin", None))

    @classmethod
    def plan_precision(cls, requested: str, backend: Any, *, deepspeed_plugin: Any = None, fsdp_plugin: Any = None,
                       autocast_handler: Any = None, scaler_handler: Any = None, fp8_handler: Any = None) -> Any:
        """The precision this strategy runs for ``requested`` on ``backend`` (accel's autocast + scaler by default).

        Called once per Accelerator by ``accel.resolve.resolve``, before the strategy is built.
        """
        from ..precision import plan_precision

        return plan_precision(requested, backend, autocast_handler, scaler_handler, fp8_handler=fp8_handler)

    # ------------------------------------------------------------------ setup
    def prepare(self, models: Sequence[torch.nn.Module], optimizers: Sequence[Any], schedulers: Sequence[Any],
                model_placement: Sequence[bool], optimizer_placement: Sequence[bool],
                evaluation_mode: bool = False, dataloaders: Sequence[Any] = (),
                prepared: PreparedObjects = EMPTY) -> tuple[list[Any], list[Any], list[Any]]:
        """Set up everything passed to one ``prepare`` call together; returns them in the same order.

        ``dataloaders`` are the (unprepared) data loaders of the same call, for strategies that size
        themselves from the batch size (DeepSpeed); ``prepared`` is what earlier calls prepared (a
        scheduler may belong to an optimizer prepared before).
        """
        before = [dict(m.named_parameters(remove_duplicate=False)) for m in models]
        prepared_models = [self.setup_model(m, p, evaluation_mode) for m, p in zip(models, model_placement)]
        replaced = _replaced_parameters(before, models)
        for optimizer in optimizers:
            _follow_replaced_parameters(optimizer, replaced)
        prepared_optimizers = [self.setup_optimizer(o, p) for o, p in zip(optimizers, optimizer_placement)]
        known = list(prepared.optimizers) + prepared_optimizers
        prepared_schedulers = [self.setup_scheduler(s, known) for s in schedulers]
        return prepared_models, prepared_optimizers, prepared_schedulers

    def adapt_dataloader(self, dataloader: Any) -> Any:
        """A data loader prepared in the same ``prepare`` call as a model, as that model reads it (itself by default;
        DeepSpeed Ulysses hands each rank its sequence shard)."""
        return dataloader

    def data_layout(self, mesh: Any, num_processes: int, process_index: int) -> tuple[int, int]:
        """(shards, this rank's shard) of the data under a ParallelismConfig's device mesh: ranks that share
        their tp and cp coordinates read the same batches."""
        from ..data_loader.layout import data_parallel_layout

        return data_parallel_layout(mesh, num_processes, process_index)

    def setup_model(self, model: torch.nn.Module, device_placement: bool, evaluation_mode: bool = False) -> torch.nn.Module:
        """Place the model, give it the precision's forward, and wrap it for this scheme."""
        if device_placement:
            model = model.to(self.device)
        self.precision.wrap_forward(model, self.backend)
        return model if evaluation_mode else self.wrap_model(model)

    @abc.abstractmethod
    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` wrapped for this scheme (DDP, FSDP, ...); the model itself where nothing wraps it."""

    def setup_optimizer(self, optimizer: Any, device_placement: bool) -> Any:
        """``optimizer`` wrapped so it steps only when gradients sync, through the precision's grad scaler."""
        from ..optimizer import AcceleratedOptimizer

        if isinstance(optimizer, AcceleratedOptimizer):
            optimizer = optimizer.optimizer
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not a torch optimizer; DummyOptim only works with DeepSpeed "
                            f"(this run uses the {self.name!r} strategy)")
        self.precision.adopt_parameters(optimizer)  # fp8 conversion may have replaced the model's parameters
        return AcceleratedOptimizer(optimizer, device_placement=device_placement, scaler=self.precision.scaler)

    def setup_scheduler(self, scheduler: Any, optimizers: Sequence[Any]) -> Any:
        """``scheduler`` wrapped to step with its optimizer (found among ``optimizers``), by Accelerate's rules."""
        from ..scheduler import AcceleratedScheduler

        owner = [opt for opt in optimizers if getattr(opt, "optimizer", opt) is getattr(scheduler, "optimizer", None)]
        return AcceleratedScheduler(
            scheduler,
            owner or list(optimizers),
            step_with_optimizer=self.context.step_scheduler_with_optimizer,
            split_batches=self.context.split_batches,
        )

    # ------------------------------------------------------------------ training step
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided for gradient accumulation and scaled by the precision."""
        steps = self.gradient_state.num_steps
        if steps > 1:
            loss = loss / steps
        self.precision.backward(loss, **kwargs)

    def unscale_gradients(self, optimizers: Iterable[Any]) -> None:
        """Divide the gradients of ``optimizers`` by the fp16 loss scale (a no-op without a scaler)."""
        for optimizer in optimizers:
            self.precision.unscale_(optimizer)

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2,
                        prepared: PreparedObjects = EMPTY) -> torch.Tensor | float | None:
        """Unscale the prepared optimizers' gradients, then clip ``parameters`` by their global norm; returns it."""
        self.unscale_gradients(prepared.optimizers)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float,
                         prepared: PreparedObjects = EMPTY) -> None:
        """Unscale the prepared optimizers' gradients, then clip each element to ``[-clip_value, clip_value]``."""
        self.unscale_gradients(prepared.optimizers)
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Skip the gradient reduction of ``model`` in this block (a null context without one)."""
        return contextlib.nullcontext()

    def trigger_sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Force gradient sync in the next backward even inside ``no_sync`` (a no-op without sync)."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ models and state
    @abc.abstractmethod
    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's model inside this strategy's wrapper (``model`` itself when not wrapped)."""

    @abc.abstractmethod
    def is_wrapped(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` is this strategy's wrapper."""

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True,
                       prepared: PreparedObjects = EMPTY) -> dict[str, torch.Tensor]:
        """The full state dict. Where ``state_dict_is_collective``, every rank must call this."""
        target = self.unwrap_model(model) if unwrap else model
        from ..utils.modeling import get_state_dict_offloaded_model, has_offloaded_params

        if any(has_offloaded_params(m) for m in target.modules()):
            # big-model hooks keep weights on the meta device: read them back from where they were offloaded
            return get_state_dict_offloaded_model(target)
        return target.state_dict()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, output_dir: Path, prepared: PreparedObjects, **kwargs: Any) -> StrategyCheckpoint | None:
        """Write what this strategy stores itself (called on every rank); None: nothing."""
        return None

    def load_checkpoint(self, input_dir: Path, saved: dict[str, Any], prepared: PreparedObjects, **kwargs: Any) -> None:
        """Restore what ``save_checkpoint`` wrote (called on every rank)."""

    def release(self) -> None:
        """Drop engines and references (``Accelerator.free_memory``)."""

    # ------------------------------------------------------------------ parallelism config
    def settle_parallelism_config(self) -> None:
        """Check the run's ``ParallelismConfig`` against the process count (called once, after the strategy is built)."""
        config = self.state.parallelism_config
        if config is not None:
            validate_parallelism_config(config, self.state, is_fsdp2=self.is_fsdp2)


def validate_parallelism_config(config: Any, state: Any, *, is_fsdp2: bool) -> None:
    """Check ``config`` against the run ``state`` describes (sizes multiply to the process count, FSDP2 has a
    dimension to shard, ...); ``is_fsdp2`` is the strategy's answer."""
    from types import SimpleNamespace

    # ParallelismConfig's check takes Accelerate's accelerator; these are the attributes it reads
    run = SimpleNamespace(state=state, num_processes=state.num_processes, is_main_process=state.is_main_process,
                          is_fsdp2=is_fsdp2)
    config._validate_accelerator(run)


class SingleDeviceStrategy(Strategy):
    """One process: the model stays as it is."""

    name = "single"

    @property
    def distributed_type(self) -> DistributedType:
        """``NO``: one process."""
        return DistributedType.NO

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model itself: nothing wraps it."""
        return model

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model itself."""
        return model

    def is_wrapped(self, model: torch.nn.Module) -> bool:
        """Never: nothing wraps a model here."""
        return False


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
