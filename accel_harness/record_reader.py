"""Reading a results file tolerantly: schema checks, per-field type checks, a cut-short last line.

A reader keeps whatever it can use and lists the rest as :class:`Problem` entries, so a report on a
killed or hand-edited run still shows every record that survived.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from .record_schema import _MAJOR, OUTCOMES, SCHEMA, WHEN


class SchemaVersionError(ValueError):
    """A results file written under a schema this reader does not understand."""


#: what a :class:`Problem` means for a CI gate (see ``accel report``'s exit codes)
PROBLEM_KINDS = ("invalid", "unreadable", "note")


class Problem(NamedTuple):
    """Something in an input that could not be loaded as it is: ``(path, line, message, kind)``.

    ``line`` 0 means the file as a whole. ``kind`` says what was lost:

    * ``"invalid"``: a line or field breaks the schema (garbage, a wrong type, a missing field);
      the line was skipped or the field left empty, so results may be missing;
    * ``"unreadable"``: the file, or its end, could not be read or parsed (empty, no header, cut
      short); whatever was read before the break is kept;
    * ``"note"``: nothing was lost (a duplicate copy, a harmless empty file, an odd file name).
    """

    path: str
    line: int
    message: str
    kind: str = "invalid"


class Results(NamedTuple):
    """What :func:`read_records` returns; unpacks as ``header, records, problems``."""

    header: dict[str, Any] | None
    records: list[dict[str, Any]]
    problems: list[Problem]


def _check_schema(path: Path, header: Mapping[str, Any]) -> None:
    schema = header.get("schema")
    if schema != SCHEMA:
        raise SchemaVersionError(f"results file {path} has schema {schema!r}; this accel reads {SCHEMA!r}")
    version = str(header.get("schema_version", ""))
    match = re.fullmatch(r"(\d+)(?:\.(\d+))?", version)
    if not match:
        raise SchemaVersionError(f"results file {path} has schema version {version!r}; this accel reads {_MAJOR}.x")
    if int(match.group(1)) != _MAJOR:
        raise SchemaVersionError(f"results file {path} has schema version {version}; this accel reads {_MAJOR}.x")


# ---------------------------------------------------------------------------- field checks
#: Python type -> its JSON name, for messages (exact types: a bool is not reported as an integer)
_JSON_TYPES = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
               dict: "object"}


def json_type(value: Any) -> str:
    """The JSON name of ``value``'s type, for messages: string, integer, number, boolean, ..."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _finite(value: Any) -> bool:
    return type(value) is not float or math.isfinite(value)


def _all_texts(value: Any) -> bool:
    return all(type(v) is str for v in value)


def _all_text_lists(value: Any) -> bool:
    return all(type(v) is list and _all_texts(v) for v in value.values())


# field -> (accepted types, further check or None, expected (in words), value used instead of a wrong one);
# None is always accepted (an empty field)
_Field = tuple  # (tuple[type, ...], Callable[[Any], bool] | None, str, Any)
_TEXT: _Field = ((str,), None, "a string", None)
_TEST_FIELDS: dict[str, _Field] = {
    "run_id": _TEXT, "test_id": _TEXT, "backend": _TEXT,
    "world_size": ((int,), None, "an integer", None),
    "duration": ((int, float), _finite, "a finite number", None),
    "when": ((str,), WHEN.__contains__, f"one of {', '.join(WHEN)}", None),
    "reason_code": _TEXT, "message": _TEXT, "signature": _TEXT, "traceback": _TEXT, "known_issue": _TEXT,
    "extra": ((dict,), None, "an object", {}),
}
_HEADER_FIELDS: dict[str, _Field] = {
    **{name: _TEXT for name in (
        "run_id", "start_time", "accel_version", "torch_version", "torch_build", "python", "os", "kernel",
        "host", "git_commit")},
    "backends": ((list,), _all_texts, "an array of strings", []),
    "device_models": ((dict,), _all_text_lists, "an object of arrays of strings", {}),
    **{name: ((dict,), None, "an object", {}) for name in (
        "device_count", "driver_versions", "runtime_versions", "comm_backends", "extra")},
}
_RUN_END_FIELDS: dict[str, _Field] = {
    "end_time": _TEXT,
    "counts": ((dict,), None, "an object", {}),
}


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_fields(obj: dict[str, Any], fields: Mapping[str, _Field], what: str,
                  where: str, number: int, problems: list[Problem], nodeid: str | None = None) -> None:
    """Replace every field of ``obj`` with a wrong type by its empty value, reporting each.

    Exact types: a boolean is no integer, a number with a fraction no integer (it runs per record:
    one type lookup per field in the common case). ``nodeid``: a test record's, named in messages."""
    for name, (accepted, check, expected, empty) in fields.items():
        value = obj.get(name)
        if value is None or (type(value) in accepted and (check is None or check(value))):
            continue
        if nodeid is not None:
            what = f"test record {nodeid!r}"
        problems.append(Problem(where, number, f"{what}: field {name!r}: expected {expected}, got {json_type(value)} "
                                               f"{_shown(value)}; the field is left empty", "invalid"))
        obj[name] = empty


_OUTCOME_SET = frozenset(OUTCOMES)


