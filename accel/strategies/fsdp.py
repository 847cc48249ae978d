"""Fully sharded data parallelism: FSDP2 (``fully_shard``, per-parameter DTensor shards) and FSDP1.

``prepare`` shards each model as its ``FullyShardedDataParallelPlugin`` says (wrap policy, reshard
after forward / sharding strategy, CPU offload, FSDP mixed precision, activation checkpointing,
ignored modules, rank-0 loading), over the ``ParallelismConfig`` mesh when there is one (HSDP:
replicate x shard; tensor parallelism first through torch's ``parallelize_module``). An optimizer
created before ``prepare`` is switched to the sharded parameters, so it steps the DTensors.

State dicts go through ``torch.distributed.checkpoint.state_dict``: ``get_state_dict`` gathers the
full model on rank 0 (a collective), ``save_state`` writes ``FULL_STATE_DICT`` files or DCP shards
(``SHARDED_STATE_DICT``) that another world size can load. The file layout is Accelerate's
(``pytorch_model_fsdp_<i>``, ``optimizer_<i>``), so ``merge_fsdp_weights`` reads it.

Everything from torch.distributed.fsdp is imported when first used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import re
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from ..backends import UnsupportedFeatureError
from ..facts.checkpoint import FSDP_MODEL_NAME, OPTIMIZER_NAME
from ..facts.network import free_port
from ..utils.dataclasses import DistributedType
from ..utils.fsdp_plugin import materialise_on_rank_device
from ..utils.peft import get_adapter_state_dict, set_adapter_state_dict
from .base import Strategy, StrategyCheckpoint, validate_parallelism_config
from .context import EMPTY, PreparedObjects, StrategyContext

logger = logging.getLogger(__name__)

_CANONICAL = (("._checkpoint_wrapped_module", ""), ("_checkpoint_wrapped_module.", ""), ("_fsdp_wrapped_module.", ""),
              ("._fsdp_wrapped_module", ""), ("._orig_mod", ""))


def fsdp2_canonicalize_names(named_params: dict[str, Any]) -> dict[str, Any]:
    """``named_params`` with the names wrappers add (activation checkpointing, FSDP1, torch.compile) removed."""
    out = {}
    for name, value in named_params.items():
        if name.startswith("_orig_mod."):
            name = name[len("_orig_mod."):]
        for old, new in _CANONICAL:
            name = name.replace(old, new)
        out[name] = value
    return out


def _is_fsdp2(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _is_fsdp1(model: Any) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


def _ignored_modules(spec: Any, model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules ``ignored_modules`` names: a regex full-matched against module names, or modules."""
    if spec is None:
        return []
    if isinstance(spec, str):
        pattern = re.compile(spec)
        found = [m for name, m in model.named_modules() if name and pattern.fullmatch(name)]
        if not found:
            raise ValueError(f"ignored_modules={spec!r} matches no module name of {type(model).__name__}")
        return found
    return list(spec)


def get_fsdp2_grad_scaler(**kwargs: Any) -> Any:
    """The grad scaler for fp16 under FSDP: torch's ShardedGradScaler, which agrees on inf/NaN across ranks."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(**kwargs)


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: dict[Any, torch.nn.Parameter]) -> None:
    """Point ``optimizer`` at the sharded parameters: ``mapping`` takes an original parameter (or its id) to its shard.

    Optimizer state already held for a parameter moves with it. KeyError when a parameter has no
    sharded counterpart (stepping the stale tensor would silently train nothing).
    """
    # keyed by id: a tensor key would be compared with ``==`` on a hash collision
    by_id = {(key if isinstance(key, int) else id(key)): value for key, value in mapping.items()}
    moved_state = {}
    for group in optimizer.param_groups:
        new_params = []
        for p in group["params"]:
            new = by_id.get(id(p))
            if new is None:
                raise KeyError(f"an optimizer parameter of shape {tuple(p.shape)} belongs to no model prepared with FSDP, so it "
                               "cannot be switched to a sharded parameter; prepare the model with (or before) its optimizer")
            if p in optimizer.state:
                moved_state[new] = optimizer.state.pop(p)
            new_params.append(new)
        group["params"] = new_params
    optimizer.state.update(moved_state)


def _options(full: bool, model: Any = None, **kwargs: Any) -> Any:
    """State dict options: full or sharded, copied to host memory.

    FSDP1 frees the gathered storage it would copy from, so when its parameters already live in host
    memory the "copy to host" is skipped there (it would return tensors over freed storage); the
    tensors are cloned instead.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    offload = not (model is not None and _is_fsdp1(model) and _on_host(model))
    return StateDictOptions(full_state_dict=full, cpu_offload=offload, **kwargs)


