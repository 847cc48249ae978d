"""Matrix-multiply throughput per dtype (TFLOP/s).

One call is ``a @ b`` of two ``n x n`` matrices into a preallocated output (``torch.matmul(out=)``,
so allocation is not timed): ``2 n^3`` floating-point operations. ``n`` is chosen per device type:
large enough to keep the device's units busy, small enough for a 2-core CPU runner. On a device that
is slower than that size assumes (an emulated device computing on the host, say), ``n`` is the largest
power of two from the host's side up whose float32 call is expected to stay under :data:`MAX_CALL_S`
(``extra_info["sizes"]["limited_by_speed"]`` says so), so a round still times in seconds.

A dtype other than float32 whose matmul runs far slower than a float32 matmul of the same size on
the same device (:data:`accel_reports.analyse.claims.SLOW_FACTOR`) has no fast kernels there (half precision
on a CPU without half-precision units falls back to a slow path): the device is asked by timing a few
rounds of float32 calls beside the benchmark. That is a claim about the hardware, so the record makes
it (``extra_info["note"]``, shown beside the figure) only when both figures are steady; otherwise the
note says the figure is too noisy to conclude (:func:`accel_reports.analyse.claims.slow_kernel_note`). The
ratio is ``extra_info["float32_ratio"]`` and the reference's spread ``extra_info["float32_spread"]``,
from which the report draws the claim again.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

import timing
from accel_harness import markers
from accel_reports.analyse.claims import SLOW_FACTOR, slow_kernel_note
from accel_reports.analyse.noise import relative_iqr

__all__ = ["MAX_CALL_S", "SLOW_FACTOR", "float32_seconds_per_call", "matrix_side", "matrix_side_of_class", "slow_dtype_note"]

DTYPES = ["float32", "bfloat16", "float16"]
#: matrix side: (full, quick) on the host CPU and on accelerators
SIDES = {"cpu": (512, 256), "device": (8192, 2048)}
#: float32 rounds timed to compare a dtype with (enough for a spread), and calls per round
REFERENCE_ROUNDS = 6
REFERENCE_CALLS = 2


#: longest a float32 call may be expected to take on a device's side; a matmul 8x the work of a measured
#: one is expected to take 8x its time
MAX_CALL_S = 0.25
_sides: dict[str, int] = {}


def matrix_side(backend, settings: timing.Settings) -> int:
    """The matrix side for ``backend``: its class's full (or quick) side, grown by doublings on a device
    whose float32 calls show it cannot do the full side within :data:`MAX_CALL_S` (remembered per backend,
    so every dtype of a run gets the same side)."""
    full = matrix_side_of_class(backend, settings)
    if settings.quick or settings.smoke or backend.device_type == "cpu":
        return full
    if backend.name not in _sides:
        n = SIDES["cpu"][0]
        while n < full and 8 * _seconds_per_float32_call(backend, n) < MAX_CALL_S:
            n *= 2
        _sides[backend.name] = n
    return _sides[backend.name]


def matrix_side_of_class(backend, settings: timing.Settings) -> int:
    """The side :data:`SIDES` gives ``backend``'s class (host or device) for this run's settings."""
    full, quick = SIDES["cpu" if backend.device_type == "cpu" else "device"]
    return quick if settings.quick or settings.smoke else full


def _seconds_per_float32_call(backend, n: int) -> float:
    """The median of three warm float32 ``n x n`` matmuls on the backend's device."""
    a = torch.ones(n, n, device=backend.device(0))
    out = torch.empty_like(a)
    torch.matmul(a, a, out=out)
    backend.synchronize()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        torch.matmul(a, a, out=out)
        backend.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def float32_seconds_per_call(backend, n: int) -> tuple[float, float | None]:
    """Seconds one float32 ``n x n`` matmul takes on the backend's device (the median of a few short
    rounds, warm-up first) and the rounds' spread (:func:`accel_reports.analyse.noise.relative_iqr`)."""
    device = backend.device(0)
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(1)).to(device=device)
    out = torch.empty_like(a)
    torch.matmul(a, a, out=out)
    backend.synchronize()
    rounds = []
    for _ in range(REFERENCE_ROUNDS):
        start = time.perf_counter()
        for _ in range(REFERENCE_CALLS):
            torch.matmul(a, a, out=out)
        backend.synchronize()
        rounds.append((time.perf_counter() - start) / REFERENCE_CALLS)
    return statistics.median(rounds), relative_iqr(rounds)


def slow_dtype_note(dtype_name: str, seconds_per_call: float, float32_seconds: float,
                    spread: float | None = None, float32_spread: float | None = None) -> str | None:
    """The note a dtype's record carries when its matmul is at least ``SLOW_FACTOR`` times slower than
    float32's on the same device: the claim when both spreads allow it, else "too noisy to conclude"
    (None when it is not that slow, and for float32 itself)."""
    if not (seconds_per_call > 0 and float32_seconds > 0):
        return None
    return slow_kernel_note(dtype_name, seconds_per_call / float32_seconds, spread, float32_spread)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_matmul(benchmark, backend, bench_settings, dtype_name):
    dtype = getattr(torch, dtype_name)
    cap = backend.dtype_capability(dtype)
    if not cap:
        pytest.skip(markers.format_skip(markers.SkipReason(markers.UNSUPPORTED_DTYPE, f"{backend.name}: {cap.reason}")))
    device = backend.device(0)
    n = matrix_side(backend, bench_settings)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def call():
        torch.matmul(a, b, out=out)

    m = timing.measure(backend, call, bench_settings)
    flop = 2.0 * n ** 3
    notes = {}
    if dtype_name != "float32":
        float32_seconds, float32_spread = float32_seconds_per_call(backend, n)
        per_call = m.median / m.iterations
        notes["float32_ratio"] = per_call / float32_seconds if float32_seconds > 0 else None
        notes["float32_spread"] = float32_spread
        own_spread = relative_iqr(m.samples)  # the figure's spread, as timing.record stores it
        note = slow_dtype_note(dtype_name, per_call, float32_seconds, own_spread, float32_spread)
        if note:
            notes["note"] = note
    info = timing.extra_info(
        backend, m, metric="matmul", unit="TFLOP/s", work_per_round=flop * m.iterations / timing.TFLOP,
        work_unit="TFLOP", dtype=dtype_name, sizes={"m": n, "n": n, "k": n, "flop_per_call": flop,
                                                     "limited_by_speed": n < matrix_side_of_class(backend, bench_settings)},
        settings=bench_settings, host_bound=timing.on_host(backend, "compute"), float32_matmul_precision=torch.get_float32_matmul_precision(), **notes,
    )
    timing.record(benchmark, m, info)
    expected = torch.matmul(a[:4].float(), b[:, :4].float())
    assert torch.allclose(out[:4, :4].float(), expected, rtol=5e-2, atol=5e-2 * n ** 0.5), "matmul gave wrong numbers"
