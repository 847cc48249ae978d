"""DeepSpeedPlugin, the resolver and the DeepSpeed strategy's checks, in one process.

Training itself (ZeRO 0-3 at 1 and 2 ranks, resume, save_model, two plugins, bf16) is proven by
``suites/test_deepspeed.py``; here: configuration, environment, and every bad-input message.
"""

from __future__ import annotations

import base64
import json
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.backends import UnsupportedFeatureError
from accel.resolve import resolve_run
from accel.utils import DeepSpeedPlugin, DummyOptim, HfDeepSpeedConfig
from accel.utils.dataclasses import DistributedType

pytest.importorskip("deepspeed")

_ENV = ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_ZERO_STAGE", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "ACCELERATE_GRADIENT_CLIPPING", "ACCELERATE_DEEPSPEED_CONFIG_FILE",
        "ACCELERATE_MIXED_PRECISION", "ACCEL_MIXED_PRECISION", "ACCELERATE_USE_FSDP", "ACCEL_USE_FSDP")
#: what a one-process DeepSpeed run writes into the environment (the rank variables DeepSpeed needs, its
#: accelerator); left there, the next test's state (accel's or Accelerate's) would look for a launcher
_WRITTEN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "DS_ACCELERATOR")


@pytest.fixture(autouse=True)
def _no_launcher_environment(monkeypatch):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    for name in _WRITTEN:  # setenv records the value found (or its absence), which the teardown puts back
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    yield
    import torch.distributed as dist

    if dist.is_initialized():  # a one-process group DeepSpeed needed; never leak it into the next test
        import deepspeed.comm

        if deepspeed.comm.comm.cdb is not None:
            deepspeed.comm.destroy_process_group()  # also drops the groups DeepSpeed cached
        else:
            dist.destroy_process_group()


def _loader(batch_size=4):
    return DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=batch_size)


def _model_and_optimizer():
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_plugin_defaults_and_the_config_it_builds():
    plugin = DeepSpeedPlugin()
    config = plugin.deepspeed_config
    assert plugin.zero_stage == 2 and config["zero_optimization"]["stage"] == 2
    assert config["train_micro_batch_size_per_gpu"] == "auto" and plugin.is_auto("train_batch_size")
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "none"}
    assert plugin.zero3_init_flag is False


def test_plugin_reads_accelerates_launch_environment(monkeypatch):
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "cpu")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    monkeypatch.setenv("ACCELERATE_GRADIENT_CLIPPING", "0.5")
    plugin = DeepSpeedPlugin()
    assert plugin.zero_stage == 3 and plugin.hf_ds_config.is_zero3() and plugin.hf_ds_config.is_offload()
    assert plugin.get_value("zero_optimization.offload_optimizer.device") == "cpu"
    assert plugin.get_value("gradient_accumulation_steps") == 4 and plugin.get_value("gradient_clipping") == 0.5
    assert plugin.zero3_init_flag is True  # ZeRO-3 turns it on unless told otherwise


@pytest.mark.parametrize("form", ["path", "dict", "base64"])
def test_config_file_in_every_form_wins_over_defaults(tmp_path, form):
    config = {"zero_optimization": {"stage": 1}, "gradient_accumulation_steps": 2, "train_micro_batch_size_per_gpu": "auto"}
    source: object = config
    if form == "path":
        source = tmp_path / "ds.json"
        source.write_text(json.dumps(config))
    elif form == "base64":
        source = base64.urlsafe_b64encode(json.dumps(config).encode()).decode()
    plugin = DeepSpeedPlugin(hf_ds_config=source)
    assert plugin.zero_stage == 1 and plugin.gradient_accumulation_steps == 2


@pytest.mark.parametrize("kwargs, message", [
    ({"zero_stage": 5}, "zero_stage must be 0, 1, 2 or 3"),
    ({"offload_param_device": "gpu"}, "offload_param_device must be one of"),
    ({"hf_ds_config": {"train_batch_size": 4}}, "no 'zero_optimization' section"),
    ({"hf_ds_config": "/nonexistent/ds_config.json"}, "neither an existing JSON file nor base64"),
])
def test_bad_plugin_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeepSpeedPlugin(**kwargs)


def test_malformed_config_file_names_the_file(tmp_path):
    bad = tmp_path / "ds.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=f"{bad}.*not valid JSON"):
        HfDeepSpeedConfig(str(bad))


def test_resolver_picks_deepspeed_and_says_why(monkeypatch):
    plan = resolve_run(1, "MULTI_CPU", deepspeed_plugins={"default": DeepSpeedPlugin()})
    assert plan.strategy == "deepspeed" and plan.distributed_type == DistributedType.DEEPSPEED
    assert "DeepSpeedPlugin" in plan.describe()
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert "ACCELERATE_USE_DEEPSPEED=true" in resolve_run(2, "MULTI_CPU").describe()
    with pytest.raises(ValueError, match="both asked for"):
        resolve_run(2, "MULTI_CPU", fsdp_plugin=object())
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    assert resolve_run(2, "MULTI_CPU").strategy == "ddp" and resolve_run(1, "MULTI_CPU").strategy == "single"


def test_launcher_environment_turns_deepspeed_on(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "1")
    accelerator = Accelerator()
    assert accelerator.distributed_type == DistributedType.DEEPSPEED
    assert accelerator.state.deepspeed_plugin.zero_stage == 1
    assert "Strategy: deepspeed" in repr(accelerator.state)


