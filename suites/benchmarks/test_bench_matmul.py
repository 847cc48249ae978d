"""Matrix-multiply throughput per dtype (TFLOP/s).

One call is ``a @ b`` of two ``n x n`` matrices into a preallocated output (``torch.matmul(out=)``,
so allocation is not timed): ``2 n^3`` floating-point operations. ``n`` is chosen per device type:
large enough to keep the device's units busy, small enough for a 2-core CPU runner.
"""

from __future__ import annotations

import pytest
import torch

import timing
from accel_harness import markers

DTYPES = ["float32", "bfloat16", "float16"]
#: matrix side: (full, quick) on the host CPU and on accelerators
SIDES = {"cpu": (512, 256), "device": (8192, 2048)}


def matrix_side(backend, settings: timing.Settings) -> int:
    full, quick = SIDES["cpu" if backend.device_type == "cpu" else "device"]
    return quick if settings.quick or settings.smoke else full


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
    info = timing.extra_info(
        backend, m, metric="matmul", unit="TFLOP/s", work_per_round=flop * m.iterations / timing.TFLOP,
        work_unit="TFLOP", dtype=dtype_name, sizes={"m": n, "n": n, "k": n, "flop_per_call": flop},
        settings=bench_settings, host_bound=timing.on_host(backend, "compute"), float32_matmul_precision=torch.get_float32_matmul_precision(),
    )
    timing.record(benchmark, m, info)
    expected = torch.matmul(a[:4].float(), b[:, :4].float())
    assert torch.allclose(out[:4, :4].float(), expected, rtol=5e-2, atol=5e-2 * n ** 0.5), "matmul gave wrong numbers"