def _on_host(model: torch.nn.Module) -> bool:
    param = next(iter(model.parameters()), None)
    return param is None or param.device == torch.device("cpu")


def _checkpoint_name(base: str, index: int, ext: str = "") -> str:
    return f"{base}{ext}" if index == 0 else f"{base}_{index}{ext}"


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def save_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: torch.nn.Module, output_dir: str | os.PathLike,
                    model_index: int = 0, adapter_only: bool = False, use_dcp: bool = True) -> str:
    """Save an FSDP model: ``pytorch_model_fsdp[_i].bin`` on rank 0 (FULL_STATE_DICT) or the DCP folder
    ``pytorch_model_fsdp_<i>`` (SHARDED_STATE_DICT, every rank writes its shards). Every rank must call it.

    ``adapter_only`` keeps a PEFT model's adapters alone (:func:`accel.utils.peft.get_adapter_state_dict`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    get_state = get_adapter_state_dict if adapter_only else get_model_state_dict
    output_dir = Path(output_dir)
    sharded = fsdp_plugin.is_sharded_state_dict
    state = get_state(model, options=_options(full=not sharded, model=model))
    if sharded:
        target = output_dir / f"{FSDP_MODEL_NAME}_{model_index}"
        target.mkdir(parents=True, exist_ok=True)
        dcp.save({"model": state}, checkpoint_id=str(target))
    else:
        target = output_dir / _checkpoint_name(FSDP_MODEL_NAME, model_index, ".bin")
        if _rank() == 0:
            output_dir.mkdir(parents=True, exist_ok=True)
            torch.save(state, target)
        _barrier()
    logger.info("FSDP model %d saved to %s", model_index, target)
    return target.name


def load_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: torch.nn.Module, input_dir: str | os.PathLike,
                    model_index: int = 0, adapter_only: bool = False, use_dcp: bool = True) -> Any:
    """Load what :func:`save_fsdp_model` wrote into the sharded ``model`` (any world size for DCP shards).

    ``adapter_only`` must match the save: the adapters are loaded and the frozen base weights left as they are."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    get_state, set_state = ((get_adapter_state_dict, set_adapter_state_dict) if adapter_only
                            else (get_model_state_dict, set_model_state_dict))
    input_dir = Path(input_dir)
    if fsdp_plugin.is_sharded_state_dict:
        folder = input_dir if (input_dir / ".metadata").is_file() else input_dir / f"{FSDP_MODEL_NAME}_{model_index}"
        if not (folder / ".metadata").is_file():
            raise FileNotFoundError(f"no sharded FSDP model checkpoint (DCP .metadata) in {folder}")
        state = get_state(model, options=_options(full=False, model=model))
        dcp.load({"model": state}, checkpoint_id=str(folder))
        return set_state(model, state, options=_options(full=False, model=model))
    path = input_dir / _checkpoint_name(FSDP_MODEL_NAME, model_index, ".bin")
    if not path.is_file():
        raise FileNotFoundError(f"no full FSDP model checkpoint at {path}")
    full = torch.load(path, map_location="cpu", weights_only=True) if _rank() == 0 else {}
    return set_state(model, full, options=_options(full=True, model=model, broadcast_from_rank0=True))


