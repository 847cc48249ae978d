"""torch's profiler on the backend under test: a profiled training step records the device's work.

A tiny model (``_training_utils.make_model``) takes two SGD steps under ``torch.profiler.profile``
with the activities the backend names (``backend.profiler_activities``: the host's, plus the
device's own activity where torch has one for it) and ``profile_memory=True``. Checked:

* operators: the step's operators (``aten::addmm``, the optimizer's update, the autograd nodes)
  are recorded on the host, where they are dispatched, once per step at least;
* device activity (a backend with a profiler activity): device-side events of the backend's device
  (kernels, copies) with the device's index, each linked to the operator that launched it, so
  the launching operators carry device time; the batch's host-to-device copy is among them;
* memory: allocations on the device the step computes on (``profile_memory=True``), attributed to
  the operators that made them, and freed again;
* on the host backend: only the CPU activity is asked for, and every event is a host event.

One profiled run per backend is shared by the tests (two steps after a warm-up step); the whole
module costs well under a second per backend on a host-speed device.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from _training_utils import GLOBAL_BATCH, LR, make_dataset, make_model

STEPS = 2
_MEMORY_EVENT = "[memory]"
_profiles: dict[str, Any] = {}


def _profiled_steps(backend: Any, device: torch.device) -> Any:
    """Two profiled SGD steps of the tiny model on ``device`` (the batch moved there inside the step)."""
    if backend.name in _profiles:
        return _profiles[backend.name]
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = (t[:GLOBAL_BATCH] for t in make_dataset().tensors)

    def step() -> None:
        xb, yb = x.to(device), y.to(device)
        optimizer.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        optimizer.step()

    step()  # warm-up: lazy initialisation stays out of the profile
    backend.synchronize(device.index)
    with profile(activities=backend.profiler_activities, profile_memory=True) as prof:
        for _ in range(STEPS):
            step()
        backend.synchronize(device.index)
    _profiles[backend.name] = prof
    return prof


def _device_events(prof: Any) -> list[Any]:
    return [e for e in prof.events() if e.device_type != DeviceType.CPU]


def test_the_profiler_records_the_steps_operators_on_the_host(backend, device):
    prof = _profiled_steps(backend, device)
    host = Counter(e.name for e in prof.events() if e.device_type == DeviceType.CPU)
    assert host["aten::addmm"] >= 2 * STEPS, f"two linear layers per step: {host.most_common(12)}"
    assert host["aten::mse_loss"] >= STEPS
    assert any(name.startswith("Optimizer.step#SGD") for name in host), sorted(host)
    assert any("AddmmBackward" in name for name in host), "no autograd node was recorded"
    assert ProfilerActivity.CPU in backend.profiler_activities


def test_the_host_backend_profiles_host_activity_only(backend, device):
    if not backend.is_host:
        pytest.skip(f"[not-on-backend] {backend.name} is a device: its activity is checked by the device tests")
    assert backend.profiler_activity is None
    assert backend.profiler_activities == [ProfilerActivity.CPU]
    prof = _profiled_steps(backend, device)
    assert _device_events(prof) == []
    assert all(e.device_time_total == 0 for e in prof.key_averages())


def _require_device_activity(backend) -> Any:
    if backend.is_host:
        pytest.skip(f"[not-on-backend] {backend.name} computes on the host: there is no device activity")
    activity = backend.profiler_activity
    if activity is None:
        pytest.skip(f"[not-on-backend] torch's profiler has no activity for {backend.device_type} in this build")
    assert activity in backend.profiler_activities
    return activity


def test_the_profiler_records_the_devices_kernels_and_copies(backend, device):
    _require_device_activity(backend)
    prof = _profiled_steps(backend, device)
    kernels = _device_events(prof)
    assert kernels, f"no device-side event on {device} although {backend.profiler_activity} was profiled"
    assert {e.device_index for e in kernels} == {device.index}
    assert len({e.device_type for e in kernels}) == 1  # the device's own type, one for all of them
    rows = {row.key: row for row in prof.key_averages()}
    assert rows["aten::addmm"].device_time_total > 0 or backend.use_host_timers, (
        "aten::addmm launched no timed device work")
    assert rows["aten::copy_"].device_time_total > 0 or backend.use_host_timers, (
        "the batch's host-to-device copy left no device event")
    # every device event belongs to the operator that launched it
    launched = [e for e in prof.events() if e.device_type == DeviceType.CPU and e.kernels]
    assert sum(len(e.kernels) for e in launched) >= len(kernels) // 2, "device events are not linked to operators"


def test_the_profiler_records_device_allocations_and_frees(backend, device):
    prof = _profiled_steps(backend, device)
    memory = [e for e in prof.profiler.kineto_results.events() if e.name() == _MEMORY_EVENT]
    on_device = [e for e in memory if (e.device_type() == DeviceType.CPU) == backend.is_host]
    allocated = [e.nbytes() for e in on_device if e.nbytes() > 0]
    freed = [-e.nbytes() for e in on_device if e.nbytes() < 0]
    assert len(allocated) >= STEPS, f"{len(allocated)} allocations recorded on {device} in {STEPS} steps"
    assert freed, f"no free recorded on {device}"
    usage = sum((e.cpu_memory_usage if backend.is_host else e.device_memory_usage) for e in prof.key_averages())
    assert usage != 0 or sum(allocated) == sum(freed), "allocations are not attributed to operators"
    assert max(allocated) >= GLOBAL_BATCH * 4  # at least one batch-sized float32 tensor
