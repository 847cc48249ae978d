"""Accelerate-compatible helpers: environment, unwrapping, saving, logging, handlers, OOM wording."""

from __future__ import annotations

import logging
import os
import platform
import warnings
from unittest import mock

import pytest
import torch

from accel.state import PartialState
from accel.test_utils.training import RegressionModel
from dist_utils import run_distributed


# ---------------------------------------------------------------------------- environment
def test_patch_environment_sets_upper_case_and_restores_even_on_error(monkeypatch):
    from accel.utils import patch_environment

    monkeypatch.setenv("ACCEL_H4_KEEP", "old")
    monkeypatch.delenv("ACCEL_H4_NEW", raising=False)
    with pytest.raises(RuntimeError):
        with patch_environment(accel_h4_keep=1, accel_h4_new=2.5):
            assert os.environ["ACCEL_H4_KEEP"] == "1" and os.environ["ACCEL_H4_NEW"] == "2.5"
            raise RuntimeError("inside")
    assert os.environ["ACCEL_H4_KEEP"] == "old" and "ACCEL_H4_NEW" not in os.environ


def test_clear_environment_empties_and_restores(monkeypatch):
    from accel.utils import clear_environment

    monkeypatch.setenv("ACCEL_H4_X", "1")
    with clear_environment():
        assert dict(os.environ) == {}
        os.environ["ACCEL_H4_INSIDE"] = "1"
    assert os.environ["ACCEL_H4_X"] == "1" and "ACCEL_H4_INSIDE" not in os.environ


def test_purge_accelerate_environment_on_functions_and_classes(monkeypatch):
    from accel.utils import purge_accelerate_environment

    monkeypatch.setenv("ACCELERATE_H4_OLD", "1")

    @purge_accelerate_environment
    def leaky():
        os.environ["ACCELERATE_H4_OLD"] = "changed"
        os.environ["ACCELERATE_H4_NEW"] = "x"
        os.environ["ACCEL_H4_NEW"] = "y"
        os.environ["H4_UNRELATED"] = "z"

    leaky()
    assert os.environ["ACCELERATE_H4_OLD"] == "1"
    assert "ACCELERATE_H4_NEW" not in os.environ and "ACCEL_H4_NEW" not in os.environ
    assert os.environ.pop("H4_UNRELATED") == "z"  # only the two prefixes are purged

    @purge_accelerate_environment
    class Base:
        def test_a(self):
            os.environ["ACCELERATE_H4_CLS"] = "1"

    class Child(Base):
        def test_b(self):
            os.environ["ACCELERATE_H4_CHILD"] = "1"

    Child().test_a()
    Child().test_b()
    assert "ACCELERATE_H4_CLS" not in os.environ and "ACCELERATE_H4_CHILD" not in os.environ


def test_env_readers(monkeypatch):
    from accel.utils import get_int_from_env, parse_choice_from_env, parse_flag_from_env, str_to_bool
    from accel.utils.environment import env_value

    assert str_to_bool("YES") == 1 and str_to_bool("off", to_bool=True) is False
    with pytest.raises(ValueError, match="maybe"):
        str_to_bool("maybe")
    monkeypatch.setenv("H4_FLAG", "true")
    assert parse_flag_from_env("H4_FLAG") is True and parse_flag_from_env("H4_UNSET_FLAG", True) is True
    monkeypatch.setenv("H4_A", "-1")
    monkeypatch.setenv("H4_B", "7")
    assert get_int_from_env(["H4_A", "H4_B"], 3) == 7 and get_int_from_env(["H4_NONE"], 3) == 3
    monkeypatch.setenv("H4_BAD", "seven")
    with pytest.raises(ValueError, match="H4_BAD"):
        get_int_from_env(["H4_BAD"], 0)
    assert parse_choice_from_env("H4_NONE", "fp16") == "fp16"
    monkeypatch.setenv("ACCELERATE_H4_SUFFIX", "theirs")
    assert env_value("H4_SUFFIX") == "theirs"
    monkeypatch.setenv("ACCEL_H4_SUFFIX", "ours")
    assert env_value("H4_SUFFIX") == "ours"  # accel's own name wins


def test_convert_dict_to_env_variables_drops_unsafe_items(caplog):
    from accel.utils import convert_dict_to_env_variables

    with caplog.at_level(logging.WARNING, logger="accel.utils.environment"):
        lines = convert_dict_to_env_variables({"A": "1", "B": "<x", "C": "two words", "D": "", "E": "ok"})
    assert lines == ["A=1\n", "E=ok\n"]
    assert sum("Skipping" in r.message for r in caplog.records) == 3


