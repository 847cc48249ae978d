"""bitsandbytes quantization on the backend under test: 8-bit (LLM.int8) and 4-bit (nf4, fp4) models loaded
from a checkpoint, or quantized from loaded weights, give outputs within a stated tolerance of the full
fp32 model, on the device and with modules offloaded to the host and to disk.

Tolerances are relative L2 errors of the outputs against the host's fp32 model. Measured on this
model on the host: 8-bit 0.004, nf4 0.04, fp4 0.05; the limits leave room for other kernels, while
a layer left unquantized gives 0 (checked: the error must be above 0) and a wrong scale or a
transposed weight gives errors near or above 1.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

from _training_utils import on_backend  # noqa: F401 - fixture
from accel.big_modeling import init_empty_weights
from accel.hooks import remove_hook_from_submodules
from accel.utils.dataclasses import BnbQuantizationConfig
from accel.test_utils.training import ResidualMLP

WIDTH = 64
LIMIT = {"8bit": 0.02, "nf4": 0.1, "fp4": 0.12}
CONFIGS = {
    "8bit": dict(load_in_8bit=True),
    "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="fp32"),
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype="fp32"),
}


@pytest.fixture
def bnb_utils():
    """accel.utils.bnb once bitsandbytes is importable (it is in the test extra)."""
    pytest.importorskip("bitsandbytes", reason="[needs-package] bitsandbytes is not installed (pip install bitsandbytes)")
    from accel.utils import bnb

    return bnb


def Net() -> ResidualMLP:  # noqa: N802 (reads like the class it makes)
    return ResidualMLP(WIDTH)


def _reference() -> Net:
    torch.manual_seed(0)
    return Net().eval()


def _inputs() -> torch.Tensor:
    return torch.randn(16, WIDTH, generator=torch.Generator().manual_seed(1))


def _error(model: nn.Module, device: torch.device) -> float:
    with torch.no_grad():
        want = _reference()(_inputs())
        got = model(_inputs().to(device)).float().to("cpu")
    return float((got - want).norm() / want.norm())


def _checkpoint(folder) -> str:
    save_file(_reference().state_dict(), os.path.join(folder, "model.safetensors"))
    return str(folder)


def _empty() -> Net:
    with init_empty_weights():
        return Net().eval()


def _here(device: torch.device):
    return device.index if device.index is not None else "cpu"


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_checkpoint_loaded_quantized_on_the_device(on_backend, device, bnb_utils, kind, tmp_path):
    model = bnb_utils.load_and_quantize_model(_empty(), BnbQuantizationConfig(**CONFIGS[kind]),
                                              weights_location=_checkpoint(tmp_path))
    layer = model.blocks[0].up
    assert layer.weight.device == device and layer.weight.dtype == (torch.int8 if kind == "8bit" else torch.uint8)
    assert type(model.head) is nn.Linear, "the head stays in full precision"
    error = _error(model, device)
    assert 0 < error < LIMIT[kind], f"{kind} on {device}: relative error {error:.4f} (limit {LIMIT[kind]})"


@pytest.mark.parametrize("kind", ["8bit", "nf4"])
def test_loaded_weights_quantized_on_the_device(on_backend, device, bnb_utils, kind):
    model = bnb_utils.load_and_quantize_model(_reference(), BnbQuantizationConfig(**CONFIGS[kind]))
    assert all(p.device == device for p in model.parameters())
    error = _error(model, device)
    assert 0 < error < LIMIT[kind], f"{kind} on {device}: relative error {error:.4f}"


def test_four_bit_with_host_and_disk_offload(on_backend, device, bnb_utils, tmp_path):
    """Offloaded modules stay unquantized (bitsandbytes cannot offload 4-bit weights); the rest is 4-bit."""
    here = _here(device)
    device_map = {"blocks.0": here, "blocks.1": "disk", "blocks.2": "cpu", "head": here}
    config = BnbQuantizationConfig(**CONFIGS["nf4"])
    model = bnb_utils.load_and_quantize_model(_empty(), config, weights_location=_checkpoint(tmp_path),
                                              device_map=device_map, offload_folder=str(tmp_path / "off"))
    assert type(model.blocks[0].up).__name__ == "Linear4bit" and type(model.blocks[1].up) is nn.Linear
    assert type(model.blocks[2].up).__name__ == ("Linear4bit" if here == "cpu" else "Linear")
    error = _error(model, device)
    assert 0 < error < LIMIT["nf4"], f"nf4 with offload on {device}: relative error {error:.4f}"
    remove_hook_from_submodules(model)


def test_eight_bit_with_host_and_disk_offload(on_backend, device, bnb_utils, tmp_path):
    """Offloaded 8-bit modules are kept as int8 rows and scales (on disk too) and brought in for each forward."""
    here = _here(device)
    device_map = {"blocks.0": here, "blocks.1": "disk", "blocks.2": "cpu", "head": here}
    folder = tmp_path / "off"
    load = lambda: bnb_utils.load_and_quantize_model(  # noqa: E731
        _empty(), BnbQuantizationConfig(load_in_8bit=True), weights_location=_checkpoint(tmp_path),
        device_map=device_map, offload_folder=str(folder))
    model = load()
    index = json.loads((folder / "index.json").read_text())
    assert index["blocks.1.up.weight"]["dtype"] == "int8" and "blocks.1.up.SCB" in index
    error = _error(model, device)
    assert 0 < error < LIMIT["8bit"], f"8-bit with offload on {device}: relative error {error:.4f}"
    assert model.blocks[1].up.weight.device.type == "meta", "the disk module stayed in memory after the forward"
    remove_hook_from_submodules(model)
