"""Shared fixtures of the project's own tests."""

import pytest


@pytest.fixture(autouse=True)
def fresh_state():
    """Every test starts and ends without accel's process-wide state (it is a shared singleton)."""
    from accel.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture
def clean_environment(monkeypatch, tmp_path):
    """No user override leaks in, the default config path points into tmp, and probes start fresh."""
    from accel.backends import reset_registry

    for name in ("ACCEL_DEVICE", "ACCEL_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    reset_registry()
    yield
    reset_registry()
