"""The accel Backend plug-in: entry point, opt-in probe, capabilities, accel env."""

from __future__ import annotations

import json

import torch

from conftest import run_python


def test_entry_point_names_the_backend_class():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="accel.backends") if e.name == "emu"]
    from accel_emu.backend import EmuBackend

    assert ep.load() is EmuBackend


def test_probe_does_not_load_emu_unless_asked():
    result = run_python(
        """
        import sys, torch
        from accel.backends import get_registry
        b = get_registry().get("emu")
        print("reason:", b.availability.reason)
        print("loaded:", "accel_emu._extension" in sys.modules, torch._C._get_privateuse1_backend_name())
        """,
        env={"ACCEL_DEVICE": ""},
    )
    assert result.returncode == 0, result.stderr
    assert "reason: emu is loaded only when asked for (ACCEL_DEVICE=emu, --backend emu or -m emu)" in result.stdout
    assert "loaded: False privateuseone" in result.stdout


def test_asking_by_name_loads_it():
    result = run_python(
        """
        from accel.backends import get_backend
        b = get_backend("emu")
        print(b.name, b.device_count(), b.comm_backend)
        """,
        env={"ACCEL_DEVICE": ""},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["emu", "2", "emu_ccl"]


def test_probing_starts_no_runtime_a_forked_child_would_lose():
    """The harness forks its rank server from a session that probed emu but ran nothing on it: loading,
    probing and counting devices leave the runtime unstarted; the first device memory starts it, and a
    child forked after that is in a bad fork."""
    result = run_python(
        """
        import os, torch
        from accel.backends import get_backend
        b = get_backend("emu")
        print("unused:", b.is_available(), b.device_count(), b.runtime_initialized())
        pid = os.fork()
        if pid == 0:
            x = torch.ones(2, device="emu")  # a child forked before the start uses the device
            os._exit(0 if float(x.sum()) == 2.0 else 1)
        print("child before the start:", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        torch.ones(2, device="emu")
        print("used:", b.runtime_initialized())
        pid = os.fork()
        if pid == 0:
            os._exit(3 if torch.emu._is_in_bad_fork() else 0)
        print("child after the start:", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """,
        env={"ACCEL_DEVICE": ""},
    )
    assert result.returncode == 0, result.stderr
    assert "unused: True 2 False" in result.stdout
    assert "child before the start: 0" in result.stdout
    assert "used: True" in result.stdout
    assert "child after the start: 3" in result.stdout, "a child forked after the start is in a bad fork"


def test_capabilities_are_probed(emu):
    from accel.backends import get_registry

    backend = get_registry().get("emu")
    assert backend.is_available(), backend.availability.reason
    caps = backend.capabilities()
    for key in ("memory_stats", "multiprocess", "fp16", "bf16", "fp16_amp", "bf16_amp", "grad_scaler"):
        assert caps[key].supported, (key, caps[key].reason)
    assert backend.comm_backend == "emu_ccl"
    assert backend.device(1) == torch.device("emu:1")
    props = backend.device_properties(1)
    assert props.total_memory == 8 * 1024**3
    t = torch.empty(1024, dtype=torch.uint8, device="emu:1")
    assert backend.memory_allocated(1) >= 1024
    del t
    with backend.timer() as timer:
        torch.ones(64, 64, device="emu") @ torch.ones(64, 64, device="emu")
    assert timer.elapsed is not None and timer.elapsed >= 0
    assert backend.is_oom_error(torch.OutOfMemoryError("emu out of memory. Tried to allocate"))


def test_accel_env_shows_emu_with_its_memory(monkeypatch):
    """What ``accel env --json`` reports, collected in this process without asking DeepSpeed (a child
    process that imports it; DeepSpeed's side is the contract suite's subject)."""
    from accel.backends import reset_registry
    from accel.commands.env import collect_environment

    monkeypatch.setenv("ACCEL_DEVICE", "emu")
    reset_registry()
    try:
        data = collect_environment(include_deepspeed=False)
    finally:
        reset_registry()
    json.dumps(data)  # the report is JSON as it stands
    (entry,) = [b for b in data["backends"] if b["name"] == "emu"]
    assert [d["total_memory"] for d in entry["devices"]] == [8 * 1024**3] * 2, entry
    assert data["selected_backend"]["name"] == "emu", data["selected_backend"]


def test_device_environment_carries_emus_settings_and_build_folder(monkeypatch):
    """An isolated child run (a fresh home folder, no ACCEL_* variables of the caller) still sees the
    same emu devices and reuses the built extension."""
    from accel.backends import get_registry
    from accel_emu._extension import build_dir
    from accel_harness.upstream import backend_env

    monkeypatch.setenv("ACCEL_EMU_MEMORY", "2GiB")
    env = get_registry().get("emu").device_environment()
    assert env["ACCEL_EMU_MEMORY"] == "2GiB" and env["ACCEL_EMU_BUILD_DIR"] == str(build_dir())
    child = backend_env("emu", others_visible={})
    assert child["ACCEL_DEVICE"] == "emu" and child["ACCEL_EMU_BUILD_DIR"] == str(build_dir())
