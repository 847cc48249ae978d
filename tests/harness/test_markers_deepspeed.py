"""require_deepspeed skips backends DeepSpeed has no accelerator for (found running the suites on emu)."""

from __future__ import annotations

import types

import pytest

from accel_harness import marker_checks, markers


def _mark(name: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(name=name, args=(), kwargs={})


def _backend(device_type: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(name=device_type, device_type=device_type, is_available=lambda: True)


@pytest.fixture
def accelerators(monkeypatch):
    monkeypatch.setattr(marker_checks, "_deepspeed_accelerators", lambda: ("cuda", "cpu", "xpu"))
    monkeypatch.setattr(marker_checks, "_package_check", lambda mark, name: (lambda: None))


def test_a_device_deepspeed_knows_runs(accelerators):
    assert markers.evaluate([_mark("require_deepspeed")], _backend("cpu"), world_size=1) is None


def test_a_device_deepspeed_does_not_know_skips_with_a_reason(accelerators):
    reason = markers.evaluate([_mark("require_deepspeed")], _backend("emu"), world_size=1)
    assert reason is not None
    assert reason.code == markers.NOT_ON_BACKEND
    assert "DeepSpeed has no accelerator for emu (DS_ACCELERATOR accepts cuda, cpu, xpu)" in reason.message


def test_the_list_is_read_from_the_installed_deepspeed():
    pytest.importorskip("deepspeed")
    from accel.backends.deepspeed_agreement import deepspeed_accelerator_types

    deepspeed_accelerator_types.cache_clear()  # read afresh from the installed DeepSpeed
    supported = markers._deepspeed_accelerators()
    assert "cpu" in supported and "cuda" in supported
