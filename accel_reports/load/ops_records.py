"""What the loader keeps of an operator sweep's records: the row ids, each row's details and the run header's figures.

An operator sweep (:mod:`accel_harness.ops`) writes one test record per operator x variant x dtype x
direction, with the id ``suites/test_ops.py::<op>[<kind>-<variant>-<dtype>-<direction>]``
(:func:`accel_harness.ops.output.nodeid_of`), and the sweep's headline figures in its run header
(``extra.ops``). Every value is checked for its type on the way in; the analyses of the rows are in
:mod:`accel_reports.analyse.operators`. Torch-free.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from accel_harness.records import json_type

__all__ = ["OPS_PREFIX", "checked_figures", "header_figures", "is_operator_id", "operator_detail", "parse_operator_id"]

#: how every operator row's test id begins (the suite file the sweep's rows are filed under)
OPS_PREFIX = "suites/test_ops.py::"
_ID = re.compile(r"\A" + re.escape(OPS_PREFIX) + r"(?P<op>[^\[\]]+)\[(?P<kind>[^\-\[\]]+)-(?P<variant>[^\-\[\]]+)-"
                 r"(?P<dtype>[^\-\[\]]+)-(?P<direction>[^\-\[\]]+)\]\Z")
#: characters kept of a text field of an operator row's details
_TEXT_LIMIT = 300


def parse_operator_id(test_id: Any) -> dict[str, str] | None:
    """``{op, kind, variant, dtype, direction}`` of an operator row's test id, None for any other test."""
    if not isinstance(test_id, str) or not test_id.startswith(OPS_PREFIX):
        return None
    match = _ID.match(test_id)
    return match.groupdict() if match else None


def is_operator_id(test_id: Any) -> bool:
    """Whether ``test_id`` names a row of an operator sweep."""
    return parse_operator_id(test_id) is not None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _share(value: Any) -> bool:
    return value is None or (_finite(value) and 0 <= value <= 1)


def operator_detail(extra: Any) -> dict[str, Any] | None:
    """The fields of an operator row's ``extra`` the report uses (reason code, errors, tolerance), each
    kept only when of the right type; None when there is none (the text is read instead)."""
    if not isinstance(extra, dict):
        return None
    detail: dict[str, Any] = {}
    for name in ("reason_code", "outcome", "tolerance"):
        if isinstance(extra.get(name), str):
            detail[name] = extra[name][:_TEXT_LIMIT]
    for name in ("max_abs_err", "max_rel_err"):
        if _finite(extra.get(name)):
            detail[name] = float(extra[name])
    return detail or None


def _dict_of(value: Any, check: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and check(v) for k, v in value.items())


def _rate(value: Any) -> bool:
    return (isinstance(value, dict) and _count(value.get("compared")) and _count(value.get("passed"))
            and _share(value.get("share")))


def _census(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and _count(value.get("overloads")) and _dict_of(value.get("kinds"), _count)
                             and _count(value.get("need_backend_kernel")) and _share(value.get("device_kernel_share"))
                             and _share(value.get("host_kernel_share")))


def _step(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and _count(value.get("overloads")) and _count(value.get("calls"))
                             and _count(value.get("fallback_calls")) and isinstance(value.get("fallback_overloads"), list)
                             and all(isinstance(o, str) for o in value["fallback_overloads"]))


def _claim(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("verdict"), str) and _count(value.get("passed"))
            and _count(value.get("compared")))


#: part of a sweep's figures -> its check (what accel_harness.ops.output.headline_lines reads, and the claims)
_FIGURES = {"operators_passed": lambda v: _dict_of(v, _rate), "outcomes": lambda v: _dict_of(v, _count),
            "census": _census, "training_step": _step,
            "profile_claims": lambda v: v is None or _dict_of(v, _claim)}


def checked_figures(value: Any) -> tuple[dict[str, Any] | None, str | None]:
    """A run header's ``extra.ops`` checked part by part: ``(figures, None)`` when every part the report
    reads has its type, ``(None, what is wrong)`` otherwise, ``(None, None)`` when there are none."""
    if value is None:
        return None, None
    if not isinstance(value, dict):
        return None, f"expected an object, got {json_type(value)}"
    for name, check in _FIGURES.items():
        if name in ("operators_passed", "outcomes") and name not in value:
            return None, f"{name!r} is missing"
        if not check(value.get(name)):
            return None, f"{name!r} is not what accel ops writes"
    return {**{name: value.get(name) for name in _FIGURES}, "profile_claims": value.get("profile_claims") or {}}, None


def header_figures(header: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The headline figures of an operator sweep's run header (``extra.ops`` where ``extra.stage`` is
    ``operators``), and the problem to report when they are malformed (the report then recomputes them)."""
    extra = header.get("extra") if isinstance(header.get("extra"), dict) else {}
    if extra.get("stage") != "operators":
        return None, None
    figures, wrong = checked_figures(extra.get("ops"))
    if wrong:
        return None, (f"field 'extra.ops': {wrong}; the operator figures are recomputed from the records (without the "
                      "census and the training step)")
    return figures, None
