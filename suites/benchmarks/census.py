"""The kernel census of a training step: what one step dispatches, launches and allocates.

:func:`take_census` runs a step function a few times under ``torch.profiler.profile`` with the
activities the backend names (``backend.profiler_activities``) and ``profile_memory=True``, and
counts per step:

* ``operators``: operator calls by name (``aten::mm``, ``aten::add_``, ...), the ones the host
  dispatches, nested calls included;
* ``kernels``: device-side activities by name (kernels, copies, ...), what the device ran; none
  on the host backend, where operators run on the host itself;
* ``allocations``: allocator requests by device type (``cpu``, ``cuda``, ``emu``, ...), as the
  profiler's memory records show them;
* ``device_us``: the device's busy time per step in microseconds, the sum of its activities' durations
  as the profiler recorded them (0 on the host backend). A figure beside the counts, not compared as one.

The train-step benchmark stores it in ``extra_info["census"]`` (:data:`CENSUS_KEY`), so a nightly run
can compare it with the last one (``accel_reports.census``): a change in what a step does (an extra
copy, a lost fusion, an allocation per step more) shows there even when the timing noise hides it.
A census is taken once per benchmark and costs a few profiled steps, outside the timed rounds.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

#: the ``extra_info`` key the census is stored under
CENSUS_KEY = "census"
#: profiled steps per census (after one unprofiled warm-up step)
CENSUS_STEPS = 2
#: the census format, for readers that must refuse one they do not know
CENSUS_SCHEMA = 1

_MEMORY_EVENT = "[memory]"
#: the profiler's scope of an operator call (RecordScope.FUNCTION); autograd nodes and user ranges differ
_FUNCTION_SCOPE = 0


def _per_step(counts: Counter, steps: int) -> dict[str, float]:
    return {name: round(count / steps, 3) for name, count in sorted(counts.items())}


def take_census(backend: Any, step: Callable[[], Any], steps: int = CENSUS_STEPS) -> dict[str, Any]:
    """Profile ``steps`` calls of ``step`` on ``backend`` (after one warm-up call) and count per step.

    Returns a JSON-ready dict: ``schema``, ``steps``, ``activities``, ``operators``, ``kernels``,
    ``allocations`` (name -> calls per step), ``totals`` (the three sums per step) and ``device_us``.
    """
    from torch.autograd import DeviceType
    from torch.profiler import profile

    if steps < 1:
        raise ValueError(f"a census needs at least one profiled step, got steps={steps}")
    activities = backend.profiler_activities
    step()
    backend.synchronize()
    with profile(activities=activities, profile_memory=True) as prof:
        for _ in range(steps):
            step()
        backend.synchronize()
    operators: Counter = Counter()
    kernels: Counter = Counter()
    allocations: Counter = Counter()
    device_ns = 0
    for event in prof.profiler.kineto_results.events():
        name = event.name()
        device_type = event.device_type()
        if name == _MEMORY_EVENT:
            if event.nbytes() > 0:
                allocations[_device_name(device_type, backend)] += 1
        elif device_type != DeviceType.CPU:
            kernels[name] += 1
            device_ns += max(int(event.duration_ns()), 0)
        elif event.scope() == _FUNCTION_SCOPE and "::" in name and not name.startswith("autograd::"):
            operators[name] += 1
    census = {
        "schema": CENSUS_SCHEMA,
        "steps": steps,
        "activities": [str(a).rsplit(".", 1)[-1] for a in activities],
        "operators": _per_step(operators, steps),
        "kernels": _per_step(kernels, steps),
        "allocations": _per_step(allocations, steps),
    }
    census["totals"] = {key: round(sum(census[key].values()), 3) for key in ("operators", "kernels", "allocations")}
    census["device_us"] = round(device_ns / 1000 / steps, 3)
    return census


def _device_name(device_type: Any, backend: Any) -> str:
    """``cpu``, ``cuda``, ... for a profiler device type; PrivateUse1 is the plug-in under test."""
    name = str(device_type).rsplit(".", 1)[-1].lower()
    return backend.device_type if name == "privateuse1" else name
