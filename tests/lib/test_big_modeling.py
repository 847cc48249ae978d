"""accel.big_modeling on the CPU: empty init, checkpoint load + dispatch with disk offload, offload helpers."""

from __future__ import annotations

import gc
import json
import logging
from collections import OrderedDict

import psutil
import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

import accel
from accel.big_modeling import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
)
from accel.hooks import remove_hook_from_submodules

WIDTH = 64


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Tower(nn.Module):
    def __init__(self, depth: int = 6):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.head = nn.Linear(WIDTH, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x) * self.scale


def _reference() -> Tower:
    torch.manual_seed(0)
    model = Tower().eval()
    with torch.no_grad():
        model.scale.copy_(torch.tensor([1.0, -2.0, 0.5]))
    return model


def _save_sharded(model: nn.Module, folder, fmt: str = "safetensors", per_shard: int = 2) -> None:
    weight_map, shards = {}, {}
    for key, tensor in model.state_dict().items():
        part = int(key.split(".")[1]) // per_shard if key.startswith("blocks.") else 99
        fname = f"model-{part:05d}.{'safetensors' if fmt == 'safetensors' else 'bin'}"
        shards.setdefault(fname, {})[key] = tensor.clone().contiguous()
        weight_map[key] = fname
    for fname, tensors in shards.items():
        if fmt == "safetensors":
            save_file(tensors, str(folder / fname), metadata={"format": "pt"})
        else:
            torch.save(tensors, folder / fname)
    name = "model.safetensors.index.json" if fmt == "safetensors" else "pytorch_model.bin.index.json"
    (folder / name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_init_empty_weights_allocates_no_parameter_memory():
    before = _rss()
    with init_empty_weights():
        model = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(24)])  # 1.6 GB of fp32 parameters
    grown = _rss() - before
    assert all(p.device.type == "meta" for p in model.parameters())
    assert grown < 64 * 2**20, f"RSS grew by {grown / 2**20:.0f} MiB building an empty 1.6 GB model"


def test_init_empty_weights_buffers_and_restoration():
    register = nn.Module.register_parameter
    with init_empty_weights():
        bn = nn.BatchNorm1d(4)
    assert bn.weight.device.type == "meta" and bn.running_mean.device.type == "cpu"
    with init_empty_weights(include_buffers=True):
        bn = nn.BatchNorm1d(4)
    assert bn.running_mean.device.type == "meta"
    with pytest.raises(RuntimeError, match="boom"):
        with init_empty_weights():
            raise RuntimeError("boom")
    assert nn.Module.register_parameter is register
    assert nn.Linear(2, 2).weight.device.type == "cpu"
    with init_on_device("cpu"):
        assert nn.Linear(2, 2).weight.device.type == "cpu"