# ---------------------------------------------------------------------------- other
def test_extract_model_from_parallel_unwraps_and_keeps_compile():
    from accel.utils import extract_model_from_parallel

    model = RegressionModel()
    assert extract_model_from_parallel(torch.nn.DataParallel(model)) is model
    compiled = torch.compile(torch.nn.DataParallel(model))
    kept = extract_model_from_parallel(compiled)
    assert kept is compiled and kept._orig_mod is model
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is model


def test_compile_regions_compiles_each_repeated_block_and_runs():
    from accel.utils import compile_regions, extract_model_from_parallel
    from accel.utils.other import is_compiled_module

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
            self.head = torch.nn.Linear(4, 1)

        def forward(self, x):
            for block in self.blocks:
                x = torch.relu(block(x))
            return self.head(x)

    net = Net()
    compiled = compile_regions(net, backend="eager")
    assert compiled is not net and all(is_compiled_module(b) for b in compiled.blocks)
    assert is_compiled_module(compiled.head) and not is_compiled_module(net.blocks[0])  # the input is untouched
    x = torch.randn(2, 4)
    assert torch.allclose(compiled(x), net(x))
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is net


def test_get_model_tp_size_reads_both_transformers_layouts():
    from types import SimpleNamespace

    from accel.utils import get_model_tp_size

    model = RegressionModel()
    assert get_model_tp_size(model) is None
    model.tp_size = 2
    assert get_model_tp_size(model) == 2
    model.tp_size = None
    model.config = SimpleNamespace(distributed_config={"tp_size": 8})
    assert get_model_tp_size(model) == 8


def test_save_safetensors_drops_tied_duplicates_with_a_warning(tmp_path, caplog):
    from collections import OrderedDict

    from safetensors.torch import load_file

    from accel.utils import save

    PartialState()
    linear = torch.nn.Linear(3, 3)
    state = OrderedDict(a=linear.weight, b=linear.weight, c=torch.ones(2))
    with caplog.at_level(logging.WARNING, logger="accel.utils.other"):
        save(state, tmp_path / "m.safetensors", safe_serialization=True)
    assert any("Removed shared tensor {'b'}" in r.message for r in caplog.records)
    assert sorted(load_file(tmp_path / "m.safetensors")) == ["a", "c"]
    save({"x": torch.arange(3)}, tmp_path / "m.pt")
    assert torch.load(tmp_path / "m.pt")["x"].tolist() == [0, 1, 2]


def _save_on_two_ranks(folder):
    from accel.utils import save

    save({"rank": PartialState().process_index}, os.path.join(folder, f"from_{PartialState().process_index}.pt"))
    return sorted(os.listdir(folder))


