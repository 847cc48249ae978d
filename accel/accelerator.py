"""The Accelerator facade: Accelerate's training API over accel's state, strategies and precision.

This module only wires parts together. Distribution lives in ``accel.strategies``, precision in
``accel.precision``, data sharding in ``accel.data_loader``, collectives in
``accel.utils.operations``, checkpoints in ``accel.checkpointing``, trackers in ``accel.tracking``;
the Accelerator's own jobs in ``accel.facade``: what ``prepare`` does with each object (``preparation``),
compiling and unwrapping models (``model_wrappers``), uneven inputs (``uneven_inputs``), the
context-parallel block (``context_parallel``) and the constructor's option checks (``options``).
Parts only some runs use are imported where they are used, so importing the Accelerator stays cheap.
"""

from __future__ import annotations

import contextlib
import operator
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from .backends import is_host_device
from .facade.accumulation import accumulation_block, advance
from .facade.delegates import AcceleratorIOMixin
from .facade.options import accumulation_plugin, sort_kwargs_handlers
from .facade.preparation import PreparedRegistry, prepare_objects
from .resolve import strategy_class
from .state import AcceleratorState, GradientState, PartialState
from .launch import heartbeat
from .utils.dataclasses import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProjectConfiguration,
    RNGType,
)

if TYPE_CHECKING:
    from .optimizer import AcceleratedOptimizer
    from .scheduler import AcceleratedScheduler

#: availability probes that are names of this module, as in Accelerate (its tests patch
#: ``accelerate.accelerator.is_xpu_available``); loaded on first use to keep the import cheap
_MODULE_PROBES = ("is_bitsandbytes_multi_backend_available", "is_xpu_available")


