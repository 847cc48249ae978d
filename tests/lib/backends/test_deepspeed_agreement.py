"""accel.backends.deepspeed_agreement: DeepSpeed's accelerator choice against accel's backend."""

from __future__ import annotations

import os

import pytest

from accel.backends import deepspeed_agreement as agreement
from accel.backends.cpu import CPUBackend

from _deepspeed_fake import install_fake_deepspeed


@pytest.fixture
def fake_deepspeed(tmp_path, monkeypatch):
    return install_fake_deepspeed(tmp_path, monkeypatch)


class FakeXPU:
    name, device_type, comm_backend = "xpu", "xpu", "xccl"


class FakeMPS:
    name, device_type, comm_backend = "mps", "mps", None


def test_the_child_reports_what_deepspeed_chose(fake_deepspeed):
    answer = agreement.probe_deepspeed()
    assert answer == {"installed": True, "ds_accelerator": None, "version": "9.9.9", "device": "cuda",
                      "communication_backend": "nccl", "class": "FakeAccelerator"}
    told = agreement.probe_deepspeed({**os.environ, "DS_ACCELERATOR": "cpu"})
    assert told["device"] == "cpu" and told["ds_accelerator"] == "cpu"


def test_a_failing_deepspeed_is_reported_not_raised(fake_deepspeed):
    answer = agreement.probe_deepspeed({**os.environ, "FAKE_DS_CRASH": "1"})
    assert answer["installed"] is True and "no driver found" in answer["error"]
    result = agreement.compare(CPUBackend(), answer)
    assert result["agree"] is None and "no driver found" in result["problems"][0]


def test_without_deepspeed_nothing_is_started(monkeypatch):
    monkeypatch.setattr(agreement, "deepspeed_installed", lambda: False)
    monkeypatch.setattr(agreement.subprocess, "run", lambda *a, **k: pytest.fail("a child was started"))
    assert agreement.probe_deepspeed() == {"installed": False}
    assert agreement.compare(CPUBackend(), {"installed": False})["problems"] == ["DeepSpeed is not installed"]


def test_detection_disagreement_names_both_sides_and_the_fix(fake_deepspeed):
    result = agreement.compare(CPUBackend(), agreement.probe_deepspeed())  # the fake defaults to cuda
    assert result["agree"] is False
    (problem,) = result["problems"]
    assert "DeepSpeed uses 'cuda' (its own detection) but accel uses 'cpu'" in problem and "DS_ACCELERATOR=cpu" in problem
    told = agreement.compare(CPUBackend(), agreement.probe_deepspeed({**os.environ, "DS_ACCELERATOR": "cpu"}))
    assert told["agree"] is True and told["problems"] == []


def test_collective_libraries_compare_by_family():
    answer = {"installed": True, "device": "xpu", "communication_backend": "ccl"}
    assert agreement.compare(FakeXPU(), answer)["agree"] is True  # oneCCL under its two names
    other = agreement.compare(FakeXPU(), {**answer, "communication_backend": "gloo"})
    assert other["agree"] is False and "'gloo'" in other["problems"][0] and "'xccl'" in other["problems"][0]


def test_a_backend_without_collectives_only_gets_a_note():
    result = agreement.compare(FakeMPS(), {"installed": True, "device": "mps", "communication_backend": "gloo"})
    assert result["agree"] is True and result["problems"] == []
    assert "runs no collectives" in result["notes"][0]


def test_a_local_deepspeed_folder_does_not_shadow_the_installed_one(fake_deepspeed, tmp_path, monkeypatch):
    shadow = tmp_path / "cwd" / "deepspeed"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the working directory was searched')\n")
    monkeypatch.chdir(tmp_path / "cwd")
    assert agreement.probe_deepspeed()["device"] == "cuda"  # the stand-in on PYTHONPATH answered


class FakeEmu:
    name, device_type, comm_backend = "emu", "emu", "emu_ccl"


def test_a_device_deepspeed_has_no_accelerator_for_gets_no_ds_accelerator_advice(monkeypatch):
    """DS_ACCELERATOR=emu makes DeepSpeed raise: the advice names what DeepSpeed accepts instead."""
    monkeypatch.setattr(agreement, "deepspeed_accelerator_types", lambda: ("cuda", "cpu", "xpu"))
    result = agreement.compare(FakeEmu(), {"installed": True, "device": "cpu", "communication_backend": "gloo"})
    (problem,) = result["problems"]
    assert "DS_ACCELERATOR=emu" not in problem
    assert "DeepSpeed has no accelerator for 'emu' (DS_ACCELERATOR accepts cuda, cpu, xpu)" in problem
    listed = agreement.compare(FakeXPU(), {"installed": True, "device": "cpu", "communication_backend": "gloo"})
    assert "set DS_ACCELERATOR=xpu" in listed["problems"][0]
