"""Headline figures of a sweep, from its rows and census alone (torch-free: the reports use it too).

- operators passed per dtype: of the OpInfo operators compared on the device in that dtype, the
  share whose every row passed (torch's expected failures and known issues do not count as passes);
- device kernels: of the aten overloads that need a kernel per backend (not composite), the share
  the device registers itself, beside the same share for the host;
- fallbacks in a training step: the overloads a small training step reached through the fallback.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping

from .outcomes import COMPARED_OUTCOMES

__all__ = ["census_counts", "headline", "pass_rates", "support_list"]


def _get(row: Any, name: str) -> Any:
    return row.get(name) if isinstance(row, Mapping) else getattr(row, name)


def pass_rates(rows: Iterable[Any], kind: str = "op") -> dict[str, dict[str, int]]:
    """dtype -> {"compared": operators compared, "passed": operators whose every compared row passed}."""
    per_op: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in rows:
        if _get(row, "kind") == kind and _get(row, "outcome") in COMPARED_OUTCOMES:
            per_op[(_get(row, "dtype"), _get(row, "op"))].append(_get(row, "outcome"))
    rates: dict[str, dict[str, int]] = {}
    for (dtype, _), outcomes in per_op.items():
        entry = rates.setdefault(dtype, {"compared": 0, "passed": 0})
        entry["compared"] += 1
        entry["passed"] += all(o in ("passed", "xpassed") for o in outcomes)
    return rates


def census_counts(census: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts per census kind, and the device-kernel share among overloads that need a backend kernel."""
    rows = list(census)
    kinds = Counter(r["kind"] for r in rows)
    needing = [r for r in rows if r["kind"] in ("device-kernel", "fallback", "missing")]
    host = sum(1 for r in needing if r.get("host_kernel"))
    return {
        "overloads": len(rows),
        "kinds": dict(kinds),
        "need_backend_kernel": len(needing),
        "device_kernel_share": (kinds["device-kernel"] / len(needing)) if needing else None,
        "host_kernel_share": (host / len(needing)) if needing else None,
    }


def headline(rows: list[Any], census: list[Mapping[str, Any]], trace: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures a report leads with (see the module docstring)."""
    outcomes = Counter(_get(r, "outcome") for r in rows)
    reasons = Counter(_get(r, "reason_code") for r in rows if _get(r, "outcome") in ("failed", "known"))
    rates = pass_rates(rows)
    fallback_ops = [t["operator"] for t in trace if t["kind"] == "fallback"]
    return {
        "rows": len(rows),
        "outcomes": dict(outcomes),
        "failure_reasons": dict(reasons),
        "operators_passed": {d: {**v, "share": v["passed"] / v["compared"] if v["compared"] else None} for d, v in rates.items()},
        "census": census_counts(census) if census else None,
        "training_step": {"overloads": len(trace), "calls": sum(t["calls"] for t in trace),
                          "fallback_overloads": fallback_ops,
                          "fallback_calls": sum(t["calls"] for t in trace if t["kind"] == "fallback")} if trace else None,
    }


def support_list(rows: Iterable[Any]) -> list[dict[str, Any]]:
    """The publishable list: per operator, the dtypes where every compared row passed, and the limitations
    (the dtypes that failed and why), in the style of the op support tables vendors publish."""
    per_op: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if _get(row, "outcome") in COMPARED_OUTCOMES:
            per_op[_get(row, "op")][_get(row, "dtype")].append(row)
    listing = []
    for op in sorted(per_op):
        supported, limits = [], []
        for dtype, items in per_op[op].items():
            bad = [r for r in items if _get(r, "outcome") not in ("passed", "xpassed")]
            if not bad:
                supported.append(dtype)
            else:
                first = bad[0]
                limits.append(f"{dtype}: {_get(first, 'reason_code')} ({_get(first, 'variant')}, {_get(first, 'direction')})")
        listing.append({"op": op, "supported_dtypes": sorted(supported), "limitations": sorted(limits)})
    return listing
