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

Everything from torch.distributed.fsdp is imported when first used. The package holds the strategy
(:mod:`.strategy`), how it wraps a model (:mod:`.wrapping`), the state-dict files (:mod:`.state_dict`) and
the parameter and gradient helpers they share (:mod:`.sharding`); every name is re-exported here.
"""

from .sharding import (  # noqa: F401 - the private helpers stay importable from here too
    _CANONICAL,
    _clip_sharded_grad_norm_,
    _ignored_modules,
    _is_fsdp1,
    _is_fsdp2,
    _local,
    fsdp2_canonicalize_names,
    fsdp2_switch_optimizer_parameters,
    get_fsdp2_grad_scaler,
)
from .state_dict import (  # noqa: F401
    _barrier,
    _checkpoint_name,
    _on_host,
    _options,
    _rank,
    _torch_optimizer,
    fsdp2_load_full_state_dict,
    load_fsdp_model,
    load_fsdp_optimizer,
    save_fsdp_model,
    save_fsdp_optimizer,
)
from .strategy import FSDPStrategy, fsdp2_apply_ac, fsdp2_prepare_model

__all__ = [
    "FSDPStrategy",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "save_fsdp_model",
    "save_fsdp_optimizer",
]
