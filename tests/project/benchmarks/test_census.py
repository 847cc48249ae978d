"""The kernel census of a training step (suites/benchmarks/census.py), taken on the host backend."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

CENSUS = Path(__file__).resolve().parents[3] / "suites" / "benchmarks" / "census.py"


@pytest.fixture(scope="module")
def census_module():
    spec = importlib.util.spec_from_file_location("accel_bench_census_under_test", CENSUS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_host_step_counts_its_operators_and_allocations_and_no_device_time(census_module):
    from accel.backends import get_backend

    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        optimizer.zero_grad()
        model(torch.randn(16, 8)).sum().backward()
        optimizer.step()

    census = census_module.take_census(get_backend("cpu"), step, steps=2)
    assert census["schema"] == census_module.CENSUS_SCHEMA and census["steps"] == 2
    assert census["operators"].get("aten::addmm", 0) >= 1  # the forward's matmul, once per step at least
    assert census["kernels"] == {} and census["device_us"] == 0  # on the host nothing runs on a device
    assert census["allocations"].get("cpu", 0) >= 1 and census["totals"]["operators"] == pytest.approx(
        sum(census["operators"].values()), abs=0.01)


def test_a_census_needs_a_profiled_step(census_module):
    from accel.backends import get_backend

    with pytest.raises(ValueError, match="at least one profiled step"):
        census_module.take_census(get_backend("cpu"), lambda: None, steps=0)
