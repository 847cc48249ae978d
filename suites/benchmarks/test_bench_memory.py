"""Memory bandwidth (GB/s, 1 GB = 1e9 bytes): copies within the device and between host and device.

* ``device_copy``: ``dst.copy_(src)`` of one buffer on the device. Counted as **read + write**
  (``2 x buffer bytes`` per copy), the way CUDA's bandwidthTest reports device-to-device copies.
* ``h2d``/``d2h``: one buffer copied into a preallocated buffer on the other side, counted once
  (``buffer bytes`` per copy). ``pageable`` is ordinary host memory (a blocking copy); ``pinned``
  is host memory from ``backend.pin_memory`` copied with ``non_blocking=True`` (the asynchronous
  DMA path), with completion awaited by the timer's synchronization.

On the CPU backend the device *is* host memory: ``h2d``/``d2h`` are host memory copies, and the
pinned variants skip (``backend.pin_memory`` is a no-op there, so they would repeat the pageable one).
There the copies are host memory bandwidth, which a shared host's neighbours move by tens of per
cent within seconds, so the host's memory probe is timed in rounds interleaved with the benchmark's
(``extra_info["host_reference"]["memory_gbs"]``, see ``host_reference.py``).
"""

from __future__ import annotations

import pytest
import torch

import host_reference
import timing
from accel_harness import markers

#: buffer bytes: (full, quick) on the host CPU and on accelerators. Full sizes are well beyond the
#: last-level cache (tens of MiB on server CPUs, ~50 MiB L2 on large GPUs), so memory is measured.
BUFFER_BYTES = {"cpu": (256 * 2**20, 64 * 2**20), "device": (1024 * 2**20, 128 * 2**20)}


def buffer_bytes(backend, settings: timing.Settings) -> int:
    full, quick = BUFFER_BYTES["cpu" if backend.device_type == "cpu" else "device"]
    return quick if settings.quick or settings.smoke else full


def _buffer(nbytes: int, device) -> torch.Tensor:
    return torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)


def test_device_copy(benchmark, backend, bench_settings):
    device = backend.device(0)
    nbytes = buffer_bytes(backend, bench_settings)
    src, dst = _buffer(nbytes, device), torch.empty(nbytes // 4, dtype=torch.float32, device=device)

    m = host_reference.measure_with_memory_probe(benchmark, backend, lambda: dst.copy_(src), bench_settings)
    moved = 2 * nbytes  # read + write
    info = timing.extra_info(
        backend, m, metric="device_copy", unit="GB/s", work_per_round=moved * m.iterations / timing.GB,
        work_unit="GB", dtype="float32", sizes={"buffer_bytes": nbytes, "bytes_counted_per_copy": moved},
        settings=bench_settings, counting="read + write (2 x buffer)", host_bound=timing.on_host(backend, "memory"),
    )
    timing.record(benchmark, m, info)
    assert bool(dst[-1] == 1.0)


@pytest.mark.parametrize("memory", ["pageable", "pinned"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_transfer(benchmark, backend, bench_settings, direction, memory):
    device = backend.device(0)
    nbytes = buffer_bytes(backend, bench_settings)
    host = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    pinned = memory == "pinned"
    if pinned:
        host = backend.pin_memory(host)
        if not _is_pinned(host):
            pytest.skip(markers.format_skip(markers.SkipReason(
                markers.NOT_ON_BACKEND,
                f"{backend.name}: pin_memory does not page-lock host memory on this backend "
                f"(the device is host memory), so a pinned transfer is the pageable one")))
    on_device = _buffer(nbytes, device)
    src, dst = (host, on_device) if direction == "h2d" else (on_device, host)

    m = host_reference.measure_with_memory_probe(benchmark, backend, lambda: dst.copy_(src, non_blocking=pinned), bench_settings)
    info = timing.extra_info(
        backend, m, metric=f"{direction}_{memory}", unit="GB/s", work_per_round=nbytes * m.iterations / timing.GB,
        work_unit="GB", dtype="float32", sizes={"buffer_bytes": nbytes, "bytes_counted_per_copy": nbytes},
        settings=bench_settings, direction=direction, pinned=pinned, host_bound=timing.on_host(backend, "memory"), non_blocking=pinned,
        counting="buffer bytes once per copy",
    )
    timing.record(benchmark, m, info)
    assert bool(dst[-1] == 1.0)


def _is_pinned(tensor: torch.Tensor) -> bool:
    try:
        return bool(tensor.is_pinned())
    except RuntimeError:
        return False
