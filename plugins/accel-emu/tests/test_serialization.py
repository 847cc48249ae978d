"""torch.save/torch.load of emu tensors (map_location) and safetensors through the host."""

from __future__ import annotations

import io

import torch


def test_save_and_load_keeps_device(emu):
    t = torch.arange(6.0, device="emu:1").reshape(2, 3)
    buf = io.BytesIO()
    torch.save({"t": t}, buf)
    buf.seek(0)
    loaded = torch.load(buf)["t"]
    assert loaded.device == torch.device("emu:1")
    assert torch.equal(loaded.cpu(), t.cpu())


def test_load_with_map_location(emu):
    buf = io.BytesIO()
    torch.save(torch.arange(4.0, device="emu:0"), buf)
    buf.seek(0)
    moved = torch.load(buf, map_location="emu:1")
    assert moved.device == torch.device("emu:1")
    assert moved.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    buf.seek(0)
    host = torch.load(buf, map_location="cpu")
    assert host.device.type == "cpu" and host.tolist() == [0.0, 1.0, 2.0, 3.0]
    # a checkpoint written on the host loads onto the device
    buf = io.BytesIO()
    torch.save(torch.ones(2), buf)
    buf.seek(0)
    assert torch.load(buf, map_location="emu:1").device == torch.device("emu:1")


def test_module_state_dict_round_trip(emu, tmp_path):
    model = torch.nn.Linear(3, 2).to("emu")
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    fresh = torch.nn.Linear(3, 2).to("emu")
    fresh.load_state_dict(torch.load(path, map_location="emu:0"))
    assert torch.equal(fresh.weight.cpu(), model.weight.cpu())


def test_safetensors_through_the_host(emu, tmp_path):
    from safetensors.torch import load_file, save_file

    t = torch.randn(3, 4, device="emu:1")
    path = tmp_path / "w.safetensors"
    save_file({"w": t.cpu()}, str(path))
    loaded = load_file(str(path), device="cpu")["w"].to("emu:1")
    assert loaded.device == torch.device("emu:1")
    assert torch.equal(loaded.cpu(), t.cpu())
