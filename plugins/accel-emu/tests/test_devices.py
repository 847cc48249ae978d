"""Devices: count, visible devices, the device guard, torch.accelerator, mixing devices."""

from __future__ import annotations

import pytest
import torch

from conftest import run_python


def test_two_devices_by_default(emu):
    assert emu.is_available()
    assert emu.device_count() == 2
    assert torch.accelerator.current_accelerator() == torch.device("emu")
    assert torch.accelerator.device_count() == 2
    assert emu.get_device_name(1) == "emu (emulated accelerator)"


def test_device_count_and_visible_devices_remap():
    result = run_python(
        """
        import torch, accel_emu
        accel_emu.load()
        print(torch.emu.device_count(), torch.emu.get_device_properties(0).physical_index)
        """,
        env={"ACCEL_EMU_DEVICES": "4", "EMU_VISIBLE_DEVICES": "3,1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2", "3"]


def test_visible_devices_naming_a_missing_device_is_an_error():
    result = run_python(
        """
        import torch, accel_emu
        accel_emu.load()
        try:
            torch.emu.device_count()
        except RuntimeError as exc:
            print("ERR:", exc)
        """,
        env={"EMU_VISIBLE_DEVICES": "0,5"},
    )
    assert "EMU_VISIBLE_DEVICES='0,5': '5' is not a device index from 0 to 1" in result.stdout, (result.stdout, result.stderr)


def test_guard_places_tensors_and_restores_current_device(emu):
    assert emu.current_device() == 0
    with emu.device(1):
        assert emu.current_device() == 1
        t = torch.empty(3, device="emu")
    assert t.device == torch.device("emu:1")
    assert emu.current_device() == 0
    # ops on emu:1 tensors produce emu:1 tensors whatever the current device
    assert (t.fill_(2) * 3).device == torch.device("emu:1")
    with torch.device("emu:1"):
        assert torch.zeros(2).device == torch.device("emu:1")


def test_invalid_device_index_is_an_error(emu):
    with pytest.raises(RuntimeError, match="invalid device index 7"):
        torch.empty(1, device="emu:7")
    with pytest.raises(ValueError, match="invalid device index 5"):
        emu.set_device(5)


def test_mixing_emu_and_cpu_tensors_is_an_error(emu):
    a = torch.ones(3, device="emu")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(torch.ones(2, 2, device="emu"), torch.ones(2, 2))


def test_mixing_two_emu_devices_is_an_error(emu):
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device="emu:0") + torch.ones(3, device="emu:1")


def test_zero_dim_cpu_scalars_are_allowed(emu):
    a = torch.ones(3, device="emu")
    out = a * torch.tensor(2.0)
    assert out.device == a.device
    assert out.cpu().tolist() == [2.0, 2.0, 2.0]


def test_cpu_indices_are_allowed_as_on_real_devices(emu):
    a = torch.arange(5.0, device="emu")
    assert a[torch.tensor([4, 0])].cpu().tolist() == [4.0, 0.0]


def test_tensor_methods_are_generated(emu):
    t = torch.ones(2).emu()
    assert t.is_emu and t.device.type == "emu"
    m = torch.nn.Linear(2, 2).emu()
    assert next(m.parameters()).device.type == "emu"