def _check_test(obj: dict[str, Any], where: str, number: int, problems: list[Problem]) -> bool:
    """Whether a test line can be used; fields of a wrong type are emptied (and reported)."""
    nodeid = obj.get("nodeid")
    outcome = obj.get("outcome")
    if type(nodeid) is str and nodeid and type(outcome) is str and outcome in _OUTCOME_SET:  # the common case first
        _check_fields(obj, _TEST_FIELDS, "", where, number, problems, nodeid)
        return True
    missing = [k for k in ("nodeid", "outcome") if obj.get(k) is None]
    if missing:
        problems.append(Problem(where, number, f"test record without {', '.join(missing)}; ignored", "invalid"))
        return False
    if not isinstance(nodeid, str) or not nodeid:
        problems.append(Problem(where, number, f"test record: field 'nodeid': expected a non-empty string, got "
                                               f"{json_type(nodeid)} {_shown(nodeid)}; ignored", "invalid"))
        return False
    if outcome not in OUTCOMES:
        problems.append(Problem(where, number, f"test record {nodeid!r}: field 'outcome': expected one of "
                                               f"{', '.join(OUTCOMES)}, got {json_type(outcome)} {_shown(outcome)}; ignored",
                                "invalid"))
        return False
    _check_fields(obj, _TEST_FIELDS, "", where, number, problems, nodeid)
    return True


_CUT_TEST = re.compile(r'\A\{\s*"type":\s*"test"')
_CUT_NODEID = re.compile(r'"nodeid":\s*("(?:[^"\\]|\\.)+")')
_CUT_OUTCOME = re.compile(r'"outcome":\s*"(failed|error)"')


def _cut_failure(line: str) -> dict[str, Any] | None:
    """The failed/error test record a cut-short last line began, when its nodeid and outcome were
    written before the cut (the writer puts both near the start), else None."""
    if not _CUT_TEST.match(line):
        return None
    nodeid, outcome = _CUT_NODEID.search(line), _CUT_OUTCOME.search(line)
    if nodeid is None or outcome is None:
        return None
    try:
        name = json.loads(nodeid.group(1))
    except ValueError:
        return None
    return {"type": "test", "nodeid": name, "outcome": outcome.group(1),
            "message": "(record cut short: the run was killed while writing it)"}


def _utf8_problem(raw: bytes, where: str) -> Problem | None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        return Problem(where, line, f"not valid UTF-8 (byte {exc.start}: {exc.reason}); undecodable bytes are read as U+FFFD",
                       "invalid")
    return None


def read_records(path: str | os.PathLike[str]) -> Results:
    """Load a results file tolerantly: ``(header, records, problems)``.

    Lines that cannot be used (malformed JSON, a line cut short by a killed run, a line without a
    ``type``, a test line without ``nodeid``/``outcome`` or with an unknown outcome) are reported in
    ``problems`` as ``(path, line number, message, kind)`` and the rest loads. A field of another
    type than the schema's (``duration`` a string, ``world_size`` a float, ...) is reported and
    left empty (None, or an empty list/object), and its record still loads. A cut-short last line
    that had written a test's nodeid and a ``failed``/``error`` outcome is kept as that failure
    (the run was killed while writing it; it still failed). Unknown line types and
    fields are ignored (a newer minor version may add some). The header dict gets ``end_time`` and
    ``run_end`` from the ``run_end`` line and ``"interrupted": True`` when that line is missing (a killed
    run) or says so (a Ctrl-C'd session that ended normally).

    Raises :class:`SchemaVersionError` for another schema or an unknown major version.
    """
    path = Path(path)
    raw = path.read_bytes()
    problems: list[Problem] = []
    records: list[dict[str, Any]] = []
    header: dict[str, Any] | None = None
    run_end: dict[str, Any] | None = None
    where = str(path)
    if not raw.strip():
        problems.append(Problem(where, 1, "empty file: no run header", "unreadable"))
        return Results(None, records, problems)
    bad_bytes = _utf8_problem(raw, where)
    if bad_bytes is not None:
        problems.append(bad_bytes)
    text = raw.decode("utf-8", errors="replace")
    lines = text.split("\n")
    last_content = max(i for i, line in enumerate(lines) if line.strip())
    cut_short = not text.endswith("\n")
    for index, line in enumerate(lines):
        number = index + 1
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            if index == last_content and cut_short:
                salvaged = _cut_failure(line)
                kept = ""
                if salvaged is not None:  # a failure recorded up to its outcome still failed
                    records.append(salvaged)
                    kept = f"; the {salvaged['outcome']} test it records ({salvaged['nodeid']}) is kept"
                problems.append(Problem(where, number, f"incomplete last line (the run was probably killed while writing it): {exc}"
                                                       f"{kept}", "unreadable"))
            else:
                problems.append(Problem(where, number, f"not valid JSON: {exc}", "invalid"))
            continue
        if not isinstance(obj, dict):
            problems.append(Problem(where, number, f"expected a JSON object, got {json_type(obj)}", "invalid"))
            continue
        kind = obj.get("type")
        if kind == "header":
            if header is not None:
                problems.append(Problem(where, number, "a second run header; ignored (were two runs written into one file?)", "invalid"))
                continue
            _check_schema(path, obj)
            if records:
                problems.append(Problem(where, number, "the run header is not the first line", "note"))
            header = dict(obj)
            _check_fields(header, _HEADER_FIELDS, "run header", where, number, problems)
        elif kind == "test":
            if _check_test(obj, where, number, problems):
                records.append(obj)
        elif kind == "run_end":
            run_end = dict(obj)
            _check_fields(run_end, _RUN_END_FIELDS, "run end", where, number, problems)
        elif kind is None:
            problems.append(Problem(where, number, "line has no \"type\" field; ignored", "invalid"))
        elif not isinstance(kind, str):
            problems.append(Problem(where, number, f"field 'type': expected a string, got {json_type(kind)} {_shown(kind)}; "
                                                   "line ignored", "invalid"))
        # other types: added by a newer minor schema version; ignored
    if header is None:
        problems.append(Problem(where, 1, "no run header found", "unreadable"))
    else:
        header["interrupted"] = run_end is None or run_end.get("interrupted") is True
        header["end_time"] = run_end.get("end_time") if run_end else None
        header["run_end"] = run_end
    return Results(header, records, problems)
