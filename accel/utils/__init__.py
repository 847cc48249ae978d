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

# big-model inference
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


# test helpers, environment, unwrapping, compile/profile/fp8 handlers
_export(
    "accel.utils.environment",
    "are_libraries_initialized", "clear_environment", "convert_dict_to_env_variables", "get_int_from_env",
    "parse_choice_from_env", "parse_flag_from_env", "patch_environment", "purge_accelerate_environment", "str_to_bool",
)
_export(
    "accel.utils.other",
    "check_os_kernel", "clean_state_dict_for_safetensors", "compile_regions", "convert_bytes",
    "extract_model_from_parallel", "get_free_port", "get_model_tp_size", "get_pretty_name", "has_compiled_regions",
    "has_repeated_blocks", "is_compiled_module", "is_port_in_use", "is_repeated_blocks", "load", "merge_dicts",
    "model_has_dtensor", "recursive_getattr", "save", "wait_for_everyone", "write_basic_config",
)
_export("accel.utils.operations", "pad_input_tensors")
_export("accel.utils.ao", "convert_model_to_fp8_ao", "has_ao_layers")
_export("accel.utils.transformer_engine", "has_transformer_engine_layers")
_export("accel.utils.memory", "clear_device_cache", "should_reduce_batch_size")
_export(
    "accel.utils.dataclasses",
    "AORecipeKwargs", "BnbQuantizationConfig", "CustomDtype", "DynamoBackend", "FP8BackendType", "FP8RecipeKwargs",
    "MSAMPRecipeKwargs", "ProfileKwargs", "TERecipeKwargs", "TorchDynamoPlugin",
)
_export(
    "accel.utils.imports",
    "is_4bit_bnb_available", "is_8bit_bnb_available", "is_aim_available", "is_boto3_available",
    "is_clearml_available", "is_dvclive_available", "is_import_timer_available", "is_lomo_available",
    "is_matplotlib_available", "is_megatron_lm_available", "is_msamp_available", "is_neuron_available",
    "is_pippy_available", "is_pynvml_available", "is_sagemaker_available", "is_schedulefree_available",
    "is_sdaa_available", "is_swanlab_available", "is_torchao_available", "is_torchdata_available",
    "is_torchdata_stateful_dataloader_available", "is_trackio_available", "is_transformer_engine_available",
    "is_transformer_engine_mxfp8_available", "is_triton_available",
)


# DeepSpeed: the plugin, its config and the wrappers prepare() returns
_export(
    "accel.utils.deepspeed",
    "DeepSpeedEngineWrapper", "DeepSpeedOptimizerWrapper", "DeepSpeedPlugin", "DeepSpeedSchedulerWrapper",
    "DummyOptim", "DummyScheduler", "HfDeepSpeedConfig", "get_active_deepspeed_plugin", "map_pytorch_optim_to_deepspeed",
)

# FSDP and n-D parallelism: the plugin and configs, and Accelerate's fsdp_utils names
_export(
    "accel.utils.dataclasses",
    "DeepSpeedSequenceParallelConfig", "TorchContextParallelConfig", "TorchTensorParallelConfig", "TorchTensorParallelPlugin",
)
_export("accel.strategies.fsdp.plugin", "FullyShardedDataParallelPlugin", "get_module_class_from_name")
_export(
    "accel.utils.fsdp_utils",
    "disable_fsdp_ram_efficient_loading", "enable_fsdp_ram_efficient_loading", "fsdp2_apply_ac",
    "fsdp2_canonicalize_names", "fsdp2_load_full_state_dict", "fsdp2_prepare_model", "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler", "load_fsdp_model", "load_fsdp_optimizer", "merge_fsdp_weights", "save_fsdp_model",
    "save_fsdp_optimizer",
)


# Accelerate's remaining public names: constants, Megatron-LM, environment probes, launch helpers,
# fp8 (torchao, Transformer Engine), tqdm and torch_xla
_export(
    "accel.utils.constants",
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION", "MODEL_NAME", "OPTIMIZER_NAME", "PROFILE_PATTERN_NAME", "RNG_STATE_NAME",
    "SAFE_MODEL_NAME", "SAFE_WEIGHTS_INDEX_NAME", "SAFE_WEIGHTS_NAME", "SAFE_WEIGHTS_PATTERN_NAME", "SAMPLER_NAME",
    "SCALER_NAME", "SCHEDULER_NAME", "TORCH_DISTRIBUTED_OPERATION_TYPES", "TORCH_LAUNCH_PARAMS", "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME", "WEIGHTS_PATTERN_NAME", "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
)
_export("accel.parallelism_config", "ParallelismConfig")
_export("accel.utils.ao", "filter_first_and_last_linear_layers")
_export("accel.utils.dataclasses", "SageMakerDistributedType")
_export(
    "accel.utils.megatron_lm",
    "AbstractTrainStep", "BertTrainStep", "GPTTrainStep", "MegatronLMDummyDataLoader", "MegatronLMDummyScheduler",
    "MegatronLMPlugin", "T5TrainStep", "add_model_config_to_megatron_parser", "avg_losses_across_data_parallel_group",
)
_export(
    "accel.utils.environment",
    "check_cuda_fp8_capability", "check_cuda_p2p_ib_support", "get_cpu_distributed_information", "get_current_device_type",
    "get_gpu_info", "set_numa_affinity",
)
_export(
    "accel.utils.imports",
    "deepspeed_required", "is_amdsmi_available", "is_bitsandbytes_multi_backend_available", "is_habana_gaudi1",
    "is_rocm_available", "torchao_required",
)
_export("accel.utils.tqdm", "tqdm")
_export("accel.utils.modeling", "get_grad_scaler", "get_mixed_precision_context_manager")
_export("accel.utils.operations", "GatheredParameters")
_export("accel.utils.bnb", "has_4bit_bnb_layers", "load_and_quantize_model")
_export("accel.utils.fsdp_utils", "ensure_weights_retied")
_export(
    "accel.utils.launch",
    "PrepareForLaunch", "prepare_deepspeed_cmd_env", "prepare_multi_gpu_env", "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env", "prepare_tpu",
)
_export("accel.utils.other", "compile_regions_deepspeed", "compile_regions_fsdp2", "get_module_children_bottom_up")
_export("accel.utils.torch_xla", "install_xla")
_export("accel.utils.transformer_engine", "apply_fp8_autowrap", "contextual_fp8_autocast", "convert_model")

__getattr__, __dir__ = lazy_exports('accel.utils', globals(), _LAZY)
