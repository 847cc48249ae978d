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

Everything from torch.distributed.fsdp is imported when first used. The package holds the plugin
(:mod:`.plugin`), the strategy (:mod:`.strategy`), how it wraps a model (:mod:`.wrapping`), the state-dict
files (:mod:`.state_dict`), PEFT adapters' state dicts (:mod:`.peft`) and the parameter and gradient helpers
they share (:mod:`.sharding`). Every public name is re-exported here and loads its module on first use, so
``FullyShardedDataParallelPlugin`` comes without the strategy.
"""

from __future__ import annotations

from ..._lazy import lazy_exports

# public name -> module that defines it (resolved lazily)
_LAZY = {
    "FullyShardedDataParallelPlugin": "accel.strategies.fsdp.plugin",
    "get_module_class_from_name": "accel.strategies.fsdp.plugin",
    "FSDPStrategy": "accel.strategies.fsdp.strategy",
    "fsdp2_apply_ac": "accel.strategies.fsdp.strategy",
    "fsdp2_prepare_model": "accel.strategies.fsdp.strategy",
    "fsdp2_canonicalize_names": "accel.strategies.fsdp.sharding",
    "fsdp2_switch_optimizer_parameters": "accel.strategies.fsdp.sharding",
    "get_fsdp2_grad_scaler": "accel.strategies.fsdp.sharding",
    "fsdp2_load_full_state_dict": "accel.strategies.fsdp.state_dict",
    "load_fsdp_model": "accel.strategies.fsdp.state_dict",
    "load_fsdp_optimizer": "accel.strategies.fsdp.state_dict",
    "save_fsdp_model": "accel.strategies.fsdp.state_dict",
    "save_fsdp_optimizer": "accel.strategies.fsdp.state_dict",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
