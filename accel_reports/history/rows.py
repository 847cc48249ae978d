"""Stored history rows as JSON, and the checks that every value read back has the type it should
(part of :mod:`accel_reports.history.store`): a history is input, not trusted state, so a wrong value is
left empty and a record without a valid outcome left out."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np
import pandas as pd

from accel_harness.records import MESSAGE_LIMIT, SIGNATURE_LIMIT, TRACEBACK_LIMIT, truncate

from ..load.loaders import BENCH_COLUMNS, RUN_COLUMNS, TEST_COLUMNS

#: the longest text a test record keeps per field (characters), as the harness writes it: a longer
#: one (a results file from elsewhere, an edited history) is stored and read back truncated, its head
#: and tail kept around a marker saying how much was cut
TEXT_LIMITS = {"message": MESSAGE_LIMIT, "traceback": TRACEBACK_LIMIT, "signature": SIGNATURE_LIMIT}

# ---------------------------------------------------------------------------- JSON of frame rows
def _plain(value: Any) -> Any:
    """A frame cell as JSON-able Python (tuples as lists, NaN as None, numpy scalars as Python)."""
    if value is None:
        return None
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def _object(text: Any) -> dict[str, Any] | None:
    """A stored JSON object, or None when the text is anything else (a history is input, not trusted)."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _signature(text: str) -> str | None:
    """The ``signature`` of a stored test record, or None (not stored, or not text)."""
    return _failure_facts(text)[0]


def _failure_facts(text: str) -> tuple[str | None, float | None]:
    """``(signature, flake_rate)`` of a stored failing test record, each None when not stored or of
    a wrong type (a rate must be a number from 0 to 1)."""
    record = _object(text) or {}
    signature, rate = record.get("signature"), record.get("flake_rate")
    return (signature if isinstance(signature, str) else None,
            float(rate) if _is_rate(rate) and rate is not None else None)