def test_save_writes_on_the_main_process_only(tmp_path):
    results = run_distributed(_save_on_two_ranks, 2, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["from_0.pt"]
    assert results[0] in (["from_0.pt"], [])


@pytest.mark.parametrize("release, system, warns", [("5.4.0-35-generic", "Linux", True),
                                                     ("5.15.0-35-generic", "Linux", False),
                                                     ("5.4.0", "Darwin", False)])
def test_check_os_kernel(release, system, warns, caplog):
    from accel.utils import check_os_kernel

    PartialState()
    with mock.patch("platform.uname", return_value=mock.Mock(release=release, system=system)):
        with caplog.at_level(logging.WARNING):
            check_os_kernel()
    messages = [r.message for r in caplog.records if "kernel" in r.message]
    assert bool(messages) == warns
    if warns:
        assert "5.4.0" in messages[0] and "5.5.0" in messages[0]


# ---------------------------------------------------------------------------- logging
def test_get_logger_prefixes_rank_points_at_the_caller_and_needs_state(caplog):
    from accel.logging import get_logger
    from accel.state import is_initialized

    logger = get_logger("accel.h4.test", log_level="INFO")
    if not is_initialized():
        with pytest.raises(RuntimeError, match="PartialState"):
            logger.info("too early")
    PartialState()
    with caplog.at_level(logging.INFO, logger="accel.h4.test"):
        logger.info("hello %s", "there")
        line = __import__("inspect").currentframe().f_lineno - 1
    record = caplog.records[-1]
    assert record.getMessage() == "[RANK 0] hello there"
    assert record.lineno == line and record.funcName == "test_get_logger_prefixes_rank_points_at_the_caller_and_needs_state"
    with pytest.raises(ValueError, match="log level"):
        get_logger("accel.h4.test", log_level="LOUD")


def _log_on_ranks():
    import io

    from accel.logging import get_logger

    PartialState()
    stream = io.StringIO()
    logger = get_logger("accel.h4.ranks", log_level="INFO")
    logger.logger.addHandler(logging.StreamHandler(stream))
    logger.logger.propagate = False
    logger.info("main only")
    logger.info("everyone", main_process_only=False)
    logger.info("in order", in_order=True)
    logger.warning_once("once")
    logger.warning_once("once")
    return stream.getvalue().splitlines()


def test_get_logger_main_process_only_and_in_order_on_two_ranks():
    rank0, rank1 = run_distributed(_log_on_ranks, 2)
    assert rank0 == ["[RANK 0] main only", "[RANK 0] everyone", "[RANK 0] in order", "[RANK 0] once"]
    assert rank1 == ["[RANK 1] everyone", "[RANK 1] in order"]


# ---------------------------------------------------------------------------- handlers
def test_torch_dynamo_plugin_reads_both_env_prefixes(monkeypatch):
    from accel.utils import TorchDynamoPlugin, clear_environment

    with clear_environment():
        os.environ["ACCELERATE_DYNAMO_BACKEND"] = "inductor"
        os.environ["ACCEL_DYNAMO_MODE"] = "max-autotune"
        os.environ["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "yes"
        plugin = TorchDynamoPlugin()
        assert plugin.to_kwargs() == {"backend": "inductor", "mode": "max-autotune"}
        assert plugin.use_regional_compilation is True
    with pytest.raises(ValueError, match="unknown dynamo backend"):
        TorchDynamoPlugin(backend="warp-drive")


def test_torch_dynamo_plugin_kwargs_compile_for_real():
    from accel.utils import TorchDynamoPlugin

    kwargs = TorchDynamoPlugin(backend="inductor").to_kwargs()
    model = torch.compile(RegressionModel(a=2.0, b=1.0), **kwargs)
    assert torch.allclose(model(torch.tensor([1.0, 2.0])), torch.tensor([3.0, 5.0]))


def test_profile_kwargs_build_a_cpu_profiler():
    from accel.utils import ProfileKwargs

    traces = []
    profiler = ProfileKwargs(activities=["cpu"], schedule_option={"wait": 0, "warmup": 0, "active": 1, "repeat": 1},
                             on_trace_ready=traces.append).build()
    with profiler as prof:
        torch.ones(8).sum()
        prof.step()
    assert len(traces) == 1 and "CPU time total" in traces[0].key_averages().table()
    with pytest.raises(ValueError, match="Invalid profiler activity"):
        ProfileKwargs(activities=["gpu"]).build()


def test_fp8_recipes_name_the_missing_package():
    from accel.utils import AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
    from accel.utils.imports import is_torchao_available, is_transformer_engine_available

    if not is_transformer_engine_available():
        with pytest.raises(ImportError, match="transformer_engine"):
            TERecipeKwargs()
        with pytest.warns(FutureWarning), pytest.raises(ImportError, match="transformer_engine"):
            FP8RecipeKwargs(backend="te")
    if not is_torchao_available():
        with pytest.raises(ImportError, match="torchao"):
            AORecipeKwargs()
    assert MSAMPRecipeKwargs().opt_level == "O2"
    with pytest.raises(ValueError, match="opt_level"):
        MSAMPRecipeKwargs(opt_level="O9")


def test_bnb_quantization_config_checks_its_fields():
    from accel.utils import BnbQuantizationConfig, CustomDtype

    config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16", torch_dtype="fp16")
    assert config.target_dtype is CustomDtype.INT4 and config.bnb_4bit_compute_dtype is torch.bfloat16
    assert BnbQuantizationConfig(load_in_8bit=True).target_dtype is torch.int8
    with pytest.raises(ValueError, match="can't be both True"):
        BnbQuantizationConfig(load_in_4bit=True, load_in_8bit=True)
    with pytest.raises(ValueError, match="can't be both False"):
        BnbQuantizationConfig()
    with pytest.raises(ValueError, match="nf4"):
        BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="int3")


# ---------------------------------------------------------------------------- OOM wording
@pytest.mark.parametrize("message", ["CPU out of memory.", "CPU out of memory. Tried to allocate 2 GiB"])
def test_find_executable_batch_size_treats_device_oom_wording_as_oom(message):
    from accel.utils import find_executable_batch_size

    tried = []

    @find_executable_batch_size(starting_batch_size=16)  # each retry collects garbage: a few retries are enough
    def train(batch_size):
        tried.append(batch_size)
        if batch_size > 8:
            raise RuntimeError(message)
        return batch_size

    result = train()
    assert tried == [16, 14, 12, 10, 9, 8] and result == 8


def test_other_runtime_errors_are_not_oom():
    from accel.utils.memory import should_reduce_batch_size

    assert not should_reduce_batch_size(RuntimeError("shape mismatch"))
    assert not should_reduce_batch_size(ValueError("CPU out of memory."))  # only RuntimeErrors, as in Accelerate
    # on the cpu backend another device's wording is not this process's OOM
    assert not should_reduce_batch_size(RuntimeError("CUDA out of memory."))
