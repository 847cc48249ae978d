"""accel.strategies.sequence_parallel: the checks and arithmetic around DeepSpeed Ulysses and torch context
parallelism that need no process group (the multi-rank runs are in suites/test_sequence_parallel.py)."""

import pytest
import torch

from accel.parallelism_config import ParallelismConfig
from accel.strategies.sequence_parallel import (
    context_parallel_support,
    deepspeed_ulysses_dl_adapter,
    register_deepspeed_ulysses,
    sdpa_kernel_op,
    sequence_parallel_train_batch_size,
)


def test_train_batch_size_counts_each_sequence_group_once():
    assert sequence_parallel_train_batch_size(2, 3, 8, 4) == 2 * 3 * 8 // 4
    with pytest.raises(ValueError, match="must divide"):
        sequence_parallel_train_batch_size(1, 1, 6, 4)


def test_nothing_happens_without_sequence_parallelism():
    assert register_deepspeed_ulysses(torch.nn.Linear(2, 2), ParallelismConfig(), micro_batch_size=1) is None
    loader = [1, 2]
    assert deepspeed_ulysses_dl_adapter(loader, ParallelismConfig(), "cpu") is loader
    assert register_deepspeed_ulysses(torch.nn.Linear(2, 2), None, micro_batch_size=1) is None


def test_a_model_without_a_transformers_config_is_refused():
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    config = ParallelismConfig(sp_backend="deepspeed", sp_size=2)
    with pytest.raises(ValueError, match="config"):
        register_deepspeed_ulysses(torch.nn.Linear(2, 2), config, micro_batch_size=1)


def test_context_parallelism_on_the_host_names_the_kernel_torch_cannot_shard():
    assert sdpa_kernel_op("cpu") == "aten._scaled_dot_product_flash_attention_for_cpu.default"
    supported, why = context_parallel_support("cpu")
    assert not supported
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in why
    assert "aten._scaled_dot_product_flash_attention.default" in why  # what torch does shard
