"""The FSDP strategy: set-up, precision, prepare, the training step's hooks and checkpoints.

Wrapping a model lives in :mod:`.wrapping`, the state-dict files in :mod:`.state_dict`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from ...backends import UnsupportedFeatureError
from ...facts.network import free_port
from ...utils.dataclasses import DistributedType
from ..base import Strategy, StrategyCheckpoint, validate_parallelism_config
from ..context import EMPTY, PreparedObjects, StrategyContext
from .sharding import (
    _clip_sharded_grad_norm_,
    _is_fsdp1,
    _is_fsdp2,
    _local,
    fsdp2_switch_optimizer_parameters,
    get_fsdp2_grad_scaler,
)
from .state_dict import (
    _on_host,
    _options,
    _torch_optimizer,
    load_fsdp_model,
    load_fsdp_optimizer,
    save_fsdp_model,
    save_fsdp_optimizer,
)
from .wrapping import FSDPWrapping

logger = logging.getLogger(__name__)


class FSDPStrategy(FSDPWrapping, Strategy):
    """Models are sharded across ranks (FSDP2 ``fully_shard`` or FSDP1); every rank holds only its shards."""

    name = "fsdp"
    state_dict_is_collective = True

    def __init__(self, context: StrategyContext):
        super().__init__(context)
        backend = self.backend
        if not backend.supports_multiprocess():
            raise UnsupportedFeatureError(
                backend.name, "FSDP",
                f"FSDP shards parameters across processes with collectives, and this backend has none "
                f"({backend.comm_backend_reason() or 'no torch.distributed backend'}); train without fsdp_plugin")
        if self.state.fsdp_plugin is None:
            raise ValueError("the FSDP strategy needs the run's FullyShardedDataParallelPlugin (accel.resolve builds it)")
        self._ensure_process_group()
        self._mesh: Any = None
        #: id(original parameter) -> (weak ref to it, its sharded parameter), for optimizers prepared after their model
        self._param_map: dict[int, tuple[Any, torch.nn.Parameter]] = {}
        #: FSDP1 without use_orig_params: (weak refs to a model's original parameters, its flat parameters)
        self._flat_groups: list[tuple[list[Any], list[torch.nn.Parameter]]] = []
        #: ids of FSDP2 models inside no_sync (trigger_sync_in_backward restores that state)
        self._unsynced: set[int] = set()

    # ------------------------------------------------------------------ identity
    @property
    def distributed_type(self) -> DistributedType:
        """``FSDP``."""
        return DistributedType.FSDP

    @property
    def plugin(self) -> Any:
        """The FullyShardedDataParallelPlugin of this run."""
        return self.state.fsdp_plugin

    @classmethod
    def shards_with_fsdp2(cls, fsdp_plugin: Any) -> bool:
        """Whether ``fsdp_plugin`` asks for FSDP2 (``fully_shard``, ``fsdp_version=2``) rather than FSDP1."""
        return fsdp_plugin is not None and getattr(fsdp_plugin, "fsdp_version", 1) == 2

    def describe(self) -> str:
        """``fsdp<version> (how it reshards, state_dict_type, mesh)``."""
        plugin = self.plugin
        how = (f"reshard_after_forward={plugin.reshard_after_forward}" if self.is_fsdp2
               else f"sharding_strategy={getattr(plugin.sharding_strategy, 'name', plugin.reshard_after_forward)}")
        mesh = self.device_mesh
        where = f", mesh {tuple(mesh.mesh_dim_names)}={tuple(mesh.shape)}" if mesh is not None and mesh.mesh_dim_names else ""
        return f"fsdp{plugin.fsdp_version} ({how}, state_dict_type={plugin.state_dict_type.name}{where})"

    # ------------------------------------------------------------------ set-up
    def _ensure_process_group(self) -> None:
        """FSDP needs a process group even for one process (as DeepSpeed does)."""
        import torch.distributed as dist

        if dist.is_initialized():
            return
        state = self.state
        if state.num_processes > 1:  # pragma: no cover - PartialState creates the group for several ranks
            raise RuntimeError("FSDP: several processes but no process group")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port("127.0.0.1")))
        dist.init_process_group(backend=self.backend.comm_backend, rank=0, world_size=1)

    def settle_parallelism_config(self) -> None:
        """Check the run's ParallelismConfig (the resolution's: given, or built from the launcher's variables)
        and build its mesh."""
        config = self.state.parallelism_config
        if config is None:
            return
        if not self.is_fsdp2 and config.total_size > 1:
            raise ValueError("ParallelismConfig (HSDP/TP meshes) needs FSDP2: pass FullyShardedDataParallelPlugin(fsdp_version=2)")
        # sizes against the process count, before any group is made
        validate_parallelism_config(config, self.state, is_fsdp2=self.is_fsdp2)
        if self.state.num_processes > 1 or config.total_size > 1:
            config.get_device_mesh(self.backend.device_type)

    @property
    def device_mesh(self) -> Any:
        """The mesh FSDP shards over: the ParallelismConfig's, else a 1-D mesh of all ranks."""
        config = self.state.parallelism_config
        if config is not None and config.device_mesh is not None:
            return config.device_mesh
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.backend.device_type, (self.state.num_processes,),
                                          mesh_dim_names=("dp_shard",))
        return self._mesh

    def _shard_mesh(self) -> Any:
        config = self.state.parallelism_config
        mesh = self.device_mesh
        if config is not None and config.device_mesh is not None:
            return mesh[tuple(config.fsdp_dim_names)]
        return mesh

    @classmethod
    def plan_precision(cls, requested: str, backend: Any, *, deepspeed_plugin: Any = None, fsdp_plugin: Any = None,
                       autocast_handler: Any = None, scaler_handler: Any = None, fp8_handler: Any = None) -> Any:
        """accel's autocast as for DDP, plus FSDP's own mixed precision policy for the same dtype (as Accelerate).

        Parameters are all-gathered and computed in the low precision (``param_dtype``), gradients reduced
        in it; the sharded fp32 master weights stay in fp32, and (FSDP2) the model's outputs come back in
        fp32 as under DDP. fp16 gets a ShardedGradScaler, so every rank skips the same steps. A policy set
        on the plugin is used as it is.
        """
        from ...precision import with_recipe_layers

        plan = super().plan_precision(requested, backend, autocast_handler=autocast_handler,
                                      scaler_handler=scaler_handler, fp8_handler=fp8_handler)
        plan = with_recipe_layers(plan, backend, fp8_handler)
        plugin = fsdp_plugin
        if plugin is None:
            raise ValueError("the FSDP strategy's precision needs its FullyShardedDataParallelPlugin")
        if plan.fp8 is not None and plugin.fsdp_version == 1:  # FSDP1 all-gathers the high-precision weights
            from ...precision.fp8 import without_float8_all_gather

            plan.fp8, note = without_float8_all_gather(plan.fp8, "FSDP1")
            plan.reason += note
        if plan.fp8 is not None and plugin.cpu_ram_efficient_loading:
            # Accelerate's refusal: rank 0's weights are loaded into the sharded model after fully_shard,
            # which does not fit the Float8Linear weights wrapped for the fp8 all-gather
            raise ValueError("torchao with FSDP2 and cpu_ram_efficient_loading is not supported, setting "
                             "`cpu_ram_efficient_loading` to False will fix the issue and work as intended.")
        if plan.dtype is not None and plugin.mixed_precision_policy is None:
            plugin.set_mixed_precision(plan.used)
            if plugin.fsdp_version == 2:
                # outputs in fp32, as accel's autocast forward hands them back under DDP (losses are not computed in bf16)
                plugin.mixed_precision_policy = dataclasses.replace(plugin.mixed_precision_policy, output_dtype=torch.float32)
        if plan.scaler is not None:
            kwargs = scaler_handler.to_kwargs() if scaler_handler is not None else {}
            plan.scaler = get_fsdp2_grad_scaler(device=backend.autocast_device_type, **kwargs)
        return plan

    # ------------------------------------------------------------------ prepare
    # (the base prepare sets up models first, so optimizers of the same call find their sharded parameters)
    def setup_model(self, model: torch.nn.Module, device_placement: bool, evaluation_mode: bool = False) -> torch.nn.Module:
        """Shard ``model`` (already sharded models are kept) and give it the precision's forward."""
        if _is_fsdp1(model) or _is_fsdp2(model):
            return model
        if evaluation_mode:
            return super().setup_model(model, device_placement, evaluation_mode=True)
        # fp8: torchao's Float8Linear layers go in before sharding (as Accelerate converts before fully_shard),
        # so FSDP2 shards their weights and, with enable_fsdp_float8_all_gather, all-gathers them in fp8
        self.precision.convert_fp8(model)
        wrapped = self.wrap_model(model, device_placement)
        self.precision.wrap_forward(wrapped, self.backend)
        return wrapped

    def prepare(self, models: Sequence[torch.nn.Module], optimizers: Sequence[Any], schedulers: Sequence[Any],
                model_placement: Sequence[bool], optimizer_placement: Sequence[bool],
                evaluation_mode: bool = False, dataloaders: Sequence[Any] = (),
                prepared: PreparedObjects = EMPTY) -> tuple[list[Any], list[Any], list[Any]]:
        """The base set-up, then (FSDP2 fp8 with float8 all-gather) the first optimizer of the call recomputes the
        first model's fp8 weight scales after each step, as Accelerate does."""
        result = super().prepare(models, optimizers, schedulers, model_placement, optimizer_placement,
                                 evaluation_mode=evaluation_mode, dataloaders=dataloaders, prepared=prepared)
        prepared_models, prepared_optimizers, _ = result
        fp8 = self.precision.fp8
        if (fp8 is not None and self.is_fsdp2 and prepared_models and prepared_optimizers
                and getattr(fp8.config, "enable_fsdp_float8_all_gather", False)):
            from ...utils.ao import register_fsdp_float8_scale_precompute

            inner = prepared_optimizers[0]
            while isinstance(getattr(inner, "optimizer", None), torch.optim.Optimizer):
                inner = inner.optimizer  # the user's optimizer: its step runs only when the wrapper really steps
            register_fsdp_float8_scale_precompute(inner, prepared_models[0])
        return result

    def setup_optimizer(self, optimizer: Any, device_placement: bool) -> Any:
        """Switch ``optimizer`` to the sharded (or FSDP1 flat) parameters, then wrap it."""
        torch_optimizer = _torch_optimizer(optimizer)
        if isinstance(torch_optimizer, torch.optim.Optimizer) and self._param_map:
            mapping = {}
            for group in torch_optimizer.param_groups:
                for p in group["params"]:
                    original, sharded = self._param_map.get(id(p), (None, None))
                    mapping[id(p)] = sharded if original is not None and original() is p else p
            if any(mapping[id(p)] is not p for g in torch_optimizer.param_groups for p in g["params"]):
                fsdp2_switch_optimizer_parameters(torch_optimizer, mapping)
        if isinstance(torch_optimizer, torch.optim.Optimizer):
            self._switch_to_flat_parameters(torch_optimizer)
        return super().setup_optimizer(optimizer, device_placement)

    def _switch_to_flat_parameters(self, optimizer: torch.optim.Optimizer) -> None:
        """FSDP1 (use_orig_params=False): a param group holding a model's parameters steps its flat parameters."""
        for refs, flat in self._flat_groups:
            originals = {id(p) for p in (r() for r in refs) if p is not None}  # only originals still alive count
            for group in optimizer.param_groups:
                ids = {id(p) for p in group["params"]}
                if not ids & originals:
                    continue
                if not ids <= originals or len(optimizer.param_groups) > 1:
                    raise ValueError(
                        "FSDP1 with use_orig_params=False flattens the model's parameters, so an optimizer must hold all of "
                        "them in one param group; use FullyShardedDataParallelPlugin(use_orig_params=True) (or FSDP2) for "
                        "several param groups")
                if optimizer.state:
                    raise ValueError("an optimizer that already stepped cannot be switched to FSDP1 flat parameters; "
                                     "prepare it before training")
                group["params"] = list(flat)

    # ------------------------------------------------------------------ training step
    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2,
                        prepared: PreparedObjects = EMPTY) -> torch.Tensor:
        """Clip by the global norm over all shards (every rank must call it); returns that norm."""
        self.unscale_gradients(prepared.optimizers)
        parameters = list(parameters)
        for model in prepared.models:
            if _is_fsdp1(model) and {id(p) for p in model.parameters()} >= {id(p) for p in parameters} and parameters:
                return model.clip_grad_norm_(max_norm, norm_type)
        return _clip_sharded_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float,
                         prepared: PreparedObjects = EMPTY) -> None:
        """Clip each local shard's gradient elements to ``[-clip_value, clip_value]`` (after unscaling)."""
        self.unscale_gradients(prepared.optimizers)
        for p in parameters:
            if p.grad is not None:
                _local(p.grad).clamp_(min=-clip_value, max=clip_value)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module):
        """FSDP1's ``no_sync``; FSDP2: no gradient reduction in this block (``set_requires_gradient_sync``)."""
        if _is_fsdp1(model):
            with model.no_sync():
                yield
            return
        if _is_fsdp2(model):
            model.set_requires_gradient_sync(False)
            self._unsynced.add(id(model))
            try:
                yield
            finally:
                self._unsynced.discard(id(model))
                model.set_requires_gradient_sync(True)
            return
        yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module):
        """FSDP2: the next backward reduces gradients even inside ``no_sync``. FSDP1 (as Accelerate, which only
        does this for DDP): a no-op, so leave the ``no_sync`` block for the synchronising backward."""
        if not _is_fsdp2(model):
            yield
            return
        model.set_requires_gradient_sync(True)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(id(model) not in self._unsynced)

    # ------------------------------------------------------------------ models and state
    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module inside FSDP1's wrapper (FSDP2 shards in place: the model itself)."""
        return model.module if _is_fsdp1(model) else model

    def is_wrapped(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` is sharded by FSDP1 or FSDP2."""
        return _is_fsdp1(model) or _is_fsdp2(model)

    def _sharded_model_for(self, model: torch.nn.Module, models: Iterable[torch.nn.Module]) -> torch.nn.Module | None:
        for candidate in models:
            if model is candidate or model is self.unwrap_model(candidate):
                return candidate
        return model if self.is_wrapped(model) else None

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True,
                       prepared: PreparedObjects = EMPTY) -> dict[str, torch.Tensor]:
        """The full (unsharded) state dict on rank 0, on the host; the other ranks get ``{}``. A collective."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        sharded = self._sharded_model_for(model, prepared.models)
        if sharded is None:
            return super().get_state_dict(model, unwrap)
        state = get_model_state_dict(sharded, options=_options(full=True, model=sharded))
        if self.state.process_index != 0:
            return {}
        copy = _is_fsdp1(sharded) and _on_host(sharded)  # not offloaded: do not hand out views of the model's storage
        return {k: v.detach().to("cpu", copy=copy) if isinstance(v, torch.Tensor) else v for k, v in state.items()}

    # ------------------------------------------------------------------ checkpoints
    @staticmethod
    def _model_of(optimizer: Any, index: int, models: Sequence[torch.nn.Module]) -> torch.nn.Module:
        params = {id(p) for g in _torch_optimizer(optimizer).param_groups for p in g["params"]}
        for model in models:
            if params & {id(p) for p in model.parameters()}:
                return model
        if not models:
            raise ValueError("FSDP optimizer checkpoints need the optimizer's model to be prepared too")
        return models[min(index, len(models) - 1)]

    def save_checkpoint(self, output_dir: Path, prepared: PreparedObjects, **kwargs: Any) -> StrategyCheckpoint:
        """Every prepared model and optimizer in Accelerate's FSDP layout (full files or DCP shards)."""
        plugin = self.plugin
        models, optimizers = prepared.models, prepared.optimizers
        files = []
        for i, model in enumerate(models):
            files.append(save_fsdp_model(plugin, None, model, output_dir, i))
        for i, optimizer in enumerate(optimizers):
            files.append(save_fsdp_optimizer(plugin, None, optimizer, self._model_of(optimizer, i, models), output_dir, i))
        return StrategyCheckpoint("fsdp", owns=["models", "optimizers"], files=files, extra={
            "fsdp_version": plugin.fsdp_version, "state_dict_type": plugin.state_dict_type.name,
            "num_models": len(models), "num_optimizers": len(optimizers),
            "world_size": self.state.num_processes,
            # DCP shards and full state dicts both load at another world size
            "reshardable": True,
        })

    def load_checkpoint(self, input_dir: Path, saved: dict[str, Any], prepared: PreparedObjects, **kwargs: Any) -> None:
        """Load what ``save_checkpoint`` wrote into the prepared models and optimizers (resharding as needed)."""
        plugin = self.plugin
        models, optimizers = prepared.models, prepared.optimizers
        saved_type = saved.get("state_dict_type")
        if saved_type is not None and saved_type != plugin.state_dict_type.name:
            raise ValueError(f"checkpoint {input_dir} holds an FSDP {saved_type} but this run uses "
                             f"state_dict_type={plugin.state_dict_type.name}; load it with the same state_dict_type")
        for key, found in (("num_models", models), ("num_optimizers", optimizers)):
            if saved.get(key) is not None and saved[key] != len(found):
                raise ValueError(f"checkpoint {input_dir} holds {saved[key]} FSDP {key[4:]} but {len(found)} were prepared")
        if plugin.state_dict_type.name != "SHARDED_STATE_DICT" and saved.get("world_size") not in (None, self.state.num_processes):
            logger.info("loading a full FSDP checkpoint saved at world size %s into %d ranks", saved["world_size"],
                        self.state.num_processes)
        for i, model in enumerate(models):
            load_fsdp_model(plugin, None, model, input_dir, i)
        for i, optimizer in enumerate(optimizers):
            load_fsdp_optimizer(plugin, None, optimizer, self._model_of(optimizer, i, models), input_dir, i)

    def release(self) -> None:
        """Forget the parameter mapping (``Accelerator.free_memory``)."""
        self._param_map.clear()


def fsdp2_prepare_model(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` with ``fully_shard`` as the Accelerator's FSDP plugin says (what ``prepare`` does for a model)."""
    strategy = accelerator.strategy
    if not isinstance(strategy, FSDPStrategy):
        raise ValueError("fsdp2_prepare_model needs an Accelerator that runs FSDP (fsdp_plugin=... or accel launch --use_fsdp)")
    return strategy.wrap_model(model)


def fsdp2_apply_ac(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
    """Wrap the layers the plugin's wrap policy selects in non-reentrant activation checkpointing (in place)."""
    strategy = accelerator.strategy
    if not isinstance(strategy, FSDPStrategy):
        raise ValueError("fsdp2_apply_ac needs an Accelerator that runs FSDP (fsdp_plugin=... or accel launch --use_fsdp)")
    return strategy.apply_activation_checkpointing(model, strategy.wrap_predicate(strategy.plugin, model))
