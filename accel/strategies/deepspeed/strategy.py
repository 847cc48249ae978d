"""DeepSpeed: ZeRO stages 0-3 with offload, through ``deepspeed.initialize``.

``prepare`` hands the model, its optimizer and scheduler to DeepSpeed together (after filling the
config's "auto" values from the Accelerator and the data loaders of the same call); the engine is
returned as the model. ``backward`` runs the engine's backward and, at an accumulation boundary,
its step; the returned optimizer and scheduler are thin wrappers whose ``step`` is the engine's.

With a ``ParallelismConfig`` whose ``sp_size`` is above 1 (``sp_backend="deepspeed"``), ``prepare``
switches the model's attention to DeepSpeed's Ulysses before building the engine (the ``mpu`` it
returns goes to ``deepspeed.initialize``), counts each sequence-parallel group once in
``train_batch_size``, and :meth:`DeepSpeedStrategy.adapt_dataloader` hands each rank its sequence
shard of the data loaders prepared with the model.

The active backend tells DeepSpeed which accelerator to use: a backend that brings its own DeepSpeed
accelerator (``Backend.deepspeed_accelerator``, a device outside DeepSpeed's list) has it installed with
DeepSpeed's ``set_accelerator``; the others set ``DS_ACCELERATOR``, unless the user set it. If DeepSpeed
still picks another device or collective library the run stops and names both.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from ...backends import UnsupportedFeatureError
from ...utils.dataclasses import DistributedType
from ...utils.deepspeed import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedPlugin,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
    map_pytorch_optim_to_deepspeed,
)
from ...facts.checkpoint import MODEL_NAME
from ...facts.network import free_port
from ..sequence_parallel import (
    register_deepspeed_ulysses,
    release_deepspeed_ulysses,
    sequence_parallel_train_batch_size,
    ulysses_dataloader,
)
from ..base import Strategy, StrategyCheckpoint
from ..context import PreparedObjects, StrategyContext

#: the tag (sub-folder) of the DeepSpeed engine's checkpoint, Accelerate's
MODEL_TAG = MODEL_NAME


def _fp8_library(requested: str, plugin: Any, handler: Any) -> str | None:
    """Which fp8 library a DeepSpeed run uses, by Accelerate's rule: the recipe handler's, else MS-AMP when the plugin
    enables it (whatever the precision: Accelerate then builds MS-AMP's engine), else the fp8 default; None without
    fp8."""
    from ...precision.fp8 import fp8_backend_name

    if handler is not None:
        return fp8_backend_name(handler)
    if plugin.enable_msamp:
        return "MSAMP"
    return fp8_backend_name() if requested == "fp8" else None


def _require_msamp(plugin: Any) -> Any:
    """``msamp.deepspeed``, or the ModuleNotFoundError Accelerate's DeepSpeed path gives, naming the module."""
    try:
        from msamp import deepspeed as msamp_deepspeed
    except ModuleNotFoundError as exc:
        if exc.name not in ("msamp", "msamp.deepspeed"):
            raise
        raise ModuleNotFoundError(
            f"No module named {exc.name!r}: MS-AMP fp8 under DeepSpeed (DeepSpeedPlugin(enable_msamp=True) or "
            "fp8_backend MSAMP) builds the engine with msamp.deepspeed.initialize; install MS-AMP, or use "
            "mixed_precision='fp8' with torchao (AORecipeKwargs)", name=exc.name) from exc
    return msamp_deepspeed


def require_deepspeed() -> Any:
    """Import deepspeed, or say which package extra provides it."""
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError(
            "DeepSpeed is not installed: `pip install 'accel[deepspeed]'` (or `pip install deepspeed` with your "
            f"torch pinned) to use DeepSpeedPlugin ({exc})"
        ) from None
    return deepspeed


def align_deepspeed_accelerator(backend: Any) -> None:
    """Point DeepSpeed at ``backend``'s device and stop if the two still disagree.

    The backend's own accelerator when it brings one (installed with ``set_accelerator``), else
    ``DS_ACCELERATOR`` (unless set), which DeepSpeed reads on its first ``get_accelerator()``.
    """
    from ...backends.deepspeed_agreement import (
        clear_rejected_ds_accelerator,
        compare,
        install_deepspeed_accelerator,
        provided_accelerator,
    )

    provided = provided_accelerator(backend)
    if provided is not None:
        clear_rejected_ds_accelerator()  # DS_ACCELERATOR naming this device would make DeepSpeed's import raise
    elif "deepspeed.accelerator" not in sys.modules:
        os.environ.setdefault("DS_ACCELERATOR", backend.device_type)
    require_deepspeed()
    from deepspeed.accelerator import get_accelerator

    if provided is not None:
        install_deepspeed_accelerator(backend)
    chosen = get_accelerator()
    try:
        comm = chosen.communication_backend_name()
    except Exception:  # pragma: no cover - accelerators without collectives
        comm = None
    verdict = compare(backend, {"installed": True, "device": chosen.device_name(), "communication_backend": comm,
                                "ds_accelerator": os.environ.get("DS_ACCELERATOR"), "provided": provided})
    if verdict["agree"] is False:
        raise RuntimeError("DeepSpeed and accel disagree about the accelerator: " + "; ".join(verdict["problems"]))


class DeepSpeedStrategy(Strategy):
    """Models become DeepSpeed engines; DeepSpeed owns backward, step, precision and ZeRO sharding."""

    name = "deepspeed"
    compiles_models = False  # DeepSpeed compiles through its config ("compile" section)
    supports_lomo = False  # the engine owns backward and the step; a fused LOMO backward would bypass both

    def __init__(self, context: StrategyContext):
        super().__init__(context)
        align_deepspeed_accelerator(self.backend)
        #: one wrapper per engine, keyed by the name of the plugin that built it
        self.engines: dict[str, DeepSpeedEngineWrapper] = {}
        #: the wrapper of the engine built last (``Accelerator.deepspeed_engine_wrapped``)
        self.engine_wrapper: DeepSpeedEngineWrapper | None = None
        #: a one-process group this strategy created for DeepSpeed (destroyed by ``release``)
        self._own_group = False
        #: DeepSpeed Ulysses' model-parallel unit of the engine built last (None without sequence parallelism)
        self.mpu: Any = None

    # ------------------------------------------------------------------ identity
    @property
    def distributed_type(self) -> DistributedType:
        """``DEEPSPEED``."""
        return DistributedType.DEEPSPEED

    @property
    def plugin(self) -> DeepSpeedPlugin:
        """The selected DeepSpeedPlugin."""
        return self.state.deepspeed_plugin

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage of the selected plugin's config."""
        return int(self.plugin.get_value("zero_optimization.stage", 0))

    @property
    def state_dict_is_collective(self) -> bool:  # type: ignore[override]
        """True once a ZeRO-3 engine exists: its full state dict is gathered from every rank."""
        return any(int(w.engine.zero_optimization_stage()) == 3 for w in self.engines.values())

    def describe(self) -> str:
        """``deepspeed (ZeRO stage N)``."""
        return f"deepspeed (ZeRO stage {self.zero_stage})"

    # ------------------------------------------------------------------ set-up of DeepSpeed itself
    def _ensure_process_group(self) -> None:
        """DeepSpeed needs a process group and the launcher's rank variables, even for one process."""
        import torch.distributed as dist

        state = self.state
        os.environ.setdefault("RANK", str(state.process_index))
        os.environ.setdefault("LOCAL_RANK", str(state.local_process_index))
        os.environ.setdefault("WORLD_SIZE", str(state.num_processes))
        if dist.is_initialized():
            return
        if state.num_processes > 1:  # pragma: no cover - PartialState creates the group for several ranks
            raise RuntimeError("DeepSpeed: several processes but no process group")
        store = dist.TCPStore("127.0.0.1", free_port("127.0.0.1"), 1, is_master=True)
        comm = self.backend.comm_backend or "gloo"
        dist.init_process_group(backend=comm, store=store, rank=0, world_size=1)
        self._own_group = True

    @classmethod
    def plan_precision(cls, requested: str, backend: Any, *, deepspeed_plugin: Any = None, fsdp_plugin: Any = None,
                       autocast_handler: Any = None, scaler_handler: Any = None, fp8_handler: Any = None) -> Any:
        """DeepSpeed runs the precision itself (its fp16/bf16 config); accel adds no autocast or scaler.

        A precision left at "no" takes the one the DeepSpeed config enables; an explicit one is written
        into the config (a config enabling the other dtype is an error), and one DeepSpeed's accelerator
        cannot run is an ``UnsupportedFeatureError``.
        """
        from ...precision import engine_managed_precision, with_recipe_layers

        if deepspeed_plugin is None:
            raise ValueError("the DeepSpeed strategy's precision needs its DeepSpeedPlugin")
        align_deepspeed_accelerator(backend)  # before DeepSpeed's accelerator is asked what it supports
        requested = str(requested or "no").lower()
        library = _fp8_library(requested, deepspeed_plugin, fp8_handler)
        if library == "MSAMP":
            _require_msamp(deepspeed_plugin)
        if requested == "fp8":
            return cls._plan_fp8(backend, deepspeed_plugin, fp8_handler, library)
        if requested == "no" and deepspeed_plugin.config_precision() is not None:
            requested = deepspeed_plugin.config_precision()
        plan = engine_managed_precision(requested, "deepspeed", cls._deepspeed_supports)
        deepspeed_plugin.set_mixed_precision(plan.used)
        # a torchao recipe beside another precision: its layers too (with_recipe_layers leaves other recipes out)
        plan = with_recipe_layers(plan, backend, fp8_handler)
        if plan.fp8 is not None:
            from ...precision.fp8 import without_float8_all_gather

            plan.fp8, note = without_float8_all_gather(plan.fp8, "DeepSpeed")
            plan.reason += note
        return plan

    @classmethod
    def _plan_fp8(cls, backend: Any, plugin: Any, handler: Any, library: str) -> Any:
        """fp8 under DeepSpeed, as in Accelerate: DeepSpeed runs bf16, and torchao's ``Float8Linear`` layers go into
        the model before the engine is built (MS-AMP: its own DeepSpeed engine does the fp8 work)."""
        from ...backends import UnsupportedFeatureError
        from ...precision import PrecisionPlan

        bf16 = cls._deepspeed_supports("bf16")
        if bf16 is not None:
            raise UnsupportedFeatureError("deepspeed", "mixed_precision='fp8'", f"DeepSpeed runs fp8 training in bf16: {bf16}")
        if library == "MSAMP":
            plugin.enable_msamp = True
            plugin.set_mixed_precision("fp8")
            return PrecisionPlan("fp8", "fp8", f"MS-AMP (opt_level {plugin.msamp_opt_level}) through its DeepSpeed engine",
                                 managed_by="deepspeed")
        from ...precision.fp8 import plan_fp8, without_float8_all_gather

        fp8 = plan_fp8(backend, handler)  # Accelerate's ImportError / accel's refusal where it cannot run
        # where Accelerate 1.15 stops with its default recipe ("Couldn't swap Float8Linear.weight")
        fp8, note = without_float8_all_gather(fp8, "DeepSpeed")
        reason = f"{fp8.reason}; DeepSpeed runs the other layers in bf16{note}"
        plugin.set_mixed_precision("fp8")
        return PrecisionPlan("fp8", "fp8", reason, managed_by="deepspeed", fp8=fp8)

    @staticmethod
    def _deepspeed_supports(dtype: str) -> str | None:
        from deepspeed.accelerator import get_accelerator

        ds = get_accelerator()
        probe = ds.is_fp16_supported if dtype == "fp16" else ds.is_bf16_supported
        if probe():
            return None
        return f"DeepSpeed's {type(ds).__name__} does not support {dtype} on {ds.device_name()}"

    # ------------------------------------------------------------------ prepare
    def prepare(self, models: Sequence[torch.nn.Module], optimizers: Sequence[Any], schedulers: Sequence[Any],
                model_placement: Sequence[bool], optimizer_placement: Sequence[bool],
                evaluation_mode: bool = False, dataloaders: Sequence[Any] = (),
                prepared: PreparedObjects | None = None) -> tuple[list[Any], list[Any], list[Any]]:
        """Build one DeepSpeed engine from the model, optimizer and scheduler of this call (after filling the config)."""
        if not models and not optimizers and not schedulers:
            return [], [], []
        self._ensure_process_group()
        if len(models) != 1:
            raise ValueError(
                f"DeepSpeed builds one engine per model and got {len(models)} models in one prepare() call; pass each "
                "model with its optimizer/scheduler in its own prepare() call, selecting its plugin first "
                "(Accelerator(deepspeed_plugins={'a': ..., 'b': ...}), accelerator.state.select_deepspeed_plugin('b'))"
            )
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise ValueError("DeepSpeed takes one optimizer and one scheduler per model in a prepare() call")
        model = models[0]
        optimizer = optimizers[0] if optimizers else None
        scheduler = schedulers[0] if schedulers else None
        if isinstance(optimizer, DeepSpeedOptimizerWrapper) or type(model).__name__ == "DeepSpeedEngine":
            raise ValueError("this model/optimizer was already prepared by DeepSpeed")
        plugin = self.plugin
        if self.precision.fp8 is not None:
            # torchao's Float8Linear layers go in before the engine is built (Accelerate's _prepare_ao runs first);
            # an optimizer built before prepare follows the weights the conversion replaced
            self.precision.fp8.convert(model)
            if optimizer is not None and not isinstance(optimizer, DummyOptim):
                self.precision.adopt_parameters(getattr(optimizer, "optimizer", optimizer))
        self._fill_config(plugin, model, optimizer, scheduler, dataloaders)

        deepspeed = require_deepspeed()
        kwargs: dict[str, Any] = {"model": model, "config_params": plugin.deepspeed_config}
        self.mpu = None
        if self._sp_size > 1:
            micro = plugin.get_value("train_micro_batch_size_per_gpu")
            # patches the model's attention and creates the sequence-parallel groups (every rank calls it)
            self.mpu = register_deepspeed_ulysses(model, self.state.parallelism_config,
                                                  None if micro in (None, "auto") else int(micro))
            kwargs["mpu"] = self.mpu
        if isinstance(optimizer, DummyOptim):
            kwargs["model_parameters"] = optimizer.params
            if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is not None:
                kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
        elif optimizer is not None:
            torch_optimizer = getattr(optimizer, "optimizer", optimizer)
            if (plugin.get_value("zero_optimization.offload_optimizer.device", "none") != "none"
                    and plugin.deepspeed_config.get("zero_force_ds_cpu_optimizer", True)):
                torch_optimizer = map_pytorch_optim_to_deepspeed(torch_optimizer)
            kwargs["optimizer"] = torch_optimizer
        if scheduler is not None and not isinstance(scheduler, DummyScheduler):
            kwargs["lr_scheduler"] = getattr(scheduler, "scheduler", scheduler)
        plugin.set_moe_leaf_modules(model)

        initialize = deepspeed.initialize
        if plugin.enable_msamp:
            initialize = _require_msamp(plugin).initialize  # MS-AMP's engine wraps DeepSpeed's (as in Accelerate)
        engine, ds_optimizer, _, ds_scheduler = initialize(**kwargs)
        wrapper = DeepSpeedEngineWrapper(engine)
        self.engines[self._plugin_name(plugin)] = wrapper
        self.engine_wrapper = wrapper
        prepared_optimizers = [DeepSpeedOptimizerWrapper(ds_optimizer)] if optimizer is not None else []
        prepared_schedulers: list[Any] = []
        if scheduler is not None:
            if ds_scheduler is not None:
                prepared_schedulers = [DeepSpeedSchedulerWrapper(ds_scheduler, prepared_optimizers)]
            else:
                prepared_schedulers = [self.setup_scheduler(scheduler, prepared_optimizers)]
        return [engine], prepared_optimizers, prepared_schedulers

    @property
    def _sp_size(self) -> int:
        config = self.state.parallelism_config
        return int(getattr(config, "sp_size", 1) or 1) if config is not None else 1

    def adapt_dataloader(self, dataloader: Any) -> Any:
        """Under DeepSpeed Ulysses, ``dataloader`` wrapped so each rank gets its sequence shard of each batch of
        its group (``ulysses_dataloader``); otherwise ``dataloader`` itself."""
        if self.mpu is None:
            return dataloader
        return ulysses_dataloader(dataloader, self.mpu, self.device)

    def data_layout(self, mesh: Any, num_processes: int, process_index: int) -> tuple[int, int]:
        """Only tensor parallelism replicates the input under DeepSpeed: the other ranks are its data-parallel
        ranks, whose optimizer sharing its config decides."""
        from ...data_loader.layout import tensor_parallel_layout

        return tensor_parallel_layout(mesh, num_processes, process_index)

    def _plugin_name(self, plugin: DeepSpeedPlugin) -> str:
        for name, candidate in self.state.deepspeed_plugins.items():
            if candidate is plugin:
                return name
        return "default"

    def _fill_config(self, plugin: DeepSpeedPlugin, model: torch.nn.Module, optimizer: Any, scheduler: Any,
                     dataloaders: Sequence[Any]) -> None:
        """Fill "auto" values from the run and refuse values that contradict it."""
        num_processes = self.state.num_processes
        split_batches = self.context.split_batches
        batch_sizes = [getattr(dl, "batch_size", None) for dl in dataloaders]
        if any(bs is None for bs in batch_sizes) and plugin.is_auto("train_micro_batch_size_per_gpu"):
            raise ValueError(
                "a data loader passed to prepare() has batch_size=None (a batch_sampler?), so DeepSpeed's "
                "'train_micro_batch_size_per_gpu' cannot be filled; write a number for it in the DeepSpeed config"
            )
        if split_batches:
            batch_sizes = [bs // num_processes for bs in batch_sizes]
        per_device = None
        if batch_sizes:
            per_device = min(batch_sizes) if plugin.is_train_batch_min else max(batch_sizes)
        if plugin.get_value("train_micro_batch_size_per_gpu") is None:
            # a config that leaves the micro batch out means what "auto" means: the loader's batch size
            plugin.hf_ds_config.set_value("train_micro_batch_size_per_gpu", "auto")
        if plugin.is_auto("train_micro_batch_size_per_gpu"):
            if per_device is None:
                raise ValueError(
                    "with DeepSpeed, prepare() needs a training or evaluation data loader in the same call (its "
                    "batch_size fills 'train_micro_batch_size_per_gpu'), or a number for it in the DeepSpeed config"
                )
        else:
            configured = plugin.get_value("train_micro_batch_size_per_gpu")
            if per_device is not None and configured is not None and int(configured) != per_device:
                raise ValueError(
                    f"batch size contradiction: the data loader gives {per_device} samples per process but the DeepSpeed "
                    f"config has train_micro_batch_size_per_gpu={configured}; make them equal or write 'auto' in the config"
                )
            per_device = configured

        self._settle_accumulation(plugin)
        gas = int(plugin.get_value("gradient_accumulation_steps"))
        fill: dict[str, Any] = {
            "gradient_clipping": 1.0,
            "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
            "train_micro_batch_size_per_gpu": per_device,
        }
        if per_device is not None:
            # the ranks of a sequence-parallel group share their samples: each group counts once
            sp_size = self._sp_size
            expected = sequence_parallel_train_batch_size(int(per_device), gas, num_processes, sp_size)
            fill["train_batch_size"] = expected
            configured_total = plugin.get_value("train_batch_size")
            if configured_total not in (None, "auto") and int(configured_total) != expected:
                groups = f" / sp_size {sp_size}" if sp_size > 1 else ""
                raise ValueError(
                    f"batch size contradiction: DeepSpeed config train_batch_size={configured_total} but "
                    f"{per_device} per process x {gas} accumulation steps x {num_processes} processes{groups} = {expected}"
                )
        self._check_optimizer_scheduler(plugin, optimizer, scheduler)
        if isinstance(optimizer, torch.optim.Optimizer) or hasattr(optimizer, "optimizer"):
            plugin.deepspeed_config["zero_allow_untested_optimizer"] = True
        self._fill_hidden_size(plugin, model, fill)
        if isinstance(optimizer, DummyOptim):
            fill["optimizer.params.lr"] = optimizer.lr
            fill["optimizer.params.weight_decay"] = optimizer.weight_decay
        if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is None:
            opt = scheduler.optimizer
            fill["scheduler.params.warmup_min_lr"] = 0
            fill["scheduler.params.warmup_max_lr"] = opt.lr if isinstance(opt, DummyOptim) else opt.defaults["lr"]
            fill["scheduler.params.warmup_num_steps"] = max(1, scheduler.warmup_num_steps)
            if scheduler.total_num_steps is not None:
                steps = scheduler.total_num_steps
                fill["scheduler.params.total_num_steps"] = steps if split_batches else -(-steps // num_processes)
        plugin.deepspeed_config_process(must_match=False, **fill)

    def _settle_accumulation(self, plugin: DeepSpeedPlugin) -> None:
        ours = self.gradient_state.num_steps
        if plugin.is_auto("gradient_accumulation_steps"):
            plugin.hf_ds_config.set_value("gradient_accumulation_steps", ours)
            return
        theirs = int(plugin.get_value("gradient_accumulation_steps", 1))
        if theirs == ours:
            return
        if ours != 1:
            raise ValueError(
                f"gradient accumulation contradiction: the Accelerator has gradient_accumulation_steps={ours} but the "
                f"DeepSpeed config has gradient_accumulation_steps={theirs}; make them equal or write 'auto' in the config"
            )
        # the Accelerator was left at its default: the run adopts DeepSpeed's
        self.gradient_state.plugin_kwargs.update({"num_steps": theirs})

    @staticmethod
    def _check_optimizer_scheduler(plugin: DeepSpeedPlugin, optimizer: Any, scheduler: Any) -> None:
        config = plugin.deepspeed_config
        if optimizer is not None:
            if "optimizer" in config and not isinstance(optimizer, DummyOptim):
                raise ValueError("the DeepSpeed config defines an optimizer and the code passed one too: remove one, "
                                 "or pass accel.utils.DummyOptim to use the config's")
            if "optimizer" not in config and isinstance(optimizer, DummyOptim):
                raise ValueError("DummyOptim stands for the DeepSpeed config's optimizer, but the config has none")
        if scheduler is not None:
            if "scheduler" in config and not isinstance(scheduler, DummyScheduler):
                raise ValueError("the DeepSpeed config defines a scheduler and the code passed one too: remove one, "
                                 "or pass accel.utils.DummyScheduler to use the config's")
            if "scheduler" not in config and isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is None:
                raise ValueError("DummyScheduler needs a scheduler in the DeepSpeed config or lr_scheduler_callable")
            if isinstance(optimizer, DummyOptim) and not isinstance(scheduler, DummyScheduler):
                raise ValueError("with DummyOptim the scheduler must be a DummyScheduler too")

    @staticmethod
    def _fill_hidden_size(plugin: DeepSpeedPlugin, model: torch.nn.Module, fill: dict[str, Any]) -> None:
        keys = ["zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
                "zero_optimization.stage3_param_persistence_threshold"]
        auto = [k for k in keys if plugin.is_auto(k)]
        if not auto:
            return
        config = getattr(model, "config", None)
        hidden = getattr(config, "hidden_size", None)
        if hidden is None and getattr(config, "hidden_sizes", None):
            hidden = max(config.hidden_sizes)
        if hidden is None:
            raise ValueError(f"DeepSpeed config values {auto} are 'auto' but the model has no config.hidden_size to "
                             "derive them from; write numbers for them")
        fill.update({keys[0]: hidden * hidden, keys[1]: int(0.9 * hidden * hidden), keys[2]: 10 * hidden})

    # ------------------------------------------------------------------ training step
    def _training_engine(self) -> DeepSpeedEngineWrapper:
        selected = self.engines.get(self._plugin_name(self.plugin))
        if selected is not None and selected.engine.optimizer is not None:
            return selected
        trainable = [w for w in self.engines.values() if w.engine.optimizer is not None]
        if not trainable:
            raise RuntimeError("accelerator.backward under DeepSpeed needs a model prepared with its optimizer")
        return trainable[-1]

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """The engine's backward (DeepSpeed divides by its accumulation steps itself), and its step at a boundary."""
        self._training_engine().backward(loss, sync_gradients=self.gradient_state.sync_gradients, **kwargs)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2,
                        prepared: PreparedObjects | None = None) -> Any:
        """DeepSpeed clips inside its step (config ``gradient_clipping``); returns the norm it measured."""
        return self._training_engine().get_global_grad_norm()

    def clip_grad_value_(self, parameters: Any, clip_value: float, prepared: PreparedObjects | None = None) -> None:
        """Refused: DeepSpeed only clips by norm."""
        raise UnsupportedFeatureError("deepspeed", "clip_grad_value_", "DeepSpeed only clips by norm (config 'gradient_clipping')")

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """A null context: the accumulation boundary passed to the engine defers the reduction instead."""
        # the accumulation boundary passed to the engine in backward defers the reduction instead
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ models and state
    @staticmethod
    def _is_engine(model: Any) -> bool:
        return type(model).__name__ == "DeepSpeedEngine" or hasattr(model, "zero_optimization_stage") and hasattr(model, "module")

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model as it is: DeepSpeed builds its engine in ``prepare``, with the optimizer."""
        return model

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module inside a DeepSpeed engine."""
        return model.module if self._is_engine(model) else model

    def is_wrapped(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` is a DeepSpeed engine."""
        return self._is_engine(model)

    def _engine_of(self, model: torch.nn.Module) -> Any:
        for wrapper in self.engines.values():
            if model is wrapper.engine or model is wrapper.engine.module:
                return wrapper.engine
        return None

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True,
                       prepared: PreparedObjects | None = None) -> dict[str, torch.Tensor]:
        """The full state dict; under ZeRO-3 gathered from every rank (a collective) into rank 0's 16-bit dict."""
        engine = self._engine_of(model)
        if engine is not None and int(engine.zero_optimization_stage()) == 3:
            # a collective: every rank gathers its partitions; rank 0 receives the full 16-bit dict
            state = engine._zero3_consolidated_16bit_state_dict()
            return state if state is not None else {}
        return super().get_state_dict(model, unwrap)

    # ------------------------------------------------------------------ checkpoints
    def _tags(self, prepared: PreparedObjects) -> list[tuple[str, Any]]:
        engines = [self._engine_of(m) for m in prepared.models]
        return [(MODEL_TAG if i == 0 else f"{MODEL_TAG}_{i}", e) for i, e in enumerate(engines) if e is not None]

    def save_checkpoint(self, output_dir: Path, prepared: PreparedObjects, **kwargs: Any) -> StrategyCheckpoint:
        """Each engine's own checkpoint (model, optimizer, scheduler), tagged ``pytorch_model[_i]``."""
        tags = self._tags(prepared)
        for tag, engine in tags:
            engine.save_checkpoint(str(output_dir), tag=tag, **kwargs)
        return StrategyCheckpoint("deepspeed", owns=["models", "optimizers"], files=[t for t, _ in tags],
                                  extra={"zero_stage": self.zero_stage})

    def load_checkpoint(self, input_dir: Path, saved: dict[str, Any], prepared: PreparedObjects, **kwargs: Any) -> None:
        """Load each engine's checkpoint; the engines must be the ones that saved (same tags)."""
        tags = self._tags(prepared)
        saved_tags = saved.get("files", [])
        if [t for t, _ in tags] != list(saved_tags):
            raise ValueError(f"checkpoint {input_dir} holds DeepSpeed engines {saved_tags} but this run prepared "
                             f"{[t for t, _ in tags]}")
        for tag, engine in tags:
            path, _ = engine.load_checkpoint(str(input_dir), tag=tag, load_optimizer_states=True,
                                             load_lr_scheduler_states=True, **kwargs)
            if path is None:
                raise ValueError(f"DeepSpeed could not load engine checkpoint {input_dir / tag}")

    def release(self) -> None:
        """Destroy the engines (and the one-process group this strategy made); undo DeepSpeed Ulysses' attention patch."""
        for wrapper in self.engines.values():
            with contextlib.suppress(Exception):
                wrapper.engine.destroy()
        self.engines.clear()
        self.engine_wrapper = None
        if self.mpu is not None:
            release_deepspeed_ulysses()
            self.mpu = None
        if self._own_group:
            import torch.distributed as dist

            if dist.is_initialized():
                # through DeepSpeed, which also drops the groups it cached for this world
                import deepspeed.comm

                if deepspeed.comm.comm.cdb is not None:
                    deepspeed.comm.destroy_process_group()
                else:
                    dist.destroy_process_group()
            self._own_group = False