def test_fp16_where_deepspeed_cannot_run_it_is_a_capability_error():
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().is_fp16_supported():
        pytest.skip("DeepSpeed's accelerator here runs fp16 [not-on-backend]")
    with pytest.raises(UnsupportedFeatureError, match="does not support fp16"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(), mixed_precision="fp16")


def test_precision_comes_from_the_config_and_contradictions_are_named():
    config = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    assert accelerator.mixed_precision == "bf16" and accelerator.precision.managed_by == "deepspeed"
    assert accelerator.scaler is None  # DeepSpeed scales itself
    with pytest.raises(ValueError, match=r"mixed_precision='fp16'.*bf16\.enabled=True"):
        DeepSpeedPlugin(hf_ds_config=config).set_mixed_precision("fp16")


def test_accumulation_contradiction_names_both_values():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 1}, "gradient_accumulation_steps": 4,
                                           "train_micro_batch_size_per_gpu": "auto"})
    accelerator = Accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="gradient_accumulation_steps=2.*gradient_accumulation_steps=4"):
        accelerator.prepare(*_model_and_optimizer(), _loader())


def test_accumulation_left_at_default_adopts_the_configs():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 1}, "gradient_accumulation_steps": 4,
                                           "train_micro_batch_size_per_gpu": "auto"})
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model, _, _ = accelerator.prepare(*_model_and_optimizer(), _loader())
    assert accelerator.gradient_accumulation_steps == 4
    assert model.train_batch_size() == 16 and model.gradient_accumulation_steps() == 4
    accelerator.free_memory()


def test_batch_size_contradiction_names_both_values():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 8})
    with pytest.raises(ValueError, match="gives 4 samples per process.*train_micro_batch_size_per_gpu=8"):
        Accelerator(deepspeed_plugin=plugin).prepare(*_model_and_optimizer(), _loader(4))


def test_auto_batch_size_needs_a_loader_in_the_same_call():
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin())
    with pytest.raises(ValueError, match="needs a training or evaluation data loader in the same call"):
        accelerator.prepare(*_model_and_optimizer())


def test_optimizer_in_config_and_code_is_refused():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 1},
                                           "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})
    with pytest.raises(ValueError, match="defines an optimizer and the code passed one too"):
        Accelerator(deepspeed_plugin=plugin).prepare(*_model_and_optimizer(), _loader())


def test_dummy_optim_takes_the_configs_optimizer():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2},
                                           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto",
                                                                                       "torch_adam": True}}})
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model = torch.nn.Linear(4, 1)
    model, optimizer, _ = accelerator.prepare(model, DummyOptim(model.parameters(), lr=0.01, weight_decay=0.1), _loader())
    assert plugin.deepspeed_config["optimizer"]["params"] == {"lr": 0.01, "weight_decay": 0.1, "torch_adam": True}
    assert optimizer.param_groups[0]["lr"] == 0.01
    accelerator.free_memory()


def test_dummy_optim_without_deepspeed_is_refused():
    model = torch.nn.Linear(4, 1)
    with pytest.raises(TypeError, match="DummyOptim only works with DeepSpeed"):
        Accelerator().prepare(model, DummyOptim(model.parameters()))


def test_several_models_in_one_call_are_refused():
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin())
    with pytest.raises(ValueError, match="one engine per model"):
        accelerator.prepare(torch.nn.Linear(4, 1), torch.nn.Linear(4, 1), _loader())


def test_unknown_plugin_name_is_named():
    accelerator = Accelerator(deepspeed_plugins={"a": DeepSpeedPlugin(), "b": DeepSpeedPlugin(zero_stage=1)})
    with pytest.raises(ValueError, match=r"no DeepSpeedPlugin named 'c'.*\['a', 'b'\]"):
        accelerator.state.select_deepspeed_plugin("c")
    with pytest.raises(ValueError, match="select_deepspeed_plugin"):
        accelerator.state.deepspeed_plugins["a"].select()


def test_missing_deepspeed_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(ImportError, match=r"accel\[deepspeed\]"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin())


def test_clip_grad_value_is_a_capability_error_under_deepspeed():
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin())
    with pytest.raises(UnsupportedFeatureError, match="only clips by norm"):
        accelerator.clip_grad_value_([], 1.0)


def test_sequence_parallel_groups_count_once_in_the_batch_size():
    """With sp_size > 1 the ranks of a group share samples: train_batch_size divides by sp_size, which must
    divide the process count (checked before Ulysses touches the model)."""
    from accel.parallelism_config import ParallelismConfig

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(), parallelism_config=ParallelismConfig(sp_size=2))
    model = torch.nn.Linear(4, 1)
    with pytest.raises(ValueError, match=r"sp_size \(2\) must divide the number of processes \(1\)"):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), _loader(4))
    assert accelerator.strategy.mpu is None


def test_without_sequence_parallelism_loaders_are_not_adapted():
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin())
    model, optimizer, loader = accelerator.prepare(*_model_and_optimizer(), _loader(4))
    assert accelerator.strategy.mpu is None and loader is accelerator._dataloaders[0]
    assert model.train_batch_size() == 4
    accelerator.free_memory()
