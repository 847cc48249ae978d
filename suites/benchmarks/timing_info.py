"""What a benchmark's record says besides its rounds: the ``extra_info`` values, the units and the
collectives' bus-bandwidth conventions (part of :mod:`timing`, whose docstring has the schema).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from timing_measure import Measurement
from timing_settings import Settings, quick_requested


TFLOP = 1e12
GB = 1e9
MB = 1e6


def on_host(backend: Any, kind: str) -> str | None:
    """``kind`` when ``backend`` computes on the host CPU (so the host probe applies), else None."""
    return kind if backend.device_type == "cpu" else None


def device_model(backend: Any) -> str:
    try:
        return str(backend.device_properties(0).name)
    except Exception as exc:  # a description must not fail the benchmark
        return f"unknown ({type(exc).__name__})"


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on every platform
        return None


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _versions() -> dict[str, str]:
    import torch

    try:
        import accel

        accel_version = accel.__version__
    except Exception:
        accel_version = "unknown"
    return {"torch_version": torch.__version__, "accel_version": accel_version}


def extra_info(
    backend: Any,
    measurement: Measurement,
    *,
    metric: str,
    unit: str,
    work_per_round: float,
    work_unit: str,
    dtype: str | None = None,
    world_size: int = 1,
    sizes: Mapping[str, Any] | None = None,
    settings: Settings | None = None,
    host_bound: str | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The ``extra_info`` record of one benchmark (schema in :mod:`timing`'s docstring)."""
    if not unit.startswith(work_unit + "/"):
        raise ValueError(f"work_unit {work_unit!r} must be the numerator of unit {unit!r}")
    if host_bound not in (None, "compute", "memory"):
        raise ValueError(f"host_bound must be 'compute', 'memory' or None, got {host_bound!r}")
    median = measurement.median
    info: dict[str, Any] = {
        "backend": backend.name,
        "device": device_model(backend),
        "dtype": dtype,
        "metric": metric,
        "unit": unit,
        "throughput": work_per_round / median,
        "higher_is_better": True,
        "world_size": world_size,
        "work_per_round": float(work_per_round),
        "work_unit": work_unit,
        "work_size": float(work_per_round),
        "sizes": dict(sizes or {}),
        "iterations": measurement.iterations,
        "rounds": measurement.rounds,
        "warmup_rounds": len(measurement.warmup_samples),
        "median_s": median,
        "timing": measurement.timing,
        "quick": bool(settings.quick) if settings is not None else quick_requested(),
        "torch_threads": _threads(),
        "loadavg_1m": _loadavg(),
        "host_bound": host_bound,
        **_versions(),
    }
    info.update(more)
    return info


def all_reduce_busbw_bytes(message_bytes: int, world_size: int) -> float:
    """Bytes one all-reduce of a ``message_bytes`` buffer moves per rank: ``S * 2 (n-1) / n``.

    The nccl-tests convention: a ring all-reduce sends and receives ``2 (n-1)/n`` of the buffer per
    rank, so the bus bandwidth is comparable with the link's bandwidth whatever the world size.
    """
    return message_bytes * 2.0 * (world_size - 1) / world_size


def all_gather_busbw_bytes(output_bytes: int, world_size: int) -> float:
    """Bytes one all-gather moves per rank: ``S * (n-1) / n`` with ``S`` the gathered output size."""
    return output_bytes * (world_size - 1) / world_size