def _truncated(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` (a test record) with its message, traceback and signature cut to :data:`TEXT_LIMITS`
    (a copy where one is cut): a history keeps what the harness keeps, whatever the results file held."""
    long = [name for name, limit in TEXT_LIMITS.items() if isinstance(row.get(name), str) and len(row[name]) > limit]
    if not long:
        return row
    row = dict(row)
    for name in long:
        row[name] = truncate(row[name], TEXT_LIMITS[name])
    return row


def _clip_texts(columns: dict[str, list[Any]]) -> int:
    """The test columns' texts longer than :data:`TEXT_LIMITS` truncated in place (an edited or older
    history is input); how many."""
    clipped = 0
    for name, limit in TEXT_LIMITS.items():
        values = columns[name]
        for i, value in enumerate(values):
            if isinstance(value, str) and len(value) > limit:
                values[i] = truncate(value, limit)
                clipped += 1
    return clipped


# ---------------------------------------------------------------------------- stored rows are input
def _is_text(value: Any) -> bool:
    return value is None or type(value) is str


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))


def _is_int(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _is_mapping(value: Any) -> bool:
    return value is None or isinstance(value, dict)


def _is_texts(value: Any) -> bool:
    return value is None or (isinstance(value, (list, tuple)) and all(type(v) is str for v in value))


def _is_numbers(value: Any) -> bool:
    return value is None or (isinstance(value, (list, tuple)) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value))


def _is_flag(value: Any) -> bool:
    return value is None or isinstance(value, bool)


def _is_mappings(value: Any) -> bool:
    return value is None or (isinstance(value, (list, tuple)) and all(isinstance(v, dict) for v in value))


def _is_rate(value: Any) -> bool:
    return value is None or (_is_number(value) and 0 <= value <= 1)


_TEXT_FIELDS = ("run_id", "source", "format", "backend", "torch_version", "accel_version", "torch_build", "host",
                "start_time", "end_time", "nodeid", "test_id", "when", "reason_code", "message", "signature", "traceback",
                "known_issue", "expired_issue", "backends", "device_models", "git_commit", "os", "kernel", "python", "devices", "datetime",
                "name", "fullname", "group", "bench_id", "device", "dtype", "metric", "unit", "host_bound", "work_unit")
#: the type each stored field must have (a value of another type is left empty); text unless named here
_TYPES = {**{name: _is_text for name in _TEXT_FIELDS},
          "duration": _is_number, "world_size": _is_int, "tracked_pass": _is_texts, "interrupted": _is_flag,
          "records": _is_int, "upstream": _is_mapping, "driver_versions": _is_mapping, "runtime_versions": _is_mapping,
          "device_count": _is_mapping, "higher_is_better": _is_flag, "value": _is_number, "samples": _is_numbers,
          "n_samples": _is_int, "rounds": _is_int, "time_median": _is_number, "throughput": _is_number,
          "host_ref": _is_number, "quick": _is_flag, "sizes": _is_mapping, "work_size": _is_number,
          "environment": _is_mapping, "flake_rate": _is_rate, "fingerprint": _is_mapping, "selection": _is_mapping,
          "profile": _is_mapping, "profile_coverage": _is_mapping, "expired_known_issues": _is_mappings,
          "operator": _is_mapping, "ops": _is_mapping, "model_run": _is_mapping,
          "compile_run": _is_mapping}
#: checks that a value's type alone decides (numbers: a non-finite duration is made 0 by the tests frame)
_PLAIN_TYPES = {_is_text: {str, type(None)}, _is_number: {int, float, type(None)}, _is_int: {int, type(None)},
                _is_rate: {type(None)}}  # a rate: only a column without any skips the per-value check
_RUN_TYPES = {name: _TYPES[name] for name in RUN_COLUMNS if name in _TYPES}
_OUTCOMES = frozenset(("passed", "failed", "error", "skipped", "xfailed", "xpassed"))


def _clean_rows(rows: list[dict[str, Any]], types: dict[str, Any]) -> int:
    """Empty (None) every field of ``rows`` whose value has another type than ``types`` says; how many."""
    emptied = 0
    for row in rows:
        for name, check in types.items():
            if not check(row.get(name)):
                row[name] = None
                emptied += 1
    return emptied


def _clean_tests(columns: dict[str, list[Any]]) -> tuple[int, int]:
    """The test columns checked in place: wrong-typed values emptied, records without a valid
    outcome dropped; (values emptied, records dropped)."""
    emptied = 0
    for name in TEST_COLUMNS:
        check = _TYPES.get(name, _is_text)
        values = columns[name]
        if check in _PLAIN_TYPES and set(map(type, values)) <= _PLAIN_TYPES[check]:
            continue  # every value of an allowed type: one C-level pass over the column
        for i, value in enumerate(values):
            if not check(value):
                values[i] = None
                emptied += 1
    outcomes = columns["outcome"]
    keep = [i for i, outcome in enumerate(outcomes) if outcome in _OUTCOMES]
    dropped = len(outcomes) - len(keep)
    if dropped:
        for name in TEST_COLUMNS:
            values = columns[name]
            columns[name] = [values[i] for i in keep]
    return emptied, dropped


def _clean_benchmarks(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """The benchmark rows checked in place (see :func:`_clean_tests`); rows without a bench id, a
    name or a finite value are dropped."""
    bench_types = {name: _TYPES.get(name, _is_text) for name in BENCH_COLUMNS}
    emptied = _clean_rows(rows, bench_types)
    keep = [row for row in rows if row.get("bench_id") and row.get("name") and row.get("value") is not None]
    dropped = len(rows) - len(keep)
    rows[:] = keep
    return emptied, dropped


def _dumps(data: Any) -> str:
    return json.dumps(_plain(data), sort_keys=True, ensure_ascii=False)


def _digest(parts: Any) -> str:
    return hashlib.sha256(_dumps(parts).encode("utf-8")).hexdigest()


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [dict(zip(frame.columns, values)) for values in frame.itertuples(index=False, name=None)]


def _text(value: Any) -> str | None:
    value = _plain(value)
    return None if value is None else str(value)
