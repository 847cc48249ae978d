"""FullyShardedDataParallelPlugin: Accelerate's fields, FSDP_* environment variables, defaults and errors."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    CPUOffloadPolicy,
    MixedPrecision,
    MixedPrecisionPolicy,
    OffloadPolicy,
    ShardingStrategy,
    StateDictType,
)
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

from accel.utils import FullyShardedDataParallelPlugin, get_module_class_from_name
from accel.strategies.fsdp.plugin import materialise_on_rank_device


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("FSDP_"):
            monkeypatch.delenv(name)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)


class Net(torch.nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(4, 1)


def test_defaults_follow_accelerate_per_version():
    v1 = FullyShardedDataParallelPlugin()
    assert v1.fsdp_version == 1
    assert v1.sharding_strategy == ShardingStrategy.FULL_SHARD
    assert v1.state_dict_type == StateDictType.FULL_STATE_DICT
    assert isinstance(v1.cpu_offload, CPUOffload) and not v1.cpu_offload.offload_params
    assert v1.auto_wrap_policy is None and v1.use_orig_params is False and v1.sync_module_states is False

    v2 = FullyShardedDataParallelPlugin(fsdp_version=2)
    assert v2.reshard_after_forward is True and v2.sharding_strategy is None
    assert v2.state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert type(v2.cpu_offload) is OffloadPolicy
    assert v2.use_orig_params is None and v2.sync_module_states is None and v2.forward_prefetch is None


def test_environment_of_accel_launch_fills_the_fields(monkeypatch):
    env = {
        "FSDP_VERSION": "2", "FSDP_RESHARD_AFTER_FORWARD": "false", "FSDP_OFFLOAD_PARAMS": "true",
        "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP", "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block,Linear",
        "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT", "FSDP_ACTIVATION_CHECKPOINTING": "true",
        "FSDP_CPU_RAM_EFFICIENT_LOADING": "true", "FSDP_IGNORED_MODULES": "head",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is False
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) and plugin.offloads_params
    assert plugin.auto_wrap_policy is transformer_auto_wrap_policy
    assert plugin.transformer_cls_names_to_wrap == ["Block", "Linear"]
    assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT and not plugin.is_sharded_state_dict
    assert plugin.activation_checkpointing is True and plugin.cpu_ram_efficient_loading is True
    assert plugin.ignored_modules == "head"


def test_fsdp1_environment_names_and_numbers(monkeypatch):
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "2")
    monkeypatch.setenv("FSDP_BACKWARD_PREFETCH", "BACKWARD_POST")
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "SIZE_BASED_WRAP")
    monkeypatch.setenv("FSDP_MIN_NUM_PARAMS", "2000")
    monkeypatch.setenv("FSDP_USE_ORIG_PARAMS", "true")
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "true")
    with pytest.warns(UserWarning, match="sync_module_states cannot be False"):
        plugin = FullyShardedDataParallelPlugin()
    assert plugin.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
    assert plugin.backward_prefetch == BackwardPrefetch.BACKWARD_POST
    assert plugin.auto_wrap_policy is size_based_auto_wrap_policy and plugin.min_num_params == 2000
    assert plugin.use_orig_params is True and plugin.sync_module_states is True
    assert plugin.param_init_fn is materialise_on_rank_device  # meta modules are materialised on the rank's device


def test_meta_modules_are_materialised_on_the_given_device_or_the_backends():
    with torch.device("meta"):
        given, default = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    materialise_on_rank_device(given, device=torch.device("cpu"))
    materialise_on_rank_device(default)  # the active backend's current device: the host here
    assert given.weight.device.type == default.weight.device.type == "cpu"
    assert not given.weight.is_meta and given.weight.shape == (2, 2)


def test_explicit_values_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("FSDP_VERSION", "1")
    monkeypatch.setenv("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT")
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="sharded_state_dict")
    assert plugin.fsdp_version == 2 and plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT


@pytest.mark.parametrize("kwargs, message", [
    ({"fsdp_version": 2, "reshard_after_forward": ShardingStrategy.FULL_SHARD}, "not supported with FSDP2"),
    ({"fsdp_version": 1, "reshard_after_forward": True}, "not supported with FSDP1"),
    ({"fsdp_version": 2, "state_dict_type": "LOCAL_STATE_DICT"}, "FSDP2 does not support LOCAL_STATE_DICT"),
    ({"auto_wrap_policy": "layer_wrap"}, "Invalid auto wrap policy: layer_wrap"),
    ({"auto_wrap_policy": "size_based_wrap", "min_num_params": "100"}, "`min_num_params` must be an integer"),
    ({"fsdp_version": 2, "forward_prefetch": True}, "forward_prefetch is not yet implemented in FSDP2"),
    ({"activation_checkpointing_offload": True}, "requires `activation_checkpointing=True`"),
    ({"activation_checkpointing": True, "activation_checkpointing_offload": True}, "requires `fsdp_version=2`"),
    ({"fsdp_version": 2, "cpu_offload": CPUOffload(offload_params=True)}, "must be an instance of `torch.distributed.fsdp.OffloadPolicy`"),
    ({"fsdp_version": 1, "mixed_precision_policy": MixedPrecisionPolicy()}, "must be an instance of `torch.distributed.fsdp.MixedPrecision`"),
    ({"mixed_precision_policy": "fp64"}, "Invalid mixed precision: fp64"),
    ({"fsdp_version": 3}, "fsdp_version must be 1 or 2"),
    ({"sharding_strategy": "QUARTER_SHARD"}, "sharding_strategy must be one of"),
])
def test_bad_values_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FullyShardedDataParallelPlugin(**kwargs)


def test_mixed_precision_from_names_and_dicts():
    v2 = FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy="bf16")
    assert v2.mixed_precision_policy == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                                                             output_dtype=torch.bfloat16)
    v1 = FullyShardedDataParallelPlugin(mixed_precision_policy={"param_dtype": torch.float16, "reduce_dtype": torch.float32,
                                                                "buffer_dtype": torch.float32})
    assert isinstance(v1.mixed_precision_policy, MixedPrecision) and v1.mixed_precision_policy.param_dtype == torch.float16
    with pytest.raises(ValueError, match="Invalid mixed precision policy"):
        FullyShardedDataParallelPlugin(mixed_precision_policy={"param_dtype": torch.float16})


def test_transformer_wrap_binds_classes_and_names_a_missing_one():
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
    plugin.set_auto_wrap_policy(Net())  # default: the model's _no_split_modules
    assert plugin.transformer_cls_names_to_wrap == ["Block"]
    assert plugin.auto_wrap_policy.keywords["transformer_layer_cls"] == {Block}

    missing = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Decoder"])
    with pytest.raises(ValueError, match="Could not find the transformer layer class Decoder in the model") as info:
        missing.set_auto_wrap_policy(Net())
    assert "Block" in str(info.value)  # it lists what the model has


def test_size_wrap_binds_the_threshold_and_zero_means_none():
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=7)
    plugin.set_auto_wrap_policy(Net())
    assert plugin.auto_wrap_policy.keywords["min_num_params"] == 7
    zero = FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap")
    zero.set_auto_wrap_policy(Net())
    assert zero.auto_wrap_policy is None


def test_get_module_class_from_name():
    assert get_module_class_from_name(Net(), "Block") is Block
    assert get_module_class_from_name(Net(), "Linear") is torch.nn.Linear
    assert get_module_class_from_name(Net(), "Conv2d") is None


def test_reachable_where_accelerate_has_it():
    import accel
    import accel.utils.dataclasses as dataclasses

    assert accel.FullyShardedDataParallelPlugin is FullyShardedDataParallelPlugin
    assert dataclasses.FullyShardedDataParallelPlugin is FullyShardedDataParallelPlugin
    from accel.utils import TorchContextParallelConfig, TorchTensorParallelConfig, TorchTensorParallelPlugin  # noqa: F401
