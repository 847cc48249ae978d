"""accel.utils.bnb: bitsandbytes 8-bit and 4-bit loading on the host, which modules stay unquantized,
device maps, 8-bit disk offload, and clear refusals."""

import json
import os

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

from accel.big_modeling import init_empty_weights
from accel.utils.bnb import (
    get_keys_to_not_convert,
    get_quantized_model_device_map,
    load_and_quantize_model,
    quantization_device,
    replace_with_bnb_layers,
)
from accel.utils.dataclasses import BnbQuantizationConfig

bnb = pytest.importorskip("bitsandbytes", reason="[needs-package] bitsandbytes is in the test extra")

from accel.utils import bnb as bnb_utils  # noqa: E402
from accel.quantization.bnb_params import bnb_parameter_to_device, quantize_and_offload_8bit  # noqa: E402
from accel.test_utils.training import ResidualMLP

WIDTH = 64
# relative L2 error of the outputs against the fp32 model (measured on this model: 8-bit 0.004, nf4 0.04, fp4 0.05)
LIMIT = {"8bit": 0.02, "nf4": 0.1, "fp4": 0.12}
CONFIGS = {
    "8bit": dict(load_in_8bit=True),
    "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="fp32"),
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype="fp32"),
}


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(4, 3)
        self.body = nn.Linear(3, 3)
        self.head = nn.Linear(3, 4, bias=False)
        self.head.weight = self.emb.weight


def Net() -> ResidualMLP:  # noqa: N802 (reads like the class it makes)
    return ResidualMLP(WIDTH)


@pytest.fixture(autouse=True)
def _host(monkeypatch):
    monkeypatch.setenv("ACCEL_DEVICE", "cpu")


def _reference() -> Net:
    torch.manual_seed(0)
    return Net().eval()


def _x() -> torch.Tensor:
    return torch.randn(16, WIDTH, generator=torch.Generator().manual_seed(1))


def _error(model: nn.Module) -> float:
    with torch.no_grad():
        want = _reference()(_x())
        got = model(_x()).float()
    return float((got - want).norm() / want.norm())


def _checkpoint(folder) -> str:
    save_file(_reference().state_dict(), os.path.join(folder, "model.safetensors"))
    return str(folder)


def _empty() -> Net:
    with init_empty_weights():
        return Net().eval()


# ------------------------------------------------------------------------------------------- module choice
def test_tied_head_and_embedding_stay_unquantized():
    assert get_keys_to_not_convert(_Tied()) == ["emb", "head"]


def test_untied_model_keeps_only_its_head():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    assert get_keys_to_not_convert(model) == ["1"]


def test_a_base_model_without_head_or_ties_keeps_nothing():
    class Base(nn.Module):
        base_model_prefix = "encoder"

        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 2)

    assert get_keys_to_not_convert(Base()) == []


def test_replace_follows_skip_names_and_parents():
    model = Net()
    replace_with_bnb_layers(model, BnbQuantizationConfig(load_in_8bit=True), modules_to_not_convert=["blocks.1", "head"])
    assert type(model.blocks[0].up).__name__ == "Linear8bitLt"
    assert type(model.blocks[1].up) is nn.Linear and type(model.head) is nn.Linear
    with pytest.raises(TypeError, match="BnbQuantizationConfig"):
        replace_with_bnb_layers(model, {"load_in_8bit": True})


# ------------------------------------------------------------------------------------------- loading
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_loaded_model_is_quantized_on_the_host(kind):
    model = _reference()
    quantized = load_and_quantize_model(model, BnbQuantizationConfig(**CONFIGS[kind]))
    assert quantized.is_loaded_in_8bit is (kind == "8bit") and quantized.is_loaded_in_4bit is (kind != "8bit")
    layer = quantized.blocks[0].up
    assert layer.weight.dtype == (torch.int8 if kind == "8bit" else torch.uint8), "the weight was not quantized"
    assert type(quantized.head) is nn.Linear, "the head must stay in full precision"
    error = _error(quantized)
    assert 0 < error < LIMIT[kind], f"{kind}: relative error {error:.4f}"


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_meta_model_loads_and_quantizes_from_a_checkpoint_folder(kind, tmp_path):
    model = load_and_quantize_model(_empty(), BnbQuantizationConfig(**CONFIGS[kind]), weights_location=_checkpoint(tmp_path))
    assert model.hf_device_map == {"": "cpu"}
    assert all(p.device.type == "cpu" for p in model.parameters())
    error = _error(model)
    assert 0 < error < LIMIT[kind], f"{kind}: relative error {error:.4f}"


def test_keep_in_fp32_and_torch_dtype(tmp_path):
    config = BnbQuantizationConfig(load_in_8bit=True, torch_dtype="fp16", keep_in_fp32_modules=["blocks.2"])
    model = load_and_quantize_model(_empty(), config, weights_location=_checkpoint(tmp_path))
    assert type(model.blocks[2].up) is nn.Linear and model.blocks[2].up.weight.dtype == torch.float32
    assert model.blocks[0].norm.weight.dtype == torch.float16
    assert model.head.weight.dtype == torch.float16  # skipped (the head), in torch_dtype
    assert "blocks.2" in config.skip_modules + config.keep_in_fp32_modules


def test_skip_modules_given_by_the_user_replace_the_default(tmp_path):
    config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="fp32", skip_modules=["blocks.0"])
    model = load_and_quantize_model(_empty(), config, weights_location=_checkpoint(tmp_path))
    assert type(model.blocks[0].up) is nn.Linear
    assert type(model.head).__name__ == "Linear4bit", "an explicit skip list replaces the default (head) one"


