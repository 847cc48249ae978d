"""Backend.profiler_activity / profiler_activities: which torch.profiler activities record a backend's work,
derived from torch (no backend lists its own)."""

from __future__ import annotations

import pytest
from torch.profiler import ProfilerActivity

from accel.backends.cpu import CPUBackend
from accel.backends.cuda import CUDABackend
from accel.backends.hpu import HPUBackend
from accel.backends.mps import MPSBackend
from accel.backends.xpu import XPUBackend


def _supported(monkeypatch, *activities):
    import torch.profiler

    monkeypatch.setattr(torch.profiler, "supported_activities", lambda: {ProfilerActivity.CPU, *activities})


def test_the_host_profiles_only_cpu_activity(monkeypatch):
    _supported(monkeypatch, ProfilerActivity.CUDA)
    assert CPUBackend().profiler_activity is None
    assert CPUBackend().profiler_activities == [ProfilerActivity.CPU]


@pytest.mark.parametrize("backend, activity", [
    (CUDABackend, ProfilerActivity.CUDA), (XPUBackend, ProfilerActivity.XPU), (HPUBackend, ProfilerActivity.HPU),
])
def test_a_device_gets_the_activity_named_like_its_type_where_torch_supports_it(monkeypatch, backend, activity):
    _supported(monkeypatch, activity)
    assert backend().profiler_activity == activity
    assert backend().profiler_activities == [ProfilerActivity.CPU, activity]
    _supported(monkeypatch)  # a build without that activity (e.g. a CPU-only torch): host activity only
    assert backend().profiler_activity is None
    assert backend().profiler_activities == [ProfilerActivity.CPU]


def test_a_device_torch_has_no_activity_for_profiles_the_host_side(monkeypatch):
    _supported(monkeypatch, ProfilerActivity.CUDA, ProfilerActivity.XPU)
    assert MPSBackend().profiler_activity is None
    assert MPSBackend().profiler_activities == [ProfilerActivity.CPU]
