"""Reading pytest-benchmark entries into report rows: direction, samples and host probe.

Kept apart from the regression rule (:mod:`accel_reports.analyse.benchmark_stats`) so that loaders can read
results without the statistics; the ``extra_info`` keys read are listed in docs/reports.md.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from accel.facts.backends import BUILTIN_BACKENDS
from accel_harness.records import device_neutral_id

__all__ = ["HOST_REFERENCE_KEYS", "benchmark_row", "higher_is_better", "host_reference_value"]

_HIGHER_METRICS = ("throughput", "bandwidth", "flops", "tflops", "samples_per_second", "tokens_per_second",
                   "items_per_second", "ops", "speedup", "mfu", "utilization")
_LOWER_METRICS = ("time", "latency", "duration", "step_time", "seconds", "memory", "overhead")
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
#: ``extra_info["host_bound"]`` -> the figure of ``extra_info["host_reference"]`` it is compared with
HOST_REFERENCE_KEYS = {"compute": "compute_gflops", "memory": "memory_gbs"}


def host_reference_value(extra: Mapping[str, Any]) -> float | None:
    """The host probe figure of the benchmark's ``host_bound`` kind (None when it has none)."""
    key = HOST_REFERENCE_KEYS.get(str(extra.get("host_bound")))
    reference = extra.get("host_reference")
    if key is None or not isinstance(reference, Mapping):
        return None
    value = _number(reference.get(key))
    return value if value is not None and value > 0 else None


def higher_is_better(extra: Mapping[str, Any]) -> bool:
    """Direction of a benchmark's metric, from ``extra_info`` (the keys are listed in docs/reports.md)."""
    explicit = extra.get("higher_is_better")
    if isinstance(explicit, bool):
        return explicit
    metric = str(extra.get("metric") or "").lower()
    unit = str(extra.get("unit") or "").lower()
    if any(m in metric for m in _LOWER_METRICS):
        return False
    if any(m in metric for m in _HIGHER_METRICS):
        return True
    if unit.endswith("/s") or unit.endswith("/sec") or "flop" in unit or unit in ("it/s", "hz"):
        return True
    return False


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _backend_from(fullname: str) -> str | None:
    if "[" not in fullname:
        return None
    tokens = fullname[fullname.rfind("[") + 1:].rstrip("]").split("-")
    return next((b for b in BUILTIN_BACKENDS if b in tokens), None)


def benchmark_row(bench: Mapping[str, Any], machine: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One pytest-benchmark entry as a frame row (raises ValueError when it has no usable stats)."""
    if not isinstance(bench, Mapping):
        raise ValueError("not a JSON object")
    machine = machine or {}
    stats = bench.get("stats")
    if not isinstance(stats, Mapping):
        raise ValueError("no stats")
    extra = bench.get("extra_info") if isinstance(bench.get("extra_info"), Mapping) else {}
    name = str(bench.get("name") or bench.get("fullname") or "")
    if not name:
        raise ValueError("no name")
    fullname = str(bench.get("fullname") or name)
    backend = extra.get("backend") or _backend_from(fullname) or "unknown"
    backend = str(backend)
    times = [t for t in (_number(v) for v in stats.get("data") or []) if t is not None and t > 0]
    time_median = _number(stats.get("median"))
    if time_median is None and times:
        time_median = float(np.median(times))
    up = higher_is_better(extra)
    metric = str(extra.get("metric") or ("throughput" if up else "time"))
    unit = str(extra.get("unit") or ("1/s" if up else "s"))
    throughput = _number(extra.get("throughput"))
    given = extra.get("samples")
    if isinstance(given, list) and given:
        samples = [s for s in (_number(v) for v in given) if s is not None]
    elif up:
        work = _number(extra.get("work_size"))
        if work is None and throughput is not None and time_median:
            work = throughput * time_median
        if work is None:
            raise ValueError(f"metric {metric!r} is higher-is-better but extra_info has neither work_size nor throughput")
        samples = [work / t for t in times] if times else [throughput if throughput is not None else work / time_median]
    else:
        scale = 1.0 / _TIME_UNITS.get(unit, 1.0)  # pytest-benchmark times are seconds
        samples = [t * scale for t in times] if times else ([time_median * scale] if time_median is not None else [])
    if not samples:
        raise ValueError("no samples and no median in stats")
    world = extra.get("world_size")
    quick = extra.get("quick")
    if not isinstance(quick, bool):
        quick = bool(machine.get("bench_quick")) if isinstance(machine.get("bench_quick"), bool) else False
    return {
        "name": name,
        "fullname": fullname,
        "group": bench.get("group"),
        "bench_id": device_neutral_id(fullname, backend),
        "backend": backend,
        "device": extra.get("device"),
        "dtype": extra.get("dtype"),
        "world_size": int(world) if isinstance(world, (int, float)) and not isinstance(world, bool) else None,
        "torch_version": extra.get("torch_version") or machine.get("torch_version"),
        "accel_version": extra.get("accel_version") or machine.get("accel_version"),
        "metric": metric,
        "unit": unit,
        "higher_is_better": up,
        "value": float(np.median(samples)),
        "samples": tuple(samples),
        "n_samples": len(samples),
        "rounds": stats.get("rounds"),
        "time_median": time_median,
        "throughput": throughput,
        "host_bound": extra.get("host_bound") if extra.get("host_bound") in HOST_REFERENCE_KEYS else None,
        "host_ref": host_reference_value(extra),
        "quick": quick,
        # the problem size as the benchmark states it (``extra_info.sizes``, e.g. {"m": 1024}) and its work unit
        "sizes": dict(extra["sizes"]) if isinstance(extra.get("sizes"), dict) else None,
        "work_unit": extra.get("work_unit") if isinstance(extra.get("work_unit"), str) else None,
        "work_size": _number(extra.get("work_size")),
        # why a figure is what it is, as the benchmark explains it (e.g. a dtype without fast kernels here)
        "note": extra["note"].strip() if isinstance(extra.get("note"), str) and extra["note"].strip() else None,
    }