def save_fsdp_optimizer(fsdp_plugin: Any, accelerator: Any, optimizer: Any, model: torch.nn.Module,
                        output_dir: str | os.PathLike, optimizer_index: int = 0, use_dcp: bool = True) -> str:
    """Save the optimizer of an FSDP model: ``optimizer[_i].bin`` on rank 0 (FULL) or the DCP folder ``optimizer_<i>``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    output_dir = Path(output_dir)
    sharded = fsdp_plugin.is_sharded_state_dict
    options = _options(full=not sharded, model=model, **({"flatten_optimizer_state_dict": True} if sharded else {}))
    state = get_optimizer_state_dict(model, _torch_optimizer(optimizer), options=options)
    if sharded:
        target = output_dir / f"{OPTIMIZER_NAME}_{optimizer_index}"
        target.mkdir(parents=True, exist_ok=True)
        dcp.save({"optimizer": state}, checkpoint_id=str(target))
    else:
        target = output_dir / _checkpoint_name(OPTIMIZER_NAME, optimizer_index, ".bin")
        if _rank() == 0:
            output_dir.mkdir(parents=True, exist_ok=True)
            torch.save(state, target)
        _barrier()
    return target.name


def load_fsdp_optimizer(fsdp_plugin: Any, accelerator: Any, optimizer: Any, model: torch.nn.Module,
                        input_dir: str | os.PathLike, optimizer_index: int = 0, adapter_only: bool = False,
                        use_dcp: bool = True) -> None:
    """Load what :func:`save_fsdp_optimizer` wrote into ``optimizer`` (any world size for DCP shards)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    torch_optimizer = _torch_optimizer(optimizer)
    input_dir = Path(input_dir)
    if fsdp_plugin.is_sharded_state_dict:
        folder = input_dir if (input_dir / ".metadata").is_file() else input_dir / f"{OPTIMIZER_NAME}_{optimizer_index}"
        if not (folder / ".metadata").is_file():
            raise FileNotFoundError(f"no sharded FSDP optimizer checkpoint (DCP .metadata) in {folder}")
        # flat keys (state.<param>.<name>, param_groups.<param>.<name>): DCP reshards each entry on its own
        options = _options(full=False, model=model, flatten_optimizer_state_dict=True)
        state = get_optimizer_state_dict(model, torch_optimizer, options=options)
        dcp.load({"optimizer": state}, checkpoint_id=str(folder))
        set_optimizer_state_dict(model, torch_optimizer, state, options=options)
        return
    path = input_dir / _checkpoint_name(OPTIMIZER_NAME, optimizer_index, ".bin")
    if not path.is_file():
        raise FileNotFoundError(f"no full FSDP optimizer checkpoint at {path}")
    full = torch.load(path, map_location="cpu", weights_only=False) if _rank() == 0 else {}
    set_optimizer_state_dict(model, torch_optimizer, full, options=_options(full=True, model=model, broadcast_from_rank0=True))