def test_four_bit_with_a_disk_module_keeps_it_unquantized(tmp_path):
    device_map = {"blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "cpu", "head": "cpu"}
    config = BnbQuantizationConfig(**CONFIGS["nf4"])
    model = load_and_quantize_model(_empty(), config, weights_location=_checkpoint(tmp_path), device_map=device_map,
                                    offload_folder=str(tmp_path / "off"))
    assert type(model.blocks[1].up) is nn.Linear and model.blocks[1].up.weight.device.type == "meta"
    assert type(model.blocks[0].up).__name__ == "Linear4bit", "on the host backend 'cpu' is the device, not an offload"
    assert "blocks.1" in config.skip_modules
    assert 0 < _error(model) < LIMIT["nf4"]


def test_an_automatic_map_that_offloads_4bit_modules_is_refused():
    config = BnbQuantizationConfig(**CONFIGS["nf4"])
    config.skip_modules, config.keep_in_fp32_modules = ["head"], []
    with pytest.raises(ValueError, match="cannot offload 4-bit"):
        get_quantized_model_device_map(_empty(), config, {"blocks.0": "disk", "blocks.1": "cpu", "blocks.2": "cpu", "head": "cpu"})
    with pytest.raises(ValueError, match="must be one of"):
        get_quantized_model_device_map(_empty(), config, "everywhere")
    auto = get_quantized_model_device_map(_empty(), config, "sequential", max_memory={"cpu": 10**9})
    assert set(auto.values()) == {"cpu"}


def test_eight_bit_offload_to_disk_stores_int8_rows_and_scales(tmp_path):
    """Every 8-bit weight of a disk module is written as int8 with its row scales, and outputs stay within
    the 8-bit tolerance (needs set_module_tensor_to_device and load_checkpoint_in_model to know bitsandbytes)."""
    device_map = {"blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "cpu", "head": "cpu"}
    folder = tmp_path / "off"
    model = load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_8bit=True), weights_location=_checkpoint(tmp_path),
                                    device_map=device_map, offload_folder=str(folder))
    index = json.loads((folder / "index.json").read_text())
    assert index["blocks.1.up.weight"]["dtype"] == "int8" and "blocks.1.up.SCB" in index
    assert model.blocks[1].up.weight.device.type == "meta"
    assert 0 < _error(model) < LIMIT["8bit"]
    assert model.blocks[1].up.weight.device.type == "meta", "the disk weights stayed in memory after the forward"


def test_quantize_and_offload_8bit_writes_rows_and_scales(tmp_path):
    layer = nn.Sequential(nn.Linear(8, 4))
    replace_with_bnb_layers(layer, BnbQuantizationConfig(load_in_8bit=True))
    full = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    index: dict = {}
    quantize_and_offload_8bit(layer, full, "0.weight", None, str(tmp_path), index, None)
    assert index["0.weight"]["dtype"] == "int8" and index["0.SCB"]["shape"] == [4]
    assert layer[0].weight.device.type == "meta" and type(layer[0].weight).__name__ == "Int8Params"
    rows = torch.from_file(str(tmp_path / "0.weight.dat"), size=32, dtype=torch.int8).reshape(4, 8)
    scales = torch.from_file(str(tmp_path / "0.SCB.dat"), size=4, dtype=torch.float32)
    torch.testing.assert_close(rows.float() * scales[:, None] / 127, full, atol=0.02, rtol=0.02)


def test_bnb_parameter_to_device_keeps_quantized_rows_with_their_scales():
    layer = bnb.nn.Linear8bitLt(8, 4, has_fp16_weights=False, device="meta")
    full = torch.randn(4, 8)
    quantized = bnb_parameter_to_device(layer.weight, full, "cpu")
    assert quantized.dtype == torch.int8 and quantized.SCB.shape == (4,)
    again = bnb_parameter_to_device(layer.weight, quantized.data, "cpu", fp16_statistics=quantized.SCB)
    assert torch.equal(again.CB, quantized.data) and torch.equal(again.SCB, quantized.SCB)
    with pytest.raises(ValueError, match="row scales"):
        bnb_parameter_to_device(layer.weight, quantized.data, "cpu")
    with pytest.raises(TypeError, match="bitsandbytes parameter"):
        bnb_parameter_to_device(nn.Parameter(full), full, "cpu")


# ------------------------------------------------------------------------------------------- refusals
def test_bad_input_is_refused_with_the_reason(tmp_path):
    with pytest.raises(TypeError, match="BnbQuantizationConfig"):
        load_and_quantize_model(nn.Linear(2, 2), {"load_in_8bit": True})
    with pytest.raises(ValueError, match="weights_location"):
        load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_8bit=True))
    with pytest.raises(ValueError, match="both True"):
        BnbQuantizationConfig(load_in_8bit=True, load_in_4bit=True)


def test_without_bitsandbytes_the_error_names_the_package(monkeypatch):
    monkeypatch.setattr(bnb_utils, "is_bnb_available", lambda: False)
    with pytest.raises(ImportError, match="pip install bitsandbytes"):
        load_and_quantize_model(nn.Linear(2, 2), BnbQuantizationConfig(load_in_8bit=True))


def test_the_quantization_device_is_the_host_on_cpu():
    assert quantization_device() == torch.device("cpu")
