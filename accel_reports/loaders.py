"""Result files into tidy pandas frames: one row per test per run, one row per run, one per benchmark.

Three inputs are understood:

* harness JSON Lines (``*.jsonl``, :mod:`accel_harness.records`): read with
  :func:`accel_harness.records.read_records`; an unknown schema (major) version raises
  :class:`accel_harness.records.SchemaVersionError` (the file is refused, never half-understood);
* pytest ``--junitxml`` files (``*.xml``), parsed with :mod:`xml.etree.ElementTree`, which never
  fetches external entities or DTDs; the harness' ``accel_backend``/``accel_world_size``/
  ``accel_known_issue`` test properties and ``run_id``/``torch_version``/``accel_version``/
  ``backend`` suite properties are used when present. A file cut short keeps the test cases read
  before the break;
* pytest-benchmark JSON (``*.json`` with a ``benchmarks`` list), see :mod:`accel_reports.benchmarks` for
  the ``extra_info`` keys read. The empty file pytest-benchmark leaves under pytest-xdist is noted
  and skipped.

Nothing unreadable stops the rest: every loader returns its rows and a list of
:class:`~accel_harness.records.Problem` ``(path, line, message, kind)`` (line 0: the file as a
whole). Every field is checked against the format's types: a record whose required field
(``nodeid``, ``outcome``; a benchmark's name and ``stats``) is missing or of a wrong type is left
out, an optional field of a wrong type is left empty and the record kept; both are ``"invalid"``
problems naming file, line and field. A file that cannot be opened or parsed (or is cut short) is
``"unreadable"``; harmless findings are ``"note"``. ``accel report`` turns the kinds into exit
codes. File names that are not valid UTF-8 (bytes ``os.listdir`` hands back as surrogate
escapes) and text holding lone surrogates (``"\\ud800"`` in JSON) are shown with U+FFFD, so
nothing downstream meets a string that cannot be encoded.

Frames (columns in :data:`TEST_COLUMNS`, :data:`RUN_COLUMNS`, :data:`BENCH_COLUMNS`):

* ``tests``: run_id, source, format, backend, torch_version, accel_version, torch_build, host,
  start_time, nodeid, test_id (device-neutral), world_size, outcome, duration, when, reason_code,
  message, signature, traceback, known_issue, tracked_pass (tuple of known-issue ids or None);
* ``runs``: run_id, source, format, backends, torch_version, torch_build, accel_version, host,
  start_time, end_time, interrupted, records, device_models, git_commit, upstream (the header's
  ``extra["upstream"]`` block of an upstream-suite run, else None; such a run's ``accel_version``
  is its subject, e.g. ``accelerate 1.15.0 tests → accel 0.1.0``, see :mod:`accel_reports.vendor`);
* ``benchmarks``: see :data:`BENCH_COLUMNS`.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from accel_harness.records import (
    OUTCOMES,
    Problem,
    SchemaVersionError,
    device_neutral_id,
    failure_signature,
    first_error_line,
    json_type,
    read_records,
)

__all__ = [
    "BENCH_COLUMNS",
    "RUN_COLUMNS",
    "TEST_COLUMNS",
    "Loaded",
    "Problem",
    "SchemaVersionError",
    "display_path",
    "display_text",
    "find_result_files",
    "load_benchmark_json",
    "load_jsonl",
    "load_junit",
    "load_results",
]

TEST_COLUMNS = [
    "run_id", "source", "format", "backend", "torch_version", "accel_version", "torch_build", "host",
    "start_time", "nodeid", "test_id", "world_size", "outcome", "duration", "when", "reason_code",
    "message", "signature", "traceback", "known_issue", "tracked_pass",
]
RUN_COLUMNS = [
    "run_id", "source", "format", "backends", "torch_version", "torch_build", "accel_version", "host",
    "start_time", "end_time", "interrupted", "records", "device_models", "git_commit", "upstream",
]
BENCH_COLUMNS = [
    "run_id", "source", "datetime", "name", "fullname", "group", "bench_id", "backend", "device", "dtype",
    "world_size", "torch_version", "accel_version", "metric", "unit", "higher_is_better", "value",
    "samples", "n_samples", "rounds", "time_median", "throughput", "host_bound", "host_ref",
    "quick",
]

#: backend names recognised in a JUnit nodeid when the file carries no ``accel_backend`` property
_KNOWN_BACKENDS = ("cpu", "cuda", "xpu", "hpu", "mps")
_RESULT_SUFFIXES = {".jsonl": "jsonl", ".xml": "junit", ".json": "benchmark"}
_OUTCOME_SET = frozenset(OUTCOMES)
#: columns taken from each test row; the others come from the run
_ROW_COLUMNS = ["nodeid", "test_id", "backend", "world_size", "outcome", "duration", "when", "reason_code",
                "message", "signature", "traceback", "known_issue", "tracked_pass"]
_RUN_FIELDS = [c for c in TEST_COLUMNS if c not in _ROW_COLUMNS]


@dataclass
class Loaded:
    """Everything loaded from a set of result files."""

    tests: pd.DataFrame
    runs: pd.DataFrame
    benchmarks: pd.DataFrame
    problems: list[Problem] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.tests.empty and self.benchmarks.empty


# ---------------------------------------------------------------------------- display-safe text
def display_text(text: Any) -> Any:
    """``text`` with what UTF-8 cannot encode (lone surrogates) replaced by U+FFFD; other values as given.

    Surrogate escapes of undecodable bytes (``os.fsdecode``) become one U+FFFD per byte.
    """
    if not isinstance(text, str) or text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:  # a lone surrogate that is no escaped byte (JSON "\ud800")
            return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def display_path(path: str | os.PathLike[str] | bytes) -> str:
    """A file name that can be printed and written into a UTF-8 report (see :func:`display_text`)."""
    return display_text(os.fsdecode(path))


def _display_deep(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return display_text(value)
    if depth > 32:
        return value
    if isinstance(value, dict):
        return {display_text(k): _display_deep(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_display_deep(v, depth + 1) for v in value]
    return value


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------- file discovery
def find_result_files(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Path], list[Problem]]:
    """The result files named by ``paths``: files as given, folders searched recursively.

    In folders, ``*.jsonl``, ``*.xml`` and ``*.json`` files are taken (a JSON file that is not
    pytest-benchmark output is noted as a problem when loaded). Each file is listed once.
    """
    found: list[Path] = []
    problems: list[Problem] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            candidates = sorted(p for p in path.rglob("*") if p.suffix.lower() in _RESULT_SUFFIXES and p.is_file())
            if not candidates:
                problems.append(Problem(display_path(path), 0, "folder holds no *.jsonl, *.xml or *.json result files", "unreadable"))
        elif path.is_file():
            candidates = [path]
        else:
            problems.append(Problem(display_path(path), 0, "no such file or folder", "unreadable"))
            continue
        for candidate in candidates:
            key = candidate.resolve()
            if key not in seen:
                seen.add(key)
                found.append(candidate)
    return found, problems


def _kind(path: Path) -> str:
    kind = _RESULT_SUFFIXES.get(path.suffix.lower())
    if kind:
        return kind
    with open(path, "rb") as fh:  # another suffix: look at the first character
        head = fh.read(4096).lstrip()
    if head.startswith(b"<"):
        return "junit"
    if head.startswith(b"{") and (b'"benchmarks"' in head or b'"machine_info"' in head):
        return "benchmark"
    return "jsonl"


# ---------------------------------------------------------------------------- harness JSON Lines
def _text(value: Any) -> str | None:
    return None if value is None else display_text(str(value))


#: text columns of a test row (made display-safe when they hold non-ASCII text)
_ROW_TEXT = ("nodeid", "test_id", "backend", "when", "reason_code", "message", "signature", "traceback", "known_issue")


def load_jsonl(path: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[Problem]]:
    """One harness results file: ``(run row, test rows, problems)``.

    Raises :class:`SchemaVersionError` for another schema or an unknown major version.
    """
    path = Path(path)
    where = display_path(path)
    header, records, problems = read_records(path)
    if where != str(path):
        problems = [p._replace(path=where) if p.path == str(path) else p for p in problems]
    if header is None:
        if records:
            problems.append(Problem(where, 1, f"{len(records)} test records without a run header; ignored", "unreadable"))
        return None, [], list(problems)
    run_id = _text(header.get("run_id")) or f"file:{where}"
    run = {
        "run_id": run_id,
        "source": where,
        "format": "jsonl",
        "backends": ", ".join(display_text(str(b)) for b in header.get("backends") or []),
        "torch_version": _text(header.get("torch_version")),
        "torch_build": _text(header.get("torch_build")),
        "accel_version": _text(header.get("accel_version")),
        "host": _text(header.get("host")),
        "start_time": _text(header.get("start_time")),
        "end_time": _text(header.get("end_time")),
        "interrupted": bool(header.get("interrupted")),
        "records": len(records),
        "device_models": display_text("; ".join(
            f"{name}: {', '.join(sorted(set(map(str, models))))}"
            for name, models in (header.get("device_models") or {}).items() if models
        )),
        "git_commit": _text(header.get("git_commit")),
        "upstream": None,
    }
    from .vendor import subject_label, upstream_block

    block = upstream_block(header)
    if block is not None:  # an upstream suite (accel qualify --upstream): the cell's version is its subject
        run["upstream"] = block = _display_deep(block)
        run["accel_version"] = display_text(subject_label(block))
    default_backend = _text((header.get("backends") or [None])[0])
    rows = []
    for number, rec in enumerate(records, start=1):  # the record dicts are completed in place
        if rec["outcome"] not in _OUTCOME_SET or not isinstance(rec["nodeid"], str):  # read_records checked both
            continue
        for name in _ROW_TEXT:
            value = rec.get(name)
            if isinstance(value, str) and not value.isascii():
                rec[name] = display_text(value)
        nodeid = rec["nodeid"]
        if not rec.get("backend"):
            rec["backend"] = default_backend
        if not rec.get("test_id"):
            rec["test_id"] = device_neutral_id(nodeid, rec["backend"])
        extra = rec.get("extra")
        tracked = extra.get("tracked_pass") if type(extra) is dict else None
        rec["tracked_pass"] = tuple(display_text(str(t)) for t in tracked) if isinstance(tracked, list) and tracked else None
        rows.append(rec)
    return run, rows, list(problems)


# ---------------------------------------------------------------------------- JUnit XML
def _junit_nodeid(case: ET.Element) -> str:
    classname = case.get("classname") or ""
    name = case.get("name") or "?"
    file_attr = case.get("file")
    parts = classname.split(".") if classname else []
    if file_attr:
        module = file_attr.replace("\\", "/")
        module_parts = module[:-3].split("/") if module.endswith(".py") else module.split("/")
        classes = parts[len(module_parts):]
        return "::".join([module, *classes, name])
    # pytest writes "pkg.module.Class": the module ends before the first capitalised part
    split = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts))
    module = "/".join(parts[:split]) + ".py" if split else ""
    return "::".join([p for p in [module, *parts[split:], name] if p])


def _junit_backend(nodeid: str) -> str | None:
    match = re.search(r"\[(.*)\]\Z", nodeid)
    if not match:
        return None
    tokens = match.group(1).split("-")
    return next((b for b in _KNOWN_BACKENDS if b in tokens), None)


def _properties(element: ET.Element) -> dict[str, str]:
    props = {}
    container = element.find("properties")
    if container is not None:
        for prop in container.findall("property"):
            if prop.get("name"):
                props[prop.get("name")] = prop.get("value") or ""
    return props


def _junit_case(case: ET.Element, suite_props: dict[str, str]) -> dict[str, Any]:
    props = _properties(case)
    nodeid = _junit_nodeid(case)
    backend = props.get("accel_backend") or suite_props.get("backend") or _junit_backend(nodeid)
    world = props.get("accel_world_size")
    outcome, when, reason_code, message, text = "passed", "call", None, None, None
    for child in case:
        tag = child.tag
        if tag in ("failure", "error"):
            text = (child.text or "").strip() or child.get("message") or ""
            message = child.get("message") or first_error_line(text)
            if tag == "failure":
                outcome = "failed"
            else:  # pytest: "failed on setup/teardown with ..."
                outcome = "error"
                lowered = (child.get("message") or "").lower()
                when = "teardown" if "teardown" in lowered else "setup"
            break
        if tag == "skipped":
            if (child.get("type") or "") == "pytest.xfail":
                outcome, message = "xfailed", child.get("message")
            else:
                from accel_harness.markers import parse_skip

                outcome = "skipped"
                reason = parse_skip(child.get("message") or (child.text or ""))
                reason_code, message = reason.code, reason.message
            break
    try:
        world_size = int(world) if world not in (None, "", "None") else None
    except ValueError:
        world_size = None
    try:
        duration = float(case.get("time") or 0.0)
    except ValueError:
        duration = 0.0
    return {
        "nodeid": nodeid,
        "test_id": device_neutral_id(nodeid, backend),
        "backend": backend,
        "world_size": world_size,
        "outcome": outcome,
        "duration": duration,
        "when": when,
        "reason_code": reason_code,
        "message": message,
        "signature": failure_signature(text) if text else None,
        "traceback": text,
        "known_issue": props.get("accel_known_issue") or None,
        "tracked_pass": None,
    }


def load_junit(path: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[Problem]]:
    """One pytest ``--junitxml`` file: ``(run row, test rows, problems)``.

    Parsed incrementally: a file cut short (or broken further down) keeps the test cases completed
    before the error, and the problem names the line. External entities are never fetched.
    """
    path = Path(path)
    where = str(path)
    problems: list[Problem] = []
    if path.stat().st_size == 0 or not path.read_bytes().strip():
        return None, [], [Problem(where, 1, "empty file: no JUnit XML")]
    rows: list[dict[str, Any]] = []
    suite_attrs: dict[str, str] = {}
    suite_props: dict[str, str] = {}
    pending_cases: list[ET.Element] = []
    in_case = False
    try:
        for event, element in ET.iterparse(str(path), events=("start", "end")):
            tag = element.tag
            if event == "start":
                if tag == "testsuite" and not suite_attrs:
                    suite_attrs = dict(element.attrib)
                elif tag == "testcase":
                    in_case = True
                continue
            if tag == "properties" and not in_case and not suite_props:
                suite_props = {p.get("name"): p.get("value") or "" for p in element.findall("property") if p.get("name")}
            elif tag == "testcase":
                in_case = False
                pending_cases.append(element)
                if len(pending_cases) >= 256:  # convert and free them as we go
                    rows.extend(_junit_case(c, suite_props) for c in pending_cases)
                    for c in pending_cases:
                        c.clear()
                    pending_cases = []
    except ET.ParseError as exc:
        line = exc.position[0] if getattr(exc, "position", None) else 0
        problems.append(Problem(where, line, f"not well-formed XML ({exc}); test cases before it are kept"))
    rows.extend(_junit_case(c, suite_props) for c in pending_cases)
    if not suite_attrs and not rows:
        if not problems:
            problems.append(Problem(where, 1, "no <testsuite> element: not a pytest --junitxml file"))
        return None, [], problems
    timestamp = suite_attrs.get("timestamp")
    run_id = suite_props.get("run_id") or f"junit:{path.stem}" + (f"@{timestamp}" if timestamp else "")
    backends = sorted({r["backend"] for r in rows if r["backend"]})
    run = {
        "run_id": run_id,
        "source": where,
        "format": "junit",
        "backends": ", ".join(backends),
        "torch_version": suite_props.get("torch_version"),
        "torch_build": suite_props.get("torch_build"),
        "accel_version": suite_props.get("accel_version"),
        "host": suite_attrs.get("hostname"),
        "start_time": timestamp,
        "end_time": None,
        "interrupted": bool(problems),
        "records": len(rows),
        "device_models": "",
        "git_commit": suite_props.get("git_commit"),
    }
    return run, rows, problems


# ---------------------------------------------------------------------------- pytest-benchmark JSON
def _line_of(text: str, needle: str) -> int:
    index = text.find(needle)
    return text.count("\n", 0, index) + 1 if index >= 0 else 0


def load_benchmark_json(path: str | os.PathLike[str], *, named: bool = True) -> tuple[list[dict[str, Any]], list[Problem]]:
    """One pytest-benchmark JSON file: ``(benchmark rows, problems)``.

    ``named=False`` (a ``*.json`` found while searching a folder) notes a JSON file that is not
    pytest-benchmark output as skipped instead of as an error.
    """
    from .benchmarks import benchmark_row

    path = Path(path)
    where = str(path)
    raw = path.read_bytes()
    if not raw.strip():
        return [], [Problem(where, 1, "empty benchmark file (pytest-benchmark writes one when it disables itself "
                                      "under pytest-xdist; run benchmarks without -n); skipped")]
    text = raw.decode("utf-8", errors="replace")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return [], [Problem(where, exc.lineno, f"not valid JSON: {exc.msg} (column {exc.colno}); file skipped")]
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        what = "not pytest-benchmark output (no \"benchmarks\" list); skipped"
        return [], [Problem(where, 1, what if named else f"{what} (found in a searched folder)")]
    machine = doc.get("machine_info") if isinstance(doc.get("machine_info"), dict) else {}
    when = _text(doc.get("datetime"))
    run_id = f"bench:{path.stem}" + (f"@{when}" if when else "")
    rows, problems = [], []
    for index, bench in enumerate(doc["benchmarks"]):
        label = bench.get("fullname") or bench.get("name") if isinstance(bench, dict) else None
        line = _line_of(text, json.dumps(label)) if label else 0
        try:
            row = benchmark_row(bench, machine)
        except (TypeError, ValueError, KeyError) as exc:
            problems.append(Problem(where, line, f"benchmark #{index + 1} ({label or 'unnamed'}) ignored: {exc}"))
            continue
        row.update({"run_id": run_id, "source": where, "datetime": when})
        rows.append(row)
    if not doc["benchmarks"]:
        problems.append(Problem(where, 1, "benchmark file lists no benchmarks"))
    return rows, problems


# ---------------------------------------------------------------------------- everything
def _frame(rows: list[dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame({c: _objects([row.get(c) for row in rows]) for c in columns}, columns=list(columns))


def load_results(paths: Iterable[str | os.PathLike[str]]) -> Loaded:
    """Load every result file named by ``paths`` (files or folders) into frames.

    Problems in a file are collected and the rest still loads. Raises
    :class:`SchemaVersionError` when a harness file has an unknown schema version: a report
    built without that file's results could say "no failures" when there were some.
    """
    files, problems = find_result_files(paths)
    explicit = {Path(p).resolve() for p in paths if Path(p).is_file()}
    run_rows: list[dict[str, Any]] = []
    entries: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    columns: dict[str, list[Any]] = {c: [] for c in TEST_COLUMNS}
    bench_rows: list[dict[str, Any]] = []
    seen_runs: dict[str, str] = {}
    for path in files:
        try:
            kind = _kind(path)
            if kind == "benchmark":
                rows, found = load_benchmark_json(path, named=path.resolve() in explicit)
                problems.extend(found)
                bench_rows.extend(rows)
                continue
            loader = load_jsonl if kind == "jsonl" else load_junit
            run, rows, found = loader(path)
        except SchemaVersionError:
            raise
        except OSError as exc:
            problems.append(Problem(str(path), 0, f"cannot be read: {exc}"))
            continue
        problems.extend(found)
        if run is None:
            continue
        if run["run_id"] in seen_runs:
            problems.append(Problem(str(path), 1, f"run {run['run_id']} was already loaded from {seen_runs[run['run_id']]}; this copy is ignored"))
            continue
        seen_runs[run["run_id"]] = str(path)
        entries.append((run, rows))
    for run, rows in _drop_junit_copies(entries, problems):
        run_rows.append(run)
        for column in _ROW_COLUMNS:
            columns[column].extend([row.get(column) for row in rows])
        for column in _RUN_FIELDS:
            columns[column].extend([run[column]] * len(rows))
    return Loaded(tests=tests_frame(columns), runs=_frame(run_rows, RUN_COLUMNS),
                  benchmarks=_benchmark_frame(bench_rows), problems=problems, files=[str(f) for f in files])


def _when(text: Any) -> datetime | None:
    try:
        moment = datetime.fromisoformat(str(text))
    except (TypeError, ValueError):
        return None
    return moment.astimezone(timezone.utc)  # a naive time (older pytest JUnit files) is local time


def _drop_junit_copies(entries: list[tuple[dict[str, Any], list[dict[str, Any]]]], problems: list[Problem]):
    """Leave out JUnit files written by the same pytest session as a loaded harness JSONL file
    (``--junitxml`` next to ``--results-dir``): the same folder, same host, start within ten minutes,
    and nine in ten of the JUnit test ids among the JSONL run's. The JSONL run has more detail.
    (Without the folder rule, two matrix cells run on one host minutes apart were confused.)"""
    harness_runs = [(run, {r["nodeid"] for r in rows}) for run, rows in entries if run["format"] == "jsonl"]
    kept = []
    for run, rows in entries:
        if run["format"] == "junit" and rows and harness_runs:
            started = _when(run["start_time"])
            nodeids = {r["nodeid"] for r in rows}
            for other, other_ids in harness_runs:
                other_start = _when(other["start_time"])
                close = started is not None and other_start is not None and abs((started - other_start).total_seconds()) <= 600
                same_folder = os.path.dirname(str(run["source"])) == os.path.dirname(str(other["source"]))
                if (same_folder and close and (run["host"] or None) == (other["host"] or None)
                        and len(nodeids & other_ids) >= 0.9 * len(nodeids)):
                    problems.append(Problem(run["source"], 0, f"the same pytest session as {other['source']} (harness results, "
                                                               "which have more detail); this JUnit file is not counted again"))
                    break
            else:
                kept.append((run, rows))
            continue
        kept.append((run, rows))
    return kept


def _objects(values: Sequence[Any]) -> pd.Series:
    """A Series of Python objects: pandas 3 would infer its own string dtype, which is much slower
    to group by than object columns when pyarrow is not installed."""
    return pd.Series(values, dtype=object)


def tests_frame(columns: dict[str, list[Any]]) -> pd.DataFrame:
    """The ``tests`` frame from column lists (see :data:`TEST_COLUMNS`)."""
    data = {}
    for name in TEST_COLUMNS:
        values = columns.get(name, [])
        if name == "duration":
            data[name] = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").fillna(0.0).astype(float)
        elif name in ("backend", "torch_version", "accel_version"):
            data[name] = _objects(["unknown" if v is None or v == "" else str(v) for v in values])
        else:
            data[name] = _objects(values)
    return pd.DataFrame(data, columns=TEST_COLUMNS)


def _benchmark_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    data = {}
    for name in BENCH_COLUMNS:
        values = [row.get(name) for row in rows]
        if name in ("backend", "torch_version", "accel_version"):
            values = ["unknown" if v is None or v == "" else str(v) for v in values]
        if name in ("value", "time_median", "throughput", "host_ref"):
            data[name] = pd.Series(values, dtype=float)
        else:
            data[name] = _objects(values)
    return pd.DataFrame(data, columns=BENCH_COLUMNS)
