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