def test_top_level_exports():
    assert accel.init_empty_weights is init_empty_weights
    assert accel.load_checkpoint_and_dispatch is load_checkpoint_and_dispatch
    from accel.utils.modeling import infer_auto_device_map

    assert accel.infer_auto_device_map is infer_auto_device_map


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_load_and_dispatch_below_model_size_offloads_to_disk_with_identical_outputs(tmp_path, fmt):
    reference = _reference()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _save_sharded(reference, ckpt, fmt)
    x = torch.randn(5, WIDTH, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(x)

    size = sum(t.numel() * t.element_size() for t in reference.state_dict().values())
    with init_empty_weights():
        model = Tower().eval()
    model = load_checkpoint_and_dispatch(
        model, str(ckpt), device_map="auto", max_memory={"cpu": size // 2}, offload_folder=str(tmp_path / "off")
    )
    placed = set(model.hf_device_map.values())
    assert placed == {"cpu", "disk"}, model.hf_device_map
    disk_blocks = [name for name, where in model.hf_device_map.items() if where == "disk"]
    first_disk = accel_module(model, disk_blocks[0])
    assert all(p.device.type == "meta" for p in first_disk.parameters())
    with torch.no_grad():
        out = model(x)
    assert torch.equal(out, expected)
    assert all(p.device.type == "meta" for p in first_disk.parameters()), "disk weights stayed in RAM after the forward"
    assert (tmp_path / "off" / "index.json").is_file()
    assert bool(list((tmp_path / "off").glob("*.dat"))) is (fmt == "bin")


def accel_module(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name)


@pytest.mark.parametrize("strategy", ["sequential", "balanced", "balanced_low_0"])
def test_string_device_maps_on_the_host(tmp_path, strategy):
    reference = _reference()
    save_file(reference.state_dict(), str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with init_empty_weights():
        model = Tower().eval()
    model = load_checkpoint_and_dispatch(model, str(tmp_path), device_map=strategy)
    x = torch.randn(2, WIDTH)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))
    with pytest.raises(ValueError, match="'auto', 'balanced'"):
        load_checkpoint_and_dispatch(Tower(), str(tmp_path), device_map="everywhere")


def test_load_without_device_map_just_loads(tmp_path):
    reference = _reference()
    _save_sharded(reference, tmp_path)
    model = load_checkpoint_and_dispatch(Tower().eval(), str(tmp_path / "model.safetensors.index.json"))
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert not hasattr(model, "_hf_hook")


def test_dispatch_cpu_and_disk_then_guarded_moves(tmp_path, caplog):
    reference = _reference()
    model = _reference()
    x = torch.randn(3, WIDTH)
    with torch.no_grad():
        expected = reference(x)
    device_map = {"blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "cpu", "blocks.3": "disk", "blocks.4": "cpu",
                  "blocks.5": "cpu", "head": "disk", "scale": "cpu"}
    with pytest.raises(ValueError, match="offload_dir.*blocks.1"):
        dispatch_model(_reference(), device_map)
    dispatch_model(model, device_map, offload_dir=str(tmp_path))
    assert model.blocks[1].up.weight.device.type == "meta" and model.blocks[0].up.weight.device.type == "cpu"
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    with caplog.at_level(logging.WARNING, logger="accel.big_modeling"):
        with pytest.raises(RuntimeError, match="offloaded"):
            model.to("cpu")
    assert "shouldn't move a model" in caplog.text
    model.to(torch.float32)  # a dtype-only call is not a move
    remove_hook_from_submodules(model)  # the model was materialised before dispatch: it gets its weights back
    assert "to" not in model.__dict__ and not any(hasattr(m, "_hf_hook") for m in model.modules())
    for key, value in reference.state_dict().items():
        assert model.state_dict()[key].device.type == "cpu" and torch.equal(model.state_dict()[key], value), key


def test_single_device_map_just_moves_the_model():
    model = _reference()
    dispatch_model(model, {"": "cpu"})
    assert not hasattr(model, "_hf_hook") and model.hf_device_map == {"": "cpu"}


def test_device_map_errors_name_the_module(tmp_path):
    with pytest.raises(ValueError, match="head.weight"):
        dispatch_model(_reference(), {"blocks": "cpu", "scale": "cpu"})
    with pytest.raises(ValueError, match="'blocks.0'.*two devices"):
        dispatch_model(_reference(), {"": "cpu", "blocks.0": "disk"}, offload_dir=str(tmp_path))


@pytest.mark.parametrize("offload_buffers", [False, True])
def test_cpu_and_disk_offload_give_identical_outputs(tmp_path, offload_buffers):
    x = torch.randn(4, WIDTH)
    reference = _reference()
    with torch.no_grad():
        expected = reference(x)
    model = cpu_offload(_reference(), execution_device="cpu", offload_buffers=offload_buffers)
    assert model.blocks[0].up.weight.device.type == "meta"
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    model = disk_offload(_reference(), str(tmp_path / f"d{offload_buffers}"), execution_device="cpu",
                         offload_buffers=offload_buffers, preload_module_classes=["Block"])
    with torch.no_grad():
        assert torch.equal(model(x), expected)


def test_cpu_offload_with_hook_chains_models():
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    first, hook1 = cpu_offload_with_hook(first, execution_device="cpu")
    second, hook2 = cpu_offload_with_hook(second, execution_device="cpu", prev_module_hook=hook1)
    x = torch.randn(2, 4)
    assert torch.equal(second(first(x)), second._old_forward(first._old_forward(x)))
    hook2.offload()
    hook1.remove()
    assert not hasattr(first, "_hf_hook") and hasattr(second, "_hf_hook")


def test_tied_weights_survive_load_and_dispatch(tmp_path):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(8, 8, bias=False)
            self.mid = nn.Linear(8, 8)
            self.out = nn.Linear(8, 8, bias=False)
            self.out.weight = self.embed.weight

        def forward(self, x):
            return self.out(self.mid(self.embed(x)))

    torch.manual_seed(0)
    reference = Tied()
    state = {k: v for k, v in reference.state_dict().items() if k != "out.weight"}  # stored once
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with init_empty_weights():
        model = Tied()
    model = load_checkpoint_and_dispatch(model, str(tmp_path), device_map={"embed": "cpu", "mid": "cpu", "out": "cpu"})
    assert model.out.weight is model.embed.weight
    x = torch.randn(2, 8)
    assert torch.equal(model(x), reference(x))


def test_missing_checkpoint_key_on_an_empty_model_is_named(tmp_path):
    state = {k: v for k, v in _reference().state_dict().items() if k != "blocks.3.up.bias"}
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with init_empty_weights():
        model = Tower()
    with pytest.raises(ValueError, match=r"blocks\.3\.up\.bias"):
        load_checkpoint_and_dispatch(model, str(tmp_path), device_map="auto")


# ------------------------------------------------------------------------------------ accel estimate-memory
class NoSplitTower(Tower):
    _no_split_modules = ["Block"]


def _estimate(argv):
    from accel.commands.estimate import estimate_command_parser, gather_data

    return gather_data(estimate_command_parser().parse_args(argv))


def test_estimate_memory_from_a_python_class():
    rows = _estimate([f"{__name__}:NoSplitTower"])
    total = sum(t.numel() * t.element_size() for t in Tower().state_dict().values())
    block = sum(t.numel() * t.element_size() for t in Block().state_dict().values())
    assert [r[0] for r in rows] == ["float32", "float16", "int8", "int4"]
    assert rows[0][1:3] == [block, total], "largest layer must be a whole no-split Block"
    assert rows[1][1:3] == [block / 2, total / 2] and rows[3][2] == total / 8
    assert max(rows[0][3].values()) == 4 * total and max(rows[1][3].values()) == 2 * total
    assert max(rows[2][3].values()) == -1  # int8 training is not estimated


def test_estimate_memory_prints_the_table_and_registers_as_a_subcommand(capsys):
    import argparse

    from accel.commands.estimate import estimate_command, estimate_command_parser, run

    estimate_command(estimate_command_parser().parse_args([f"{__name__}:Tower", "--dtypes", "float32", "int4"]))
    out = capsys.readouterr().out
    assert f"Memory Usage for loading `{__name__}:Tower`" in out and "Training using Adam" in out and "N/A" in out
    root = argparse.ArgumentParser()
    sub = root.add_subparsers(dest="command")
    parser = estimate_command_parser(sub)
    assert isinstance(parser, argparse.ArgumentParser)
    args = root.parse_args(["estimate-memory", f"{__name__}:Tower", "--dtypes", "float16"])
    assert args.func is estimate_command and args.accel_run is run and args.dtypes == ["float16"]
    with pytest.raises(SystemExit):
        root.parse_args(["estimate-memory", "x", "--dtypes", "float64"])


def test_estimate_memory_without_network_fails_clearly(monkeypatch, capsys):
    import huggingface_hub

    from accel.commands.estimate import estimate_command_parser, run

    def offline(*args, **kwargs):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", offline)
    assert run(estimate_command_parser().parse_args(["some-org/some-model"])) == 1
    err = capsys.readouterr().err
    assert "Cannot reach the Hugging Face Hub" in err and "some-org/some-model" in err and "module:Class" in err
    assert run(estimate_command_parser().parse_args(["no_such_module_xyz:Model"])) == 1
    assert "no_such_module_xyz" in capsys.readouterr().err


def _transformers_models_build() -> str | None:
    try:
        from transformers import AutoModel, BertConfig

        AutoModel.from_config(BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8))
    except Exception as exc:  # e.g. a torchvision that does not match torch breaks every transformers model import
        return f"{type(exc).__name__}: {exc}"
    return None


def test_estimate_memory_from_a_local_transformers_config(tmp_path):
    why = _transformers_models_build()
    if why:
        pytest.skip(f"[needs-package] transformers cannot build models in this environment: {why}")
    from transformers import AutoModel, BertConfig

    config = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    config.save_pretrained(tmp_path)
    rows = _estimate([str(tmp_path), "--dtypes", "float32"])
    model = AutoModel.from_config(config)
    tensors = list(model.parameters()) + list(model.buffers())
    assert rows[0][2] == sum(t.numel() * t.element_size() for t in tensors)
