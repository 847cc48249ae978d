"""Sharding a model as the FSDP plugin says: the wrapping half of the FSDP strategy."""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any, Callable

import torch

from .plugin import materialise_on_rank_device
from .sharding import _ignored_modules, fsdp2_canonicalize_names
from .state_dict import fsdp2_load_full_state_dict

logger = logging.getLogger(__name__)


class FSDPWrapping:
    """How :class:`~accel.strategies.fsdp.strategy.FSDPStrategy` shards a model: wrap policy, activation
    checkpointing, FSDP2 ``fully_shard`` (with rank-0 loading and tensor parallelism) or the FSDP1 wrapper.

    A mixin of the strategy, kept apart because wrapping is its largest concern; it reads the strategy's
    ``plugin``, ``state``, ``device``, meshes and parameter records.
    """

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
        from ...utils.operations import broadcast_object_list

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