def __getattr__(name: str) -> Any:
    if name in _MODULE_PROBES:
        from .utils import imports

        return getattr(imports, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _quantized_offload_supported() -> bool:
    """Whether bitsandbytes' multi-backend build or an XPU handles an 8/4-bit model's offloaded modules,
    asked through this module's names (so a patch of them applies)."""
    module = sys.modules[__name__]
    return module.is_bitsandbytes_multi_backend_available() or module.is_xpu_available()

_UNSET: Any = object()


def _forward(path: str, doc: str, writable: bool = False) -> property:
    """A property reading ``self.<path>`` (and with ``writable``, setting it): a value the Accelerator passes
    through from its state or configuration, documented by ``doc``."""
    owner, _, name = path.rpartition(".")
    setter = None
    if writable:
        get_owner = operator.attrgetter(owner)

        def setter(self: Any, value: Any) -> None:
            setattr(get_owner(self), name, value)
    return property(operator.attrgetter(path), setter, doc=doc)


class Accelerator(AcceleratorIOMixin):
    """Prepare a model, optimizer, data loaders and schedulers for any backend and process count."""

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = _UNSET,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        rng_types: list[str | RNGType] | None = None,
        log_with: Any = None,
        project_dir: str | os.PathLike | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: Any = None,
        dynamo_plugin: Any = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
    ):
        if deepspeed_plugin is not None and deepspeed_plugins is not None:
            raise ValueError("pass deepspeed_plugin or deepspeed_plugins, not both")
        if dynamo_backend is not None and dynamo_plugin is not None:
            raise ValueError("pass dynamo_backend or dynamo_plugin, not both")
        from .utils.dataclasses import TorchDynamoPlugin

        # unset: ACCELERATE_DYNAMO_* from the launcher, else no compilation
        dynamo_plugin = dynamo_plugin or TorchDynamoPlugin(backend=dynamo_backend)

        self.project_configuration = project_config or ProjectConfiguration()
        if project_dir is not None:
            self.project_configuration.set_directories(os.fspath(project_dir))

        handlers = sort_kwargs_handlers(kwargs_handlers or [])
        self.ddp_handler: DistributedDataParallelKwargs | None = handlers.get(DistributedDataParallelKwargs)
        self.scaler_handler: GradScalerKwargs | None = handlers.get(GradScalerKwargs)
        self.autocast_handler: AutocastKwargs | None = handlers.get(AutocastKwargs)
        self.init_handler: InitProcessGroupKwargs | None = handlers.get(InitProcessGroupKwargs)
        self.profile_handler = next((h for k, h in handlers.items() if k.__name__ == "ProfileKwargs"), None)
        recipe = next((h for k, h in handlers.items() if "Recipe" in k.__name__), None)

        self.dataloader_config = dataloader_config or DataLoaderConfiguration()
        if split_batches is not _UNSET:
            warnings.warn("Accelerator(split_batches=...) is deprecated; pass DataLoaderConfiguration(split_batches=...)",
                          FutureWarning, stacklevel=2)
            self.dataloader_config.split_batches = bool(split_batches)
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.rng_types = [RNGType(r) for r in rng_types] if rng_types is not None else [RNGType.GENERATOR]

        # backend, strategy and precision are resolved once (accel.resolve), and the state keeps the result
        init_kwargs = self.init_handler.to_kwargs() if self.init_handler is not None else {}
        self.state = AcceleratorState(
            mixed_precision=mixed_precision, cpu=cpu, deepspeed_plugin=deepspeed_plugins or deepspeed_plugin,
            fsdp_plugin=fsdp_plugin, torch_tp_plugin=torch_tp_plugin, megatron_lm_plugin=megatron_lm_plugin,
            parallelism_config=parallelism_config, dynamo_plugin=dynamo_plugin, _from_accelerator=True,
            _precision_handlers={"autocast_handler": self.autocast_handler, "scaler_handler": self.scaler_handler,
                                 "fp8_handler": recipe},
            **init_kwargs,
        )
        plan = self.state.run_plan
        # Accelerate's fp8 attributes (one per recipe kind, the backend, whether TE's autocast is delayed)
        from .precision.fp8_handlers import delays_fp8_autocast, fp8_handlers

        fp8 = fp8_handlers(handlers, fp8_enabled=mixed_precision == "fp8" or self.state.mixed_precision == "fp8")
        (self.fp8_recipe_handler, self.ao_recipe_handler, self.te_recipe_handler, self.msamp_recipe_handler,
         self.has_fp8_handler, self.fp8_enabled) = fp8
        self.delayed_fp8_autocast = fp8.has_fp8_handler and delays_fp8_autocast(self.fp8_backend, self.distributed_type)
        self.backend = self.state.hardware_backend
        self.gradient_state = GradientState(accumulation_plugin(gradient_accumulation_steps, gradient_accumulation_plugin))
        # what runs, not just what was asked: a fallback was warned about and recorded by the resolution
        self.precision = plan.precision
        self.scaler = self.precision.scaler
        self.native_amp = self.precision.dtype is not None

        # the strategy owns distribution; it gets what it needs now and what was prepared with each call
        from .strategies.context import StrategyContext

        self.strategy = strategy_class(plan.strategy)(StrategyContext(
            state=self.state, gradient_state=self.gradient_state, precision=self.precision,
            dataloader_config=self.dataloader_config, step_scheduler_with_optimizer=step_scheduler_with_optimizer,
            ddp_kwargs=self.ddp_handler,
        ))
        self.strategy.settle_parallelism_config()
        from .precision import PrecisionPlan
        from .strategies.base import Strategy

        # whether backward is the strategy's and precision's plain one (no engine, no override): then a step
        # without a scaler or accumulation is just loss.backward(), without the two calls in between
        self._plain_backward = (type(self.strategy).backward is Strategy.backward
                                and type(self.precision).backward is PrecisionPlan.backward)

        self.step = 0
        self.flag_tensor: torch.Tensor | None = None
        # what was prepared, under Accelerate's attribute names (the registry's lists themselves)
        self._prepared = PreparedRegistry()
        self._models: list[torch.nn.Module] = self._prepared.models
        self._optimizers: list[AcceleratedOptimizer] = self._prepared.optimizers
        self._schedulers: list[AcceleratedScheduler] = self._prepared.schedulers
        self._dataloaders: list[Any] = self._prepared.dataloaders
        self._custom_objects: list[Any] = self._prepared.custom_objects
        self._save_model_state_pre_hook: dict[int, Callable[..., None]] = {}
        self._load_model_state_pre_hook: dict[int, Callable[..., None]] = {}

        if log_with is not None:  # fail at construction on every rank, like Accelerate
            from .tracking import filter_trackers

            log_with = filter_trackers(log_with, self.logging_dir)
        self.log_with = log_with
        self.trackers: list[Any] = []

    # ------------------------------------------------------------------ state passthrough
    device = _forward("state.device",
                      "The device this process trains on (from the active backend, or ``ACCELERATE_TORCH_DEVICE``).")
    distributed_type = _forward("state.distributed_type", "How processes are organised (``NO``, ``MULTI_CPU``, "
                                "``MULTI_GPU``, ``DEEPSPEED``, ``FSDP``, ...).")
    num_processes = _forward("state.num_processes", "How many processes take part in the run.")
    process_index = _forward("state.process_index", "This process's global rank.")
    local_process_index = _forward("state.local_process_index", "This process's rank on its node.")
    is_main_process = _forward("state.is_main_process", "Whether this is global rank 0.")
    is_local_main_process = _forward("state.is_local_main_process", "Whether this is rank 0 on its node.")
    is_last_process = _forward("state.is_last_process", "Whether this is the process with the highest rank.")
    use_distributed = _forward("state.use_distributed", "Whether several processes run with a process group.")
    mixed_precision = _forward("precision.used",
                               "The precision really used (after any fallback); see ``precision.requested``.")
    # data loading, as set by the DataLoaderConfiguration
    split_batches = _forward("dataloader_config.split_batches",
                             "Whether the loader's batch size is the global one, split over processes.")
    dispatch_batches = _forward("dataloader_config.dispatch_batches",
                                "Whether the main process reads batches and sends each process its slice.")
    even_batches = _forward("dataloader_config.even_batches",
                            "Whether the last batches are padded so every process gets the same number.", writable=True)
    use_seedable_sampler = _forward("dataloader_config.use_seedable_sampler",
                                    "Whether shuffling samplers are seeded per epoch (reproducible across resumes).")
    non_blocking = _forward("dataloader_config.non_blocking",
                            "Whether batches are copied to the device with ``non_blocking=True``.")
    use_stateful_dataloader = _forward("dataloader_config.use_stateful_dataloader",
                                       "Whether prepared loaders are torchdata ``StatefulDataLoader`` (mid-epoch position in "
                                       "checkpoints).")
    # the project's folders, as set by the ProjectConfiguration
    project_dir = _forward("project_configuration.project_dir", "The project folder "
                           "(``ProjectConfiguration.project_dir``), used by automatic checkpoint naming.")
    logging_dir = _forward("project_configuration.logging_dir",
                           "Where trackers write (``ProjectConfiguration.logging_dir``).")
    save_iteration = _forward("project_configuration.iteration",
                              "The number the next automatically named checkpoint gets.")
    sync_gradients = _forward("gradient_state.sync_gradients",
                              "Whether this step synchronises gradients (False while accumulating).", writable=True)

    @property
    def multi_device(self) -> bool:
        """Whether several processes run on accelerator devices (not the CPU)."""
        return self.use_distributed and not is_host_device(self.device)

    @property
    def gradient_accumulation_steps(self) -> int:
        """Batches whose gradients add up before one optimizer step."""
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.plugin_kwargs.update({"num_steps": steps})

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 overflow)."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    # process control, as in PartialState
    def wait_for_everyone(self) -> None:
        """Barrier: wait until every process reaches this point."""
        self.state.wait_for_everyone()

    def main_process_first(self):
        """Context manager: the main process runs the block first, then the others (download once)."""
        return self.state.main_process_first()

    def local_main_process_first(self):
        """Context manager: the local main process runs the block first, then the others on its node."""
        return self.state.local_main_process_first()

    def split_between_processes(self, inputs: Any, apply_padding: bool = False):
        """Context manager yielding this process's share of ``inputs``."""
        return self.state.split_between_processes(inputs, apply_padding=apply_padding)

    def on_main_process(self, function: Callable[..., Any] | None = None):
        """Decorator: run the function only on the main process."""
        return PartialState().on_main_process(function)

    def on_local_main_process(self, function: Callable[..., Any] | None = None):
        """Decorator: run the function only on each node's main process."""
        return PartialState().on_local_main_process(function)

    def on_last_process(self, function: Callable[..., Any]):
        """Decorator: run the function only on the last process."""
        return PartialState().on_last_process(function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None):
        """Decorator: run the function only on the given global rank."""
        return PartialState().on_process(function, process_index=process_index)

    def on_local_process(self, function: Callable[..., Any] | None = None, local_process_index: int | None = None):
        """Decorator: run the function only on the given local rank."""
        return PartialState().on_local_process(function, local_process_index=local_process_index)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        self.state.print(*args, **kwargs)

    # ------------------------------------------------------------------ prepare
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and schedulers (in any order); others pass through.

        Data loaders are prepared first; models, optimizers and schedulers of one call then go to the
        strategy together (DeepSpeed and FSDP set them up jointly), which may then adapt the call's
        loaders to its models (DeepSpeed Ulysses shards their sequences). An object prepared before is
        returned as it is.
        """
        from .facade.model_wrappers import compile_model, may_place_model, refuse_device_mapped_model

        for obj in args:
            refuse_device_mapped_model(obj, self.distributed_type)
        result = prepare_objects(
            args, device_placement, default_placement=self.device_placement, registry=self._prepared,
            strategy=self.strategy, scaler=self.scaler, prepare_loader=self.prepare_data_loader,
            place_model=lambda model: may_place_model(model, _quantized_offload_supported),
            compile_model=lambda model: compile_model(model, self.state.dynamo_plugin, self.strategy, stacklevel=4))
        return result[0] if len(result) == 1 else tuple(result)

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False) -> torch.nn.Module:
        """Prepare one model (``evaluation_mode``: placed and given the precision's forward, not wrapped)."""
        from .facade.model_wrappers import compile_model, may_place_model, refuse_device_mapped_model

        if getattr(model, "_is_accelerate_prepared", False):
            self._prepared.register(model)
            return model
        refuse_device_mapped_model(model, self.distributed_type)
        placement = self.device_placement if device_placement is None else device_placement
        placement = placement and may_place_model(model, _quantized_offload_supported)
        (prepared,), _, _ = self.strategy.prepare([model], [], [], model_placement=[placement], optimizer_placement=[],
                                                   evaluation_mode=evaluation_mode)
        return self._prepared.add("model", compile_model(prepared, self.state.dynamo_plugin, self.strategy))

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None) -> AcceleratedOptimizer:
        """Prepare one optimizer: it steps only when gradients are synchronised, through the grad scaler."""
        if getattr(optimizer, "_is_accelerate_prepared", False):
            self._prepared.register(optimizer)
            return optimizer
        placement = self.device_placement if device_placement is None else device_placement
        _, (prepared,), _ = self.strategy.prepare([], [optimizer], [], model_placement=[], optimizer_placement=[placement])
        return self._prepared.add("optimizer", prepared)

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Prepare one LR scheduler: it steps with its optimizer, ``num_processes`` times per step."""
        if getattr(scheduler, "_is_accelerate_prepared", False):
            self._prepared.register(scheduler)
            return scheduler
        _, _, (prepared,) = self.strategy.prepare([], [], [scheduler], model_placement=[], optimizer_placement=[],
                                                  prepared=self.prepared_objects())
        return self._prepared.add("scheduler", prepared)

    def prepare_data_loader(self, data_loader: torch.utils.data.DataLoader, device_placement: bool | None = None,
                            slice_fn_for_dispatch: Callable[..., Any] | None = None) -> Any:
        """Shard a data loader over the processes (or dispatch from the main one) and move batches to the device."""
        from .data_loader.prepare import shard_data_loader

        if device_placement is None:
            device_placement = self.device_placement
        cfg = self.dataloader_config
        mesh = getattr(self, "torch_device_mesh", None)
        # the strategy says which ranks read the same data under a device mesh
        shards, shard = ((self.num_processes, self.process_index) if mesh is None
                         else self.strategy.data_layout(mesh, self.num_processes, self.process_index))
        prepared = shard_data_loader(
            data_loader, self.device, shards, shard,
            split_batches=cfg.split_batches, put_on_device=device_placement, rng_types=list(self.rng_types),
            dispatch_batches=cfg.dispatch_batches, even_batches=cfg.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch, use_seedable_sampler=cfg.use_seedable_sampler,
            data_seed=cfg.data_seed, non_blocking=cfg.non_blocking, use_stateful_dataloader=cfg.use_stateful_dataloader,
            torch_device_mesh=mesh,
        )
        return self._prepared.add("dataloader", prepared)

    # ------------------------------------------------------------------ training step
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()`` for this strategy: divided for accumulation, scaled for fp16, or the engine's."""
        if heartbeat.active:  # a progress point for accel launch's hang watchdog (every rank passes it alike)
            heartbeat.beat()
        if not kwargs:
            # the usual step: no scaler, no accumulation, the strategy's and precision's backward the plain one
            # ``plugin_kwargs`` read directly: the ``num_steps`` property costs more than the rest together
            if (self._plain_backward and self.precision.scaler is None
                    and (self.gradient_state.plugin_kwargs.get("num_steps") or 1) == 1):
                loss.backward()
                return
        elif (kwargs.get("learning_rate") is not None and self.scaler is None
              and self.strategy.supports_lomo and self.has_lomo_optimizer):
            steps = self.gradient_accumulation_steps
            self.lomo_backward(loss / steps if steps > 1 else loss, kwargs["learning_rate"])
            return
        self.strategy.backward(loss, **kwargs)

    @property
    def has_lomo_optimizer(self) -> bool:
        """Whether a LOMO or AdaLomo optimizer (``lomo_optim``) was prepared: ``backward(loss,
        learning_rate=...)`` then runs their fused backward."""
        from .facade.lomo import is_lomo_optimizer

        return any(is_lomo_optimizer(optimizer) for optimizer in self._optimizers)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """The fused backward of the prepared LOMO/AdaLomo optimizers, which update the weights as they go."""
        from .facade.lomo import lomo_backward

        lomo_backward(self._optimizers, loss, learning_rate)

    def _do_sync(self) -> None:
        """Count one more batch and set whether its backward synchronises gradients (Accelerate's name)."""
        self.step = advance(self.step, self.gradient_state)

    def accumulate(self, *models: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Accumulate gradients over ``gradient_accumulation_steps`` batches; sync on the last one.

        Called each step: the step count advances when this is called, and the block runs without
        gradient sync (``no_sync`` on each model) except on the synchronising step.
        """
        self._do_sync()
        return accumulation_block(models, self.gradient_state, self.no_sync)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Skip the gradient all-reduce for this block (a no-op on one process)."""
        return self.strategy.no_sync(model)

    def trigger_sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Make the next backward synchronise gradients even inside ``no_sync`` (a context manager)."""
        return self.strategy.trigger_sync_in_backward(model)

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide gradients by the fp16 loss scale now (before inspecting or clipping them)."""
        optimizers = self._optimizers if optimizer is None else (optimizer if isinstance(optimizer, (list, tuple)) else [optimizer])
        self.strategy.unscale_gradients(optimizers)

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2) -> Any:
        """Clip gradients by global norm (after unscaling); returns the norm. DeepSpeed clips in its step."""
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type=norm_type, prepared=self.prepared_objects())

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """Clip every gradient element to ``[-clip_value, clip_value]`` (after unscaling)."""
        self.strategy.clip_grad_value_(parameters, clip_value, prepared=self.prepared_objects())

    @contextlib.contextmanager
    def profile(self, profile_handler: Any = None):
        """Run the block under ``torch.profiler`` (``ProfileKwargs``); yields the profiler.

        With ``output_trace_dir`` every process writes ``profile_<rank>.json`` (a Chrome trace) there.
        """
        from .utils.dataclasses import ProfileKwargs

        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with handler.build() as profiler:
            yield profiler
        if handler.output_trace_dir is not None:
            os.makedirs(handler.output_trace_dir, exist_ok=True)
            profiler.export_chrome_trace(os.path.join(handler.output_trace_dir, f"profile_{self.process_index}.json"))
        self.wait_for_everyone()

    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager:
        """Autocast for the precision really in use (a null context in full precision)."""
        from .precision import autocast_context

        return autocast_context(self.precision, self.backend, autocast_handler or self.autocast_handler)

    # ------------------------------------------------------------------ FSDP and ParallelismConfig
    @property
    def is_fsdp2(self) -> bool:
        """True when this run shards with FSDP2 (``fully_shard``), as the strategy answers."""
        return self.strategy.is_fsdp2

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """Whether FSDP2-style composable parallelism (DTensor meshes) is in use."""
        return self.is_fsdp2

    parallelism_config = _forward("state.parallelism_config", "The ``ParallelismConfig`` of this run, or None.")
    deepspeed_plugin = _forward("state.deepspeed_plugin", "The active ``DeepSpeedPlugin`` (the selected one of "
                                "several), or None without DeepSpeed.")

    @property
    def fp8_backend(self) -> Any:
        """The fp8 library configured for training (``FP8BackendType``: ``AO``, ``TE``, ``MSAMP`` or ``NO``)."""
        from .precision.fp8_handlers import Fp8Handlers, fp8_backend_of

        fp8 = Fp8Handlers(self.fp8_recipe_handler, self.ao_recipe_handler, self.te_recipe_handler,
                          self.msamp_recipe_handler, self.has_fp8_handler, self.fp8_enabled)
        return fp8_backend_of(fp8, self.state.deepspeed_plugin)

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` was spread over several devices by a device map (such a model is not trained
        in a distributed run: ``prepare`` refuses it)."""
        from .facade.model_wrappers import has_device_map

        return has_device_map(model)

    @property
    def torch_device_mesh(self) -> Any:
        """The DeviceMesh of the ParallelismConfig (built on the backend's device type on first use), or None."""
        config = self.parallelism_config
        if config is None:
            return None
        if config.device_mesh is None and self.use_distributed:
            config.get_device_mesh(self.backend.device_type)
        return config.device_mesh

    @property
    def should_save_model(self) -> bool:
        """Whether this rank takes part in saving the model (every rank does; writing is rank 0's)."""
        return True if self.parallelism_config is not None else self.is_local_main_process

    def _mesh_rank(self, dim: str, enabled: str, what: str) -> int:
        """This rank's index along mesh dimension ``dim`` (0 when the config's ``enabled`` flag is off)."""
        config = self.parallelism_config
        if config is None:
            raise RuntimeError(f"{what} is not configured. Set `parallelism_config` first.")
        return self.torch_device_mesh.get_local_rank(dim) if getattr(config, enabled) else 0

    @property
    def tensor_parallel_rank(self) -> int:
        """This rank's index in its tensor parallel group (0 when tp_size is 1)."""
        return self._mesh_rank("tp", "tp_enabled", "Tensor parallelism")

    @property
    def pipeline_parallel_rank(self) -> int:
        """Pipeline parallelism is not supported (as in Accelerate)."""
        raise NotImplementedError("Pipeline parallelism is currently not supported in Accelerate.")

    @property
    def context_parallel_rank(self) -> int:
        """Context parallelism ranks are not exposed (as in Accelerate)."""
        raise NotImplementedError("Context parallelism is currently not supported in Accelerate.")

    @property
    def data_parallel_rank(self) -> int:
        """This rank's index among the data-parallel replicas (dp_replicate; 0 when not replicated)."""
        return self._mesh_rank("dp_replicate", "dp_replicate_enabled", "Data parallelism")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This rank's index inside its shard group (dp_shard; 0 when not sharded)."""
        return self._mesh_rank("dp_shard", "dp_shard_enabled", "Shard-based data parallelism")

    def deepspeed_ulysses_dl_adapter(self, dl: Any, model: torch.nn.Module) -> Any:
        """``dl`` sharded along its sequences for DeepSpeed Ulysses (``dl`` itself when ``sp_size`` is 1).

        For a loader prepared apart from the model: call it after ``prepare(model)`` made the groups (``model``
        is taken for Accelerate's signature; the shards go to this Accelerator's device).
        """
        from .strategies.sequence_parallel import deepspeed_ulysses_dl_adapter

        return deepspeed_ulysses_dl_adapter(dl, self.parallelism_config, self.device)

    def maybe_context_parallel(self, buffers: list[torch.Tensor] | None = None, buffer_seq_dims: list[int] | None = None,
                               no_restore_buffers: set[torch.Tensor] | None = None) -> contextlib.AbstractContextManager:
        """Run the block with ``buffers`` sharded along ``buffer_seq_dims`` over the ``cp`` mesh dimension (torch
        context parallelism, ``cp_size`` > 1); without it, a warning and no effect. Enter it anew each step.

        Refused (``UnsupportedFeatureError`` naming the kernel) where torch cannot shard the device's attention.
        """
        from .facade.context_parallel import maybe_context_parallel

        return maybe_context_parallel(self.parallelism_config, lambda: self.torch_device_mesh, buffers=buffers,
                                      buffer_seq_dims=buffer_seq_dims, no_restore_buffers=no_restore_buffers)

    deepspeed_engine_wrapped = _forward("strategy.engine_wrapper",
                                        "The wrapper of the DeepSpeed engine built last (None without DeepSpeed or before "
                                        "``prepare``).")

    def __repr__(self) -> str:
        return (f"Accelerator(backend={self.backend.name!r}, distributed_type={self.distributed_type}, "
                f"num_processes={self.num_processes}, mixed_precision={self.mixed_precision!r})")