def fsdp2_load_full_state_dict(accelerator: Any, model: torch.nn.Module, full_sd: dict[str, torch.Tensor],
                               cpu_offload: bool = False) -> None:
    """Fill the sharded ``model`` from rank 0's full state dict (the other ranks pass anything; rank 0's is broadcast)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, full_sd if _rank() == 0 else {}, options=_options(full=True, broadcast_from_rank0=True))


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


class FSDPStrategy(Strategy):
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

    @property
    def is_fsdp2(self) -> bool:
        """Whether this run shards with FSDP2 (``fully_shard``)."""
        return self.plugin.fsdp_version == 2

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
        validate_parallelism_config(config, self.state)  # sizes against the process count, before any group is made
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
        from ..precision import with_recipe_layers

        plan = super().plan_precision(requested, backend, autocast_handler=autocast_handler,
                                      scaler_handler=scaler_handler, fp8_handler=fp8_handler)
        plan = with_recipe_layers(plan, backend, fp8_handler)
        plugin = fsdp_plugin
        if plugin is None:
            raise ValueError("the FSDP strategy's precision needs its FullyShardedDataParallelPlugin")
        if plan.fp8 is not None and plugin.fsdp_version == 1:  # FSDP1 all-gathers the high-precision weights
            from ..utils.fp8 import without_float8_all_gather

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
            from ..utils.ao import register_fsdp_float8_scale_precompute

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

    def wrap_model(self, model: torch.nn.Module, device_placement: bool = True) -> torch.nn.Module:
        """Shard ``model`` (FSDP2 in place, FSDP1 in a wrapper) and record its parameter mapping."""
        if any(p.device.type == "meta" for p in model.parameters()) and not self.plugin.cpu_ram_efficient_loading:
            raise ValueError("the model has parameters on the meta device; load real weights first, or enable "
                             "cpu_ram_efficient_loading so rank 0's weights fill them")
        old_names = {id(p): n for n, p in fsdp2_canonicalize_names(dict(model.named_parameters())).items()}
        old_params = {id(p): p for p in model.parameters()}
        if self.is_fsdp2:
            wrapped = self._fully_shard(model, device_placement)
        else:
            wrapped = self._fsdp1(model, device_placement)
        new_named = fsdp2_canonicalize_names(dict(wrapped.named_parameters()))
        for pid, name in old_names.items():
            new = new_named.get(name)
            if new is not None and new is not old_params[pid]:
                # weakly: the unsharded original must be freed once no optimizer holds it, and a dead entry
                # must not match a new tensor that happens to get the same id
                self._param_map[pid] = (weakref.ref(old_params[pid]), new)
        return wrapped

    # FSDP2 ---------------------------------------------------------------
    def wrap_predicate(self, plugin: Any, model: torch.nn.Module) -> Callable[[torch.nn.Module, int], bool] | None:
        """Which submodules get their own FSDP unit: ``pred(module, nonwrapped_numel)``; None: only the root."""
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

        policy = plugin.auto_wrap_policy
        if policy is None:
            return None
        if policy is transformer_auto_wrap_policy or getattr(policy, "func", None) is transformer_auto_wrap_policy:
            classes = plugin._wrap_classes(model)
            return lambda module, numel: isinstance(module, classes)
        if policy is size_based_auto_wrap_policy or getattr(policy, "func", None) is size_based_auto_wrap_policy:
            threshold = getattr(policy, "keywords", {}).get("min_num_params", plugin.min_num_params) or 0
            if threshold <= 0:
                return None
            return lambda module, numel: numel >= threshold
        return lambda module, numel: bool(policy(module=module, recurse=False, nonwrapped_numel=numel))

    def _units(self, model: torch.nn.Module, predicate: Callable[[torch.nn.Module, int], bool] | None,
               ignored: set[int]) -> list[torch.nn.Module]:
        """Submodules (children before parents, root excluded) that get their own FSDP unit."""
        if predicate is None:
            return []
        units: list[torch.nn.Module] = []
        covered: set[int] = set(ignored)

        def visit(module: torch.nn.Module) -> None:
            for child in module.children():
                visit(child)
            if module is model or id(module) in ignored:
                return
            params = [p for p in module.parameters() if id(p) not in covered]
            numel = sum(p.numel() for p in params)
            if params and predicate(module, numel):
                units.append(module)
                covered.update(id(p) for p in params)

        visit(model)
        return units

    def apply_activation_checkpointing(self, model: torch.nn.Module, predicate: Any) -> torch.nn.Module:
        """Wrap the layers ``predicate`` selects in non-reentrant activation checkpointing (in place)."""

        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            apply_activation_checkpointing,
            checkpoint_wrapper,
        )

        if predicate is None:
            logger.warning("activation_checkpointing has no layers to checkpoint without an auto_wrap_policy; "
                           "set transformer_cls_names_to_wrap or min_num_params")
            return model
        targets = {id(m) for m in self._units(model, predicate, set())}
        wrap = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        if self.plugin.activation_checkpointing_offload:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import offload_wrapper

            # the input each checkpoint keeps for its recompute moves to host memory (save_on_cpu)
            plain = wrap
            wrap = lambda module: offload_wrapper(plain(module))  # noqa: E731
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrap, check_fn=lambda m: id(m) in targets)
        return model

    def _fully_shard(self, model: torch.nn.Module, device_placement: bool) -> torch.nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        plugin = self.plugin
        device = self.device
        ignored_modules = _ignored_modules(plugin.ignored_modules, model)
        ignored_params = {p for m in ignored_modules for p in m.parameters()}
        ignored_ids = {id(m) for m in ignored_modules}

        full_state = None
        buffers: dict[str, torch.Tensor] = {}
        if plugin.cpu_ram_efficient_loading:
            full_state, buffers = self._take_rank0_weights(model)
            model.to("meta")
        elif device_placement and not plugin.offloads_params:
            model.to(device)

        config = self.state.parallelism_config
        if config is not None and config.tp_enabled:
            self._apply_tensor_parallel(model)

        predicate = self.wrap_predicate(plugin, model)
        if plugin.activation_checkpointing:
            self.apply_activation_checkpointing(model, predicate)
        reshard = plugin.reshard_after_forward if plugin.reshard_after_forward is not None else True
        kwargs: dict[str, Any] = {
            "mesh": self._shard_mesh(),
            "reshard_after_forward": reshard,
            "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
            "offload_policy": plugin.cpu_offload,
        }
        if ignored_params:
            kwargs["ignored_params"] = ignored_params
        for unit in self._units(model, predicate, ignored_ids):
            fully_shard(unit, **kwargs)
        # the root's parameters are needed again as soon as backward starts: with resharding on, torch's
        # root heuristic (None) keeps them gathered instead of paying one more all-gather per step
        fully_shard(model, **{**kwargs, "reshard_after_forward": None if reshard is True else reshard})

        if full_state is not None:
            model.to_empty(device="cpu" if plugin.offloads_params else device)
            fsdp2_load_full_state_dict(None, model, full_state)
            for name, value in buffers.items():
                owner, _, leaf = name.rpartition(".")
                module = model.get_submodule(owner) if owner else model
                module._buffers[leaf] = value.to(device)
        return model

    def _take_rank0_weights(self, model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """cpu_ram_efficient_loading: rank 0's full state dict (host) and every rank's non-persistent buffers."""
        from ..utils.operations import broadcast_object_list

        rank0 = self.state.process_index == 0
        full = {k: v.detach().cpu() for k, v in model.state_dict().items()} if rank0 else {}
        persistent = set(model.state_dict().keys()) if rank0 else set()
        buffers = [{n: b.detach().cpu() for n, b in model.named_buffers() if n not in persistent} if rank0 else None]
        if self.state.num_processes > 1:
            broadcast_object_list(buffers, from_process=0)
        return full, buffers[0] or {}

    def _apply_tensor_parallel(self, model: torch.nn.Module) -> None:
        """Tensor parallelism with torch's ``parallelize_module`` and the plan the model gives (``tp_plan``)."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None)
        if not plan:
            raise ValueError(f"ParallelismConfig(tp_size={self.state.parallelism_config.tp_size}) needs a tensor parallel "
                             f"plan: give {type(model).__name__} a `tp_plan` dict of submodule name -> ParallelStyle "
                             "(or 'colwise'/'rowwise')")
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        resolved = {}
        for name, style in plan.items():
            if isinstance(style, str):
                if style not in styles:
                    raise ValueError(f"tp_plan[{name!r}] = {style!r}: accel knows {sorted(styles)} or a torch ParallelStyle")
                style = styles[style]()
            resolved[name] = style
        parallelize_module(model, self.device_mesh["tp"], resolved)

    # FSDP1 ---------------------------------------------------------------
    def _fsdp1(self, model: torch.nn.Module, device_placement: bool) -> torch.nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

        plugin = self.plugin
        originals = [weakref.ref(p) for p in model.parameters()]
        predicate = self.wrap_predicate(plugin, model)
        auto_wrap = None
        if predicate is not None:
            targets = {id(m) for m in self._units(model, predicate, {id(m) for m in _ignored_modules(plugin.ignored_modules, model)})}

            def auto_wrap(module: torch.nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
                return True if recurse else id(module) in targets
        if plugin.activation_checkpointing:
            self.apply_activation_checkpointing(model, predicate)
        strategy = plugin.sharding_strategy if plugin.sharding_strategy is not None else plugin.reshard_after_forward
        if device_placement and not plugin.offloads_params and not plugin.cpu_ram_efficient_loading:
            model.to(self.device)
        kwargs: dict[str, Any] = {
            "sharding_strategy": strategy,
            "cpu_offload": plugin.cpu_offload,
            "auto_wrap_policy": auto_wrap,
            "mixed_precision": plugin.mixed_precision_policy,
            "sync_module_states": bool(plugin.sync_module_states),
            "backward_prefetch": plugin.backward_prefetch,
            "forward_prefetch": bool(plugin.forward_prefetch),
            "use_orig_params": bool(plugin.use_orig_params),
            "limit_all_gathers": plugin.limit_all_gathers,
            "ignored_modules": _ignored_modules(plugin.ignored_modules, model) or None,
            "device_id": self.device,
        }
        if plugin.param_init_fn is materialise_on_rank_device:
            kwargs["param_init_fn"] = functools.partial(materialise_on_rank_device, device=self.device)
        elif plugin.param_init_fn is not None:
            kwargs["param_init_fn"] = plugin.param_init_fn
        if strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2):
            config = self.state.parallelism_config
            if config is not None and config.device_mesh is not None:
                kwargs["device_mesh"] = self._shard_mesh()
        wrapped = FullyShardedDataParallel(model, **kwargs)
        if not plugin.use_orig_params:
            # the original parameters are gone into flat parameters: an optimizer over all of them switches to those
            self._flat_groups.append((originals, [p for p in wrapped.parameters() if p.requires_grad]))
        return wrapped

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


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def _clip_sharded_grad_norm_(parameters: list[torch.Tensor], max_norm: float, norm_type: float = 2) -> torch.Tensor:
    """``clip_grad_norm_`` over DTensor (sharded) and plain gradients together: the norm of the full gradient."""
    from torch.distributed.tensor import DTensor

    norm_type = float(norm_type)
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norms = []
    for group in ([g for g in grads if isinstance(g, DTensor)], [g for g in grads if not isinstance(g, DTensor)]):
        if not group:
            continue
        norm = torch.nn.utils.get_total_norm(group, norm_type)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    device = norms[0].device
    norms = [n.to(device) for n in norms]
    if math.isinf(norm_type):
        total = torch.stack(norms).max()
    else:
        total = torch.stack([n.pow(norm_type) for n in norms]).sum().pow(1.0 / norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        local = _local(g)
        local.mul_(coef.to(local.device, local.dtype))
    return total
