"""Utilities with Accelerate's names (``accel.utils.set_seed``, ``accel.utils.gather``, ...).

Names resolve lazily so ``import accel.utils`` stays cheap.
"""

from __future__ import annotations

from accel._lazy import lazy_exports

_LAZY: dict[str, str] = {}


def _export(module: str, *names: str) -> None:
    for name in names:
        _LAZY[name] = module


_export(
    "accel.utils.dataclasses",
    "ComputeEnvironment", "DataLoaderConfiguration", "DistributedType", "GradientAccumulationPlugin",
    "InitProcessGroupKwargs", "KwargsHandler", "PrecisionType", "RNGType", "AutocastKwargs",
    "DDPCommunicationHookType", "DistributedDataParallelKwargs", "GradScalerKwargs", "LoggerType",
    "ProjectConfiguration",
)

_export("accel.utils.random", "set_seed", "synchronize_rng_state", "synchronize_rng_states")
_export(
    "accel.utils.imports",
    "compare_versions",
    "is_torch_version",
    "is_cuda_available",
    "is_xpu_available",
    "is_mps_available",
    "is_hpu_available",
    "is_npu_available",
    "is_mlu_available",
    "is_musa_available",
    "is_torch_xla_available",
    "is_fp16_available",
    "is_bf16_available",
    "is_fp8_available",
    "is_torch_distributed_available",
    "is_xccl_available",
    "is_ccl_available",
    "is_deepspeed_available",
    "is_tensorboard_available",
    "is_wandb_available",
    "is_comet_ml_available",
    "is_mlflow_available",
    "is_rich_available",
    "is_tqdm_available",
    "is_pandas_available",
    "is_numpy_available",
    "is_datasets_available",
    "is_transformers_available",
    "is_peft_available",
    "is_timm_available",
    "is_torchvision_available",
    "is_pytest_available",
    "is_safetensors_available",
    "is_psutil_available",
    "is_bnb_available",
    "is_weights_only_available",
)

_export(
    "accel.utils.operations",
    "CannotPadNestedTensorWarning", "ConvertOutputsToFp32", "DistributedOperationException", "TensorInformation",
    "broadcast", "broadcast_object_list", "chained_operation", "concatenate", "convert_outputs_to_fp32",
    "convert_to_fp32", "copy_tensor_to_devices", "find_batch_size", "find_device", "gather", "gather_object",
    "get_data_structure", "get_shape", "honor_type", "ignorant_find_batch_size", "initialize_tensors",
    "is_namedtuple", "is_tensor_information", "is_torch_tensor", "listify", "pad_across_processes",
    "recursively_apply", "reduce", "send_to_device", "slice_tensors", "verify_operation",
)


_export("accel.utils.memory", "find_executable_batch_size", "release_memory")

# big-model inference (issue 15)
_export(
    "accel.utils.modeling",
    "align_module_device", "calculate_maximum_sizes", "check_device_map", "check_device_same",
    "check_tied_parameters_in_config", "check_tied_parameters_on_same_device", "clean_device_map",
    "compute_module_sizes", "compute_module_total_buffer_size", "convert_file_size_to_int", "dtype_byte_size",
    "find_tied_parameters", "get_balanced_memory", "get_max_layer_size", "get_max_memory",
    "get_module_size_with_ties", "get_non_persistent_buffers", "get_state_dict_from_offload",
    "get_state_dict_offloaded_model", "has_offloaded_params", "id_tensor_storage", "infer_auto_device_map",
    "is_peft_model", "load_checkpoint_in_model", "load_offloaded_weights", "load_state_dict",
    "named_module_tensors", "retie_parameters", "set_module_tensor_to_device",
)
_export(
    "accel.utils.offload",
    "OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict", "load_offloaded_weight",
    "offload_state_dict", "offload_weight", "save_offload_index",
)


__getattr__, __dir__ = lazy_exports('accel.utils', globals(), _LAZY)
