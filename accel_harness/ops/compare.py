"""Compare what the device computed with what the host computed: nested outputs, tolerances, errors.

Tensors are compared element by element as ``torch.testing.assert_close`` does (``|a - e| <= atol +
rtol * |e|``, NaN equal to NaN), but the largest absolute and relative errors are always measured,
so a row reports how far off a mismatch was, not only that it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Comparison", "Tolerance", "compare", "default_tolerance", "default_tolerance_values"]


@dataclass(frozen=True)
class Tolerance:
    """``atol`` and ``rtol`` of one comparison."""

    atol: float
    rtol: float

    def __str__(self) -> str:
        return f"atol={self.atol:.3g}, rtol={self.rtol:.3g}"


def default_tolerance(dtype: torch.dtype) -> Tolerance:
    """torch.testing's default tolerance for ``dtype`` (exact for integers and bool)."""
    from torch.testing._comparison import default_tolerances

    rtol, atol = default_tolerances(dtype)
    return Tolerance(atol=float(atol), rtol=float(rtol))


def default_tolerance_values(dtype_name: str) -> tuple[float, float]:
    """``(atol, rtol)`` of :func:`default_tolerance` for a dtype given by name."""
    tolerance = default_tolerance(getattr(torch, dtype_name))
    return tolerance.atol, tolerance.rtol


@dataclass
class Comparison:
    """The result of comparing two outputs: equal within the tolerance or not, how far, and where."""

    ok: bool = True
    max_abs: float = 0.0
    max_rel: float = 0.0
    #: the first difference found: which output and what differs
    message: str | None = None

    def fail(self, where: str, what: str) -> None:
        if self.ok:
            self.ok = False
            self.message = f"{where}: {what}"


def compare(actual: Any, expected: Any, tolerance: Tolerance) -> Comparison:
    """Compare the device's ``actual`` with the host's ``expected`` (tensors, sequences, mappings, scalars)."""
    result = Comparison()
    _compare(actual, expected, tolerance, "output", result)
    return result


def _compare(actual: Any, expected: Any, tol: Tolerance, where: str, result: Comparison) -> None:
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
            result.fail(where, f"the host gave {type(expected).__name__}, the device {type(actual).__name__}")
            return
        _compare_tensors(actual, expected, tol, where, result)
    elif isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            result.fail(where, f"the host gave {len(expected)} outputs, the device {_length(actual)}")
            return
        for index, (a, e) in enumerate(zip(actual, expected)):
            _compare(a, e, tol, f"{where}[{index}]", result)
    elif isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            result.fail(where, "the outputs are mappings with different keys")
            return
        for key in expected:
            _compare(actual[key], expected[key], tol, f"{where}[{key!r}]", result)
    elif isinstance(expected, (float, complex)) and isinstance(actual, (int, float, complex)):
        _compare_numbers(complex(actual), complex(expected), tol, where, result)
    elif actual != expected and not (_is_nan(actual) and _is_nan(expected)):
        result.fail(where, f"the host gave {expected!r}, the device {actual!r}")


def _length(value: Any) -> str:
    return str(len(value)) if isinstance(value, (list, tuple)) else type(value).__name__


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _compare_numbers(a: complex, e: complex, tol: Tolerance, where: str, result: Comparison) -> None:
    if (a != a) and (e != e):  # NaN on both sides
        return
    diff = abs(a - e)
    rel = diff / abs(e) if e else (0.0 if diff == 0 else math.inf)
    result.max_abs = max(result.max_abs, diff)
    result.max_rel = max(result.max_rel, rel)
    if not diff <= tol.atol + tol.rtol * abs(e):
        result.fail(where, f"{a} against the host's {e} ({tol})")


def _dense_host(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor on the host as a plain strided tensor (sparse, quantized and conjugated views resolved)."""
    tensor = tensor.detach()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    return tensor.cpu().resolve_conj().resolve_neg()


def _compare_tensors(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance, where: str, result: Comparison) -> None:
    if actual.shape != expected.shape:
        result.fail(where, f"shape {tuple(actual.shape)} against the host's {tuple(expected.shape)}")
        return
    if actual.dtype != expected.dtype:
        result.fail(where, f"dtype {actual.dtype} against the host's {expected.dtype}")
        return
    if actual.layout != expected.layout:
        result.fail(where, f"layout {actual.layout} against the host's {expected.layout}")
        return
    a, e = _dense_host(actual), _dense_host(expected)
    if a.numel() == 0:
        return
    if a.dtype == torch.bool or not (a.is_floating_point() or a.is_complex()):
        differ = a != e
        if bool(differ.any()):
            count = int(differ.sum())
            diff = (a.to(torch.float64) - e.to(torch.float64)).abs()
            result.max_abs = max(result.max_abs, float(diff.max()))
            result.max_rel = max(result.max_rel, math.inf)
            result.fail(where, f"{count} of {a.numel()} elements differ (exact comparison for {a.dtype})")
        return
    if tol.atol == 0 and tol.rtol == 0:
        # an exact tolerance is an integer or bool sample's: a floating output (fft of integers)
        # gets the default tolerance of its own dtype
        tol = default_tolerance(a.dtype)
    wide = torch.complex128 if a.is_complex() else torch.float64
    a, e = a.to(wide), e.to(wide)
    both_nan = torch.isnan(a) & torch.isnan(e)
    same_inf = (a == e)  # equal infinities (and equal finite values) count as no difference
    diff = torch.where(both_nan | same_inf, torch.zeros((), dtype=torch.float64), (a - e).abs())
    diff = torch.nan_to_num(diff, nan=math.inf)
    magnitude = e.abs()
    allowed = tol.atol + tol.rtol * torch.nan_to_num(magnitude, nan=0.0, posinf=math.inf)
    bad = diff > allowed
    max_abs = float(diff.max())
    rel = torch.where(diff == 0, torch.zeros((), dtype=torch.float64), diff / magnitude)
    max_rel = float(torch.nan_to_num(rel, nan=math.inf).max())
    result.max_abs = max(result.max_abs, max_abs)
    result.max_rel = max(result.max_rel, max_rel)
    if bool(bad.any()):
        result.fail(where, f"{int(bad.sum())} of {a.numel()} elements differ: max abs {max_abs:.3g}, "
                           f"max rel {max_rel:.3g} ({tol})")
