"""Big-model utilities with Accelerate's names: sizes, tied weights, memory budgets and device maps,
checkpoint loading, offloaded models. Device-neutral: integer device ids are the active backend's devices.
"""

from __future__ import annotations

# private names accel.big_modeling imports from here, and the checkpoint file names, stay importable
from .placement import as_torch_device as _as_torch_device  # noqa: F401
from ...facts.checkpoint import SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME  # noqa: F401
from .checkpoint import (
    load_checkpoint_in_model,
    load_offloaded_weights,
    load_state_dict,
)
from .memory_map import (
    check_device_map,
    clean_device_map,
    fallback_allocate,
    get_balanced_memory,
    get_max_memory,
    get_module_size_with_ties,
    infer_auto_device_map,
)
from .offloaded import (
    align_module_device,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
)
from .precision import get_grad_scaler, get_mixed_precision_context_manager
from .sizes import (
    calculate_maximum_sizes,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    get_max_layer_size,
    get_module_leaves,
    get_non_persistent_buffers,
    id_tensor_storage,
    named_module_tensors,
)
from .tensors import check_device_same, is_peft_model, set_module_tensor_to_device
from .ties import (  # noqa: F401
    _getattr_path,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    retie_parameters,
)

__all__ = [
    "WEIGHTS_INDEX_NAME",
    "align_module_device",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "fallback_allocate",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_grad_scaler",
    "get_max_layer_size",
    "get_max_memory",
    "get_mixed_precision_context_manager",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "is_peft_model",
    "load_checkpoint_in_model",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
]
