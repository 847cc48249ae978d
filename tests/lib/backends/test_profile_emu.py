"""The emulated device ships a device profile: it validates, its known issues are the plug-in's, and
a backend made from it alone drives emu with every claim borne out by the probes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accel_emu", reason="the emulated device (plugins/accel-emu) is not installed")

from accel.backends.profile import load_profile  # noqa: E402
from accel_harness.known_issues import KnownIssues, load_known_issues  # noqa: E402
from accel_harness.profile import load_profile_known_issues  # noqa: E402

PLUGIN = Path(__file__).resolve().parents[3] / "plugins" / "accel-emu"
PROFILE = PLUGIN / "profile.yaml"


def test_the_emu_profile_validates_and_declares_what_emu_can_do():
    profile = load_profile(PROFILE)
    assert (profile.name, profile.device_type, profile.module, profile.comm_backend) == ("emu", "emu", "emu", "emu_ccl")
    declared = profile.declared()
    assert {k: declared[k] for k in ("fp16", "bf16", "fp8", "fp16_autocast", "bf16_autocast", "fp8_autocast",
                                     "collectives", "memory_stats", "device_count")} == {
        "fp16": True, "bf16": True, "fp8": True, "fp16_autocast": True, "bf16_autocast": True, "fp8_autocast": False,
        "collectives": True, "memory_stats": True, "device_count": 2}
    assert profile.tolerance("bf16", "training") == {"rtol": 0.01, "atol": 0.02}
    assert profile.device_extra["start_method"] == "spawn"


def test_the_profile_carries_the_plugins_known_issues():
    from_profile = load_profile_known_issues(load_profile(PROFILE), KnownIssues())
    from_file = load_known_issues(PLUGIN / "known-issues.yaml")
    assert [i.as_dict() for i in from_profile] == [i.as_dict() for i in from_file]
    assert all(i.backends == ("emu",) for i in from_profile)
    # entries about tests mark them xfail; operator entries (ops patterns) cover sweep rows only
    assert all(i.xfail for i in from_profile if i.tests)
    assert {i.id for i in from_profile if i.ops} == {"emu-dense-tensors-only", "torch-linear-cross-entropy-auto-by-device-type",
                                                      "torch-fused-rnn-cells-only-for-cuda"}


def test_a_backend_from_the_profile_alone_drives_emu_and_its_claims_hold():
    script = f"""
import json
from accel.backends.profile import ProfileBackend, load_profile
from accel_harness.profile import ProfileSession
profile = load_profile({str(PROFILE)!r})
backend = ProfileBackend(profile)
session = ProfileSession(profile)
session.probe(backend)
import torch
x = torch.ones(4, device=backend.device(1)) * 2
backend.synchronize()
print(json.dumps({{"available": bool(backend.is_available()), "count": backend.device_count(),
                  "disagreements": session.disagreements, "sum": float(x.sum().cpu()), "device": str(x.device),
                  "memory": backend.memory_allocated(1) > 0,
                  "sources": {{h: backend.hook_source(h) for h in ("seed", "device_count", "get_rng_state")}}}}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("ACCEL_DEVICE", "ACCEL_PROFILE", "EMU_VISIBLE_DEVICES",
                                                             "ACCEL_EMU_DEVICES")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["available"] and found["count"] == 2 and found["disagreements"] == {}
    assert (found["sum"], found["device"], found["memory"]) == (8.0, "emu:1", True)
    assert found["sources"] == {"seed": "profile", "device_count": "profile", "get_rng_state": "profile"}
