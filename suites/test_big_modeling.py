"""Big-model inference on the backend under test: dispatch over device / CPU / disk, checkpoint load with
an automatic device map, CPU offload and disk offload to the device, with outputs matching a host
reference.

Device-map values follow Accelerate: an accelerator's devices are integer ids (``0`` is this backend's
device 0, e.g. ``xpu:0``); on the CPU backend a device map spans ``"cpu"`` and ``"disk"`` only.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

from _training_utils import on_backend  # noqa: F401 - fixture
from accel.big_modeling import cpu_offload, disk_offload, dispatch_model, init_empty_weights, load_checkpoint_and_dispatch
from accel.hooks import remove_hook_from_submodules
from accel.utils.modeling import get_max_memory, infer_auto_device_map

WIDTH = 32
# the device computes the same fp32 ops as the host reference, maybe with other kernels/summation orders
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Tower(nn.Module):
    def __init__(self, depth: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _reference() -> Tower:
    torch.manual_seed(0)
    return Tower().eval()


def _device_value(device: torch.device):
    """What a device map holds for ``device``: its integer id on an accelerator, ``"cpu"`` for the host."""
    return device.index if device.index is not None else str(device)


def _inputs() -> torch.Tensor:
    return torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(1))


def _expected() -> torch.Tensor:
    with torch.no_grad():
        return _reference()(_inputs())


def test_dispatch_over_device_cpu_and_disk(on_backend, device, tmp_path):
    model = _reference()
    here = _device_value(device)
    device_map = {"blocks.0": here, "blocks.1": "cpu", "blocks.2": "disk", "blocks.3": here, "head": here}
    dispatch_model(model, device_map, offload_dir=str(tmp_path))
    assert model.blocks[0].up.weight.device == device
    assert model.blocks[2].up.weight.device.type == "meta"
    offloaded_cpu = model.blocks[1].up.weight.device.type
    assert offloaded_cpu == ("cpu" if device.index is None else "meta")  # CPU modules are offloaded to feed a device
    x = _inputs()
    with torch.no_grad():
        out = model(x)
    assert out.device == x.device, "the output did not come back to the input's device"
    torch.testing.assert_close(out, _expected(), **TOLERANCE)
    assert model.blocks[2].up.weight.device.type == "meta", "disk weights stayed onloaded after the forward"
    with pytest.raises(RuntimeError, match="offloaded"):
        model.to(device)
    remove_hook_from_submodules(model)


def test_load_checkpoint_and_dispatch_auto_below_model_size(on_backend, device, tmp_path):
    reference = _reference()
    state = reference.state_dict()
    shards = {"a.safetensors": {k: v for k, v in state.items() if k.startswith(("blocks.0", "blocks.1"))}}
    shards["b.safetensors"] = {k: v for k, v in state.items() if k not in shards["a.safetensors"]}
    for name, tensors in shards.items():
        save_file(tensors, str(tmp_path / name), metadata={"format": "pt"})
    weight_map = {k: name for name, tensors in shards.items() for k in tensors}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    size = sum(t.numel() * t.element_size() for t in state.values())
    block = sum(t.numel() * t.element_size() for k, t in state.items() if k.startswith("blocks.0."))
    budget = {"cpu": size // 2}
    if device.index is not None:  # an accelerator: room for about two blocks on it, the rest on CPU/disk
        budget = {device.index: 3 * block, "cpu": 2 * block}
    with init_empty_weights():
        model = Tower().eval()
    model = load_checkpoint_and_dispatch(
        model, str(tmp_path), device_map="sequential", max_memory=budget, offload_folder=str(tmp_path / "off")
    )
    placed = set(model.hf_device_map.values())
    assert "disk" in placed, model.hf_device_map
    if device.index is not None:
        assert device.index in placed and all(isinstance(v, int) or v in ("cpu", "disk") for v in placed)
    else:
        assert placed <= {"cpu", "disk"}
    x = _inputs()
    with torch.no_grad():
        out = model(x)
    torch.testing.assert_close(out.cpu(), _expected(), **TOLERANCE)


def test_default_budget_lists_this_backends_devices(on_backend, device):
    budget = get_max_memory()
    ids = [k for k in budget if isinstance(k, int)]
    assert "cpu" in budget and budget["cpu"] > 0
    if device.index is None:
        assert ids == [], "a CPU-only machine has no integer device ids"
    else:
        assert ids == list(range(on_backend.device_count())) and all(budget[i] > 0 for i in ids)
    device_map = infer_auto_device_map(_reference())
    assert set(device_map.values()) <= set(ids) | {"cpu"}


@pytest.mark.parametrize("offload_buffers", [False, True])
def test_cpu_and_disk_offload_execute_on_the_device(on_backend, device, tmp_path, offload_buffers):
    expected = _expected()
    model = cpu_offload(_reference(), execution_device=device, offload_buffers=offload_buffers)
    with torch.no_grad():
        torch.testing.assert_close(model(_inputs()).cpu(), expected, **TOLERANCE)
    model = disk_offload(_reference(), str(tmp_path), execution_device=device, offload_buffers=offload_buffers)
    assert model.blocks[0].up.weight.device.type == "meta"
    with torch.no_grad():
        torch.testing.assert_close(model(_inputs()).cpu(), expected, **TOLERANCE)


def test_an_automatic_device_map_spreads_over_two_devices_cpu_and_disk(on_backend, device, tmp_path):
    """``infer_auto_device_map`` with a budget per device places blocks on device 0, device 1, the host
    and the disk, and ``load_checkpoint_and_dispatch`` with that map gives the full model's outputs."""
    if on_backend.device_count() < 2 or device.index is None:
        pytest.skip(f"[needs-devices] two devices of {on_backend.name} (this process sees {on_backend.device_count()})")
    torch.manual_seed(0)
    reference = Tower(depth=8).eval()
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(tmp_path / "model.safetensors"))
    block = sum(p.numel() * p.element_size() for p in reference.blocks[0].parameters())
    # the first device keeps room for the largest offloaded layer, as Accelerate's planner does
    budget = {0: int(block * 2.5), 1: int(block * 1.5), "cpu": int(block * 2.1), "disk": 100 * block}
    with init_empty_weights():
        empty = Tower(depth=8)
    device_map = infer_auto_device_map(empty, max_memory=budget, no_split_module_classes=["Block"])
    assert {0, 1, "cpu", "disk"} <= set(device_map.values()), device_map
    model = load_checkpoint_and_dispatch(empty, str(tmp_path), device_map=device_map, offload_folder=str(tmp_path / "off"))
    for name, value in device_map.items():
        if isinstance(value, int):
            assert next(model.get_submodule(name).parameters()).device == on_backend.device(value), (name, value)
    x = _inputs()
    with torch.no_grad():
        expected = reference(x)
        out = model(x)
    torch.testing.assert_close(out.to("cpu"), expected, **TOLERANCE)
    remove_hook_from_submodules(model)
