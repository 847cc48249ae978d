"""accel: an Accelerate-compatible Accelerator and a backend qualification harness for PyTorch.

Importing accel stays cheap: submodules load on first attribute access.
"""

from __future__ import annotations

from accel._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it (resolved lazily, PEP 562)
_LAZY = {
    "Accelerator": "accel.accelerator",
    "PartialState": "accel.state",
    "AcceleratorState": "accel.state",
    "GradientState": "accel.state",
    "DistributedType": "accel.utils.dataclasses",
    "AutocastKwargs": "accel.utils.dataclasses",
    "DDPCommunicationHookType": "accel.utils.dataclasses",
    "DataLoaderConfiguration": "accel.utils.dataclasses",
    "DistributedDataParallelKwargs": "accel.utils.dataclasses",
    "GradScalerKwargs": "accel.utils.dataclasses",
    "InitProcessGroupKwargs": "accel.utils.dataclasses",
    "ProjectConfiguration": "accel.utils.dataclasses",
    "GradientAccumulationPlugin": "accel.utils.dataclasses",
    "ProfileKwargs": "accel.utils.dataclasses",
    "load_checkpoint_in_model": "accel.utils.modeling",
    "skip_first_batches": "accel.data_loader",
    "synchronize_rng_states": "accel.utils.random",
    "is_rich_available": "accel.utils.imports",
    "find_executable_batch_size": "accel.utils.memory",
    "notebook_launcher": "accel.launchers",
    "debug_launcher": "accel.launchers",
    "get_backend": "accel.backends",
    "DeepSpeedPlugin": "accel.utils.deepspeed",
    # big-model inference
    "init_empty_weights": "accel.big_modeling",
    "init_on_device": "accel.big_modeling",
    "cpu_offload": "accel.big_modeling",
    "cpu_offload_with_hook": "accel.big_modeling",
    "disk_offload": "accel.big_modeling",
    "dispatch_model": "accel.big_modeling",
    "load_checkpoint_and_dispatch": "accel.big_modeling",
    "infer_auto_device_map": "accel.utils.modeling",
    # FSDP and n-D parallelism
    "FullyShardedDataParallelPlugin": "accel.strategies.fsdp.plugin",
    "ParallelismConfig": "accel.parallelism_config",
    # pipeline-parallel inference
    "prepare_pippy": "accel.inference",
}


__getattr__, __dir__ = lazy_exports('accel', globals(), _LAZY)
