"""Result files into tidy pandas frames: one row per test per run, one row per run, one per benchmark.

Three inputs are understood:

* harness JSON Lines (``*.jsonl``, :mod:`accel_harness.records`): read with
  :func:`accel_harness.records.read_records`; an unknown schema (major) version raises
  :class:`accel_harness.records.SchemaVersionError` (the file is refused, never half-understood);
* pytest ``--junitxml`` files (``*.xml``), read by :mod:`accel_reports.load.junit`;
* pytest-benchmark JSON (``*.json`` with a ``benchmarks`` list), see :mod:`accel_reports.analyse.benchmarks` for
  the ``extra_info`` keys read. The empty file pytest-benchmark leaves under pytest-xdist is noted
  and skipped.

Nothing unreadable stops the rest: every loader returns its rows and a list of
:class:`~accel_harness.records.Problem` ``(path, line, message, kind)`` (line 0: the file as a
whole). Every field is checked against the format's types: a record whose required field
(``nodeid``, ``outcome``; a benchmark's name and ``stats``) is missing or of a wrong type is left
out, an optional field of a wrong type is left empty and the record kept; both are ``"invalid"``
problems naming file, line and field. A file that cannot be opened or parsed (or is cut short) is
``"unreadable"``; harmless findings are ``"note"``. ``accel report`` turns the kinds into exit
codes. Text that UTF-8 cannot encode is shown with U+FFFD (:mod:`accel_reports.load.display`).

Frames (columns in :data:`TEST_COLUMNS`, :data:`RUN_COLUMNS`, :data:`BENCH_COLUMNS`):

* ``tests``: run_id, source, format, backend, torch_version, accel_version, torch_build, host,
  start_time, nodeid, test_id (device-neutral), world_size, outcome, duration, when, reason_code,
  message, signature, traceback, known_issue, tracked_pass (tuple of known-issue ids or None),
  flake_rate (``extra["flake"]["flake_rate"]`` of a failure re-run with ``--flake-runs``, else None),
  expired_issue (``extra["expired_known_issue"]``: the expired known issue that used to cover it),
  operator (an operator sweep's row: the fields of its ``extra`` the report reads, see
  :func:`accel_reports.load.ops_records.operator_detail`; None for any other test), model_run (a model suite
  run's figures, ``extra["model_run"]`` checked by :func:`accel_reports.load.model_records.model_run_detail`;
  None for any other test or an older record), compile_run (the compile suite's graphs and graph breaks,
  ``extra["compile"]`` checked by :func:`accel_reports.load.compile_records.compile_detail`);
* ``runs``: run_id, source, format, backends, torch_version, torch_build, accel_version, host,
  start_time, end_time, interrupted, records, device_models, git_commit, upstream (the header's
  ``extra["upstream"]`` block of an upstream-suite run, else None; such a run's ``accel_version``
  is its subject, e.g. ``accelerate 1.15.0 tests → accel 0.1.0``, see :mod:`accel_reports.analyse.vendor`),
  os, kernel, python, driver_versions, runtime_versions, device_count, devices (the environment),
  fingerprint (the header's ``extra["fingerprint"]``), selection (the ``run_end`` line's
  ``fingerprint_tests``: count and hash of the selected test ids), profile (the header's
  ``extra["profile"]`` without its local path), profile_coverage (the ``run_end`` line's) and
  expired_known_issues (id, expires, issue of each entry the run found expired), ops (an operator
  sweep's headline figures, the header's ``extra["ops"]``, checked by
  :func:`accel_reports.load.ops_records.header_figures`; a wrong one is an ``"invalid"`` problem),
  command_line (the header's ``extra["command_line"]``, None in files written before it was kept);
* ``benchmarks``: see :data:`BENCH_COLUMNS`.
"""

from __future__ import annotations

import json
import math
import os
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
    json_type,
    read_records,
)

from .compile_records import compile_detail, is_compile_id
from .display import display_deep, display_path, display_text, line_of, short
from .headers import subject_label, upstream_block
from .junit import ROW_TEXT, load_junit
from .model_records import is_model_id, model_run_detail
from .ops_records import header_figures, is_operator_id, operator_detail

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
    "message", "signature", "traceback", "known_issue", "tracked_pass", "flake_rate", "expired_issue", "operator",
    "model_run", "compile_run",
]
RUN_COLUMNS = [
    "run_id", "source", "format", "backends", "torch_version", "torch_build", "accel_version", "host",
    "start_time", "end_time", "interrupted", "records", "device_models", "git_commit", "upstream",
    "os", "kernel", "python", "driver_versions", "runtime_versions", "device_count", "devices",
    "fingerprint", "selection", "profile", "profile_coverage", "expired_known_issues", "ops", "command_line",
]
BENCH_COLUMNS = [
    "run_id", "source", "datetime", "name", "fullname", "group", "bench_id", "backend", "device", "dtype",
    "world_size", "torch_version", "accel_version", "metric", "unit", "higher_is_better", "value",
    "samples", "n_samples", "rounds", "time_median", "throughput", "host_bound", "host_ref",
    "quick", "sizes", "work_unit", "work_size", "note", "environment",
]

_RESULT_SUFFIXES = {".jsonl": "jsonl", ".xml": "junit", ".json": "benchmark"}
_OUTCOME_SET = frozenset(OUTCOMES)
#: columns taken from each test row; the others come from the run
_ROW_COLUMNS = ["nodeid", "test_id", "backend", "world_size", "outcome", "duration", "when", "reason_code",
                "message", "signature", "traceback", "known_issue", "tracked_pass", "flake_rate", "expired_issue", "operator",
                "model_run", "compile_run"]
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
    figures, wrong = header_figures(header)
    if wrong:
        problems.append(Problem(where, 1, wrong, "invalid"))
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
        # the environment block of the report, kept in the runs frame so a history can render it without the files
        "os": _text(header.get("os")),
        "kernel": _text(header.get("kernel")),
        "python": _text(header.get("python")),
        "driver_versions": display_deep(dict(header.get("driver_versions") or {})),
        "runtime_versions": display_deep(dict(header.get("runtime_versions") or {})),
        "device_count": display_deep(dict(header.get("device_count") or {})),
        "devices": _devices(header),
        **_evidence(header),
        "ops": display_deep(figures),
    }
    block = upstream_block(header)
    if block is not None:  # an upstream suite (accel qualify --upstream): the cell's version is its subject
        run["upstream"] = block = display_deep(block)
        run["accel_version"] = display_text(subject_label(block))
    default_backend = _text((header.get("backends") or [None])[0])
    rows = []
    for number, rec in enumerate(records, start=1):  # the record dicts are completed in place
        if rec["outcome"] not in _OUTCOME_SET or not isinstance(rec["nodeid"], str):  # read_records checked both
            continue
        for name in ROW_TEXT:
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
        flake = extra.get("flake") if type(extra) is dict else None
        rate = flake.get("flake_rate") if isinstance(flake, dict) else None
        rec["flake_rate"] = float(rate) if _is_number(rate) and 0 <= rate <= 1 else None
        expired = extra.get("expired_known_issue") if type(extra) is dict else None
        rec["expired_issue"] = display_text(expired) if isinstance(expired, str) and expired else None
        rec["operator"] = display_deep(operator_detail(extra)) if is_operator_id(rec["test_id"]) else None
        rec["model_run"] = display_deep(model_run_detail(extra)) if is_model_id(rec["test_id"]) else None
        rec["compile_run"] = display_deep(compile_detail(extra)) if is_compile_id(rec["test_id"]) else None
        rows.append(rec)
    return run, rows, list(problems)


def _mapping(value: Any) -> dict[str, Any] | None:
    return display_deep(dict(value)) if isinstance(value, dict) and value else None


def _evidence(header: dict[str, Any]) -> dict[str, Any]:
    """What makes runs comparable and what a device profile found, from the header's ``extra`` and the
    ``run_end`` line: fingerprint, test selection, profile summary (no local path), coverage per area,
    the expired known issues and the command line (each field None when the run did not record it)."""
    extra = header.get("extra") if isinstance(header.get("extra"), dict) else {}
    end = header.get("run_end") if isinstance(header.get("run_end"), dict) else {}
    profile = _mapping(extra.get("profile"))
    if profile is not None:
        profile.pop("path", None)  # a local path: the name, version and hash identify the file
    expired = extra.get("expired_known_issues")
    if not isinstance(expired, list) and profile is not None:
        expired = profile.get("expired_known_issues")
    entries = [{k: display_text(str(e[k])) for k in ("id", "expires", "issue") if e.get(k) is not None}
               for e in expired or [] if isinstance(e, dict) and e.get("id") is not None] if isinstance(expired, list) else []
    return {
        "fingerprint": _mapping(extra.get("fingerprint")),
        "command_line": _text(extra["command_line"]) if isinstance(extra.get("command_line"), str) else None,
        "selection": _mapping(end.get("fingerprint_tests")),
        "profile": profile,
        "profile_coverage": _mapping(end.get("profile_coverage")),
        "expired_known_issues": entries or None,
    }


def _devices(header: dict[str, Any]) -> str:
    """``xpu: 2 × Intel Data Center GPU Max 1550``: each backend's device count and models, from a run header."""
    models = header.get("device_models")
    counts = header.get("device_count")
    counts = counts if isinstance(counts, dict) else {}
    if not isinstance(models, dict):
        return ""
    parts = []
    for name, found in models.items():
        if isinstance(found, list) and found:
            count = counts.get(name)
            count = count if isinstance(count, int) and not isinstance(count, bool) else len(found)
            parts.append(f"{name}: {count} × {', '.join(sorted({str(m) for m in found}))}")
    return display_text("; ".join(parts))


def _benchmark_environment(machine: dict[str, Any], commit: Any) -> dict[str, str]:
    """The machine and commit a pytest-benchmark file was written on (its ``machine_info`` and
    ``commit_info``), kept with each benchmark row so a report from a run history can show it."""
    commit = commit if isinstance(commit, dict) else {}
    cpu = machine.get("cpu") if isinstance(machine.get("cpu"), dict) else {}

    def text(value: Any) -> str:
        return "" if value is None or isinstance(value, (dict, list)) else display_text(str(value))

    return {
        "host": text(machine.get("node")),
        "os": " ".join(text(machine[k]) for k in ("system", "release", "machine") if machine.get(k)),
        "kernel": text(machine.get("release")),
        "python": text(machine.get("python_version")),
        "cpu": text(cpu.get("brand_raw")),
        "git_commit": text(commit.get("id")) + (" (dirty)" if commit.get("dirty") is True and commit.get("id") else ""),
    }


# ---------------------------------------------------------------------------- pytest-benchmark JSON
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_numbers(value: Any) -> bool:
    return isinstance(value, list) and all(_is_number(v) for v in value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_TEXT = (lambda v: isinstance(v, str), "a string")
_NUMBER = (_is_number, "a finite number")
#: part of a pytest-benchmark entry -> field -> (check, expected); a wrong value is left empty
_BENCH_FIELDS: dict[str | None, dict[str, tuple[Any, str]]] = {
    None: {"name": _TEXT, "fullname": _TEXT, "group": _TEXT},
    "stats": {"median": _NUMBER, "data": (_is_numbers, "an array of finite numbers"), "rounds": (_is_int, "an integer")},
    "extra_info": {
        **{k: _TEXT for k in ("backend", "device", "dtype", "metric", "unit", "torch_version", "accel_version", "host_bound", "note")},
        "world_size": (_is_int, "an integer"), "throughput": _NUMBER, "work_size": _NUMBER,
        "samples": (_is_numbers, "an array of finite numbers"),
    },
}
_MACHINE_FIELDS = {"torch_version": _TEXT, "accel_version": _TEXT}


def _checked_bench(bench: dict[str, Any], label: str) -> tuple[dict[str, Any], list[str]]:
    """A copy of one benchmark entry with wrong-typed fields emptied, and the messages saying which."""
    bench = dict(bench)
    messages = []
    for part in ("stats", "extra_info"):
        value = bench.get(part)
        if value is not None and not isinstance(value, dict):
            messages.append(f"field {part!r}: expected an object, got {json_type(value)} {short(value)}")
            bench[part] = None
        elif value is not None:
            bench[part] = dict(value)
    for part, fields in _BENCH_FIELDS.items():
        target = bench if part is None else bench.get(part)
        if not isinstance(target, dict):
            continue
        for name, (check, expected) in fields.items():
            value = target.get(name)
            if value is not None and not check(value):
                where = name if part is None else f"{part}.{name}"
                messages.append(f"field {where!r}: expected {expected}, got {json_type(value)} {short(value)}")
                target[name] = None
    return bench, [f"benchmark {label}: {m}; the field is left empty" for m in messages]


def load_benchmark_json(path: str | os.PathLike[str], *, named: bool = True) -> tuple[list[dict[str, Any]], list[Problem]]:
    """One pytest-benchmark JSON file: ``(benchmark rows, problems)``.

    ``named=False`` (a ``*.json`` found while searching a folder) notes a JSON file that is not
    pytest-benchmark output as skipped instead of as an error.
    """
    from .benchmark_rows import benchmark_row

    path = Path(path)
    where = display_path(path)
    raw = path.read_bytes()
    if not raw.strip():
        return [], [Problem(where, 1, "empty benchmark file (pytest-benchmark writes one when it disables itself "
                                      "under pytest-xdist; run benchmarks without -n); skipped", "note")]
    text = raw.decode("utf-8", errors="replace")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return [], [Problem(where, exc.lineno, f"not valid JSON: {exc.msg} (column {exc.colno}); file skipped", "unreadable")]
    except RecursionError:
        return [], [Problem(where, 1, "JSON nested too deeply to read; file skipped", "unreadable")]
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        what = "not pytest-benchmark output (no \"benchmarks\" list); skipped"
        if named:
            return [], [Problem(where, 1, what, "unreadable")]
        return [], [Problem(where, 1, f"{what} (found in a searched folder)", "note")]
    problems: list[Problem] = []
    machine = doc.get("machine_info")
    if machine is not None and not isinstance(machine, dict):
        problems.append(Problem(where, line_of(text, '"machine_info"'), f"field 'machine_info': expected an object, got "
                                f"{json_type(machine)} {short(machine)}; the field is left empty", "invalid"))
    machine = dict(machine) if isinstance(machine, dict) else {}
    for name, (check, expected) in _MACHINE_FIELDS.items():
        value = machine.get(name)
        if value is not None and not check(value):
            problems.append(Problem(where, line_of(text, f'"{name}"'), f"field 'machine_info.{name}': expected {expected}, got "
                                    f"{json_type(value)} {short(value)}; the field is left empty", "invalid"))
            machine[name] = None
    when = doc.get("datetime")
    if when is not None and not isinstance(when, str):
        problems.append(Problem(where, line_of(text, '"datetime"'), f"field 'datetime': expected a string, got {json_type(when)} "
                                f"{short(when)}; the field is left empty", "invalid"))
        when = None
    when = display_text(when)
    environment = _benchmark_environment(machine, doc.get("commit_info"))
    run_id = f"bench:{display_path(path.stem)}" + (f"@{when}" if when else "")
    rows = []
    for index, bench in enumerate(doc["benchmarks"]):
        label = (bench.get("fullname") or bench.get("name")) if isinstance(bench, dict) else None
        label = label if isinstance(label, str) else None
        line = line_of(text, json.dumps(label, ensure_ascii=False)) or line_of(text, json.dumps(label)) if label else 0
        shown = f"#{index + 1} ({display_text(label) if label else 'unnamed'})"
        if not isinstance(bench, dict):
            problems.append(Problem(where, line, f"benchmark {shown} ignored: expected an object, got {json_type(bench)}", "invalid"))
            continue
        bench, messages = _checked_bench(bench, shown)
        problems.extend(Problem(where, line, m, "invalid") for m in messages)
        try:
            row = benchmark_row(bench, machine)
        except (TypeError, ValueError, KeyError, ArithmeticError) as exc:
            problems.append(Problem(where, line, f"benchmark {shown} ignored: {display_text(str(exc))}", "invalid"))
            continue
        row = {k: display_text(v) for k, v in row.items()}
        row.update({"run_id": run_id, "source": where, "datetime": when, "environment": dict(environment)})
        rows.append(row)
    if not doc["benchmarks"]:
        problems.append(Problem(where, 1, "benchmark file lists no benchmarks", "note"))
    return rows, problems


# ---------------------------------------------------------------------------- everything
def _frame(rows: list[dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame({c: _objects([row.get(c) for row in rows]) for c in columns}, columns=list(columns))


def load_results(paths: Iterable[str | os.PathLike[str]]) -> Loaded:
    """Load every result file named by ``paths`` (files or folders) into frames.

    Problems in a file are collected and the rest still loads; nothing a file holds makes this
    raise except :class:`SchemaVersionError`, raised when a harness file has an unknown schema
    version: a report built without that file's results could say "no failures" when there were
    some. (A loader that fails on a file in a way not foreseen is an ``"invalid"`` problem naming
    the exception, never a crash of the whole report.)
    """
    files, problems = find_result_files(paths)
    explicit = {Path(p).resolve() for p in paths if Path(p).is_file()}
    run_rows: list[dict[str, Any]] = []
    entries: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    columns: dict[str, list[Any]] = {c: [] for c in TEST_COLUMNS}
    bench_rows: list[dict[str, Any]] = []
    seen_runs: dict[str, str] = {}
    for path in files:
        shown = display_path(path)
        if shown != str(path):
            problems.append(Problem(shown, 0, "path is not valid UTF-8 (shown here with U+FFFD for the undecodable "
                                              "bytes); the file is loaded", "note"))
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
            problems.append(Problem(shown, 0, f"cannot be read: {display_text(exc.strerror or str(exc))}", "unreadable"))
            continue
        except MemoryError:
            problems.append(Problem(shown, 0, "too large to load into memory", "unreadable"))
            continue
        except Exception as exc:  # a case no loader foresaw: the file counts as invalid, the rest loads
            problems.append(Problem(shown, 0, f"could not be loaded ({type(exc).__name__}: {display_text(str(exc))[:200]}); "
                                              "please report this as an accel bug", "invalid"))
            continue
        problems.extend(found)
        if run is None:
            continue
        if run["run_id"] in seen_runs:
            problems.append(Problem(shown, 1, f"run {run['run_id']} was already loaded from {seen_runs[run['run_id']]}; "
                                              "this copy is ignored", "note"))
            continue
        seen_runs[run["run_id"]] = shown
        entries.append((run, rows))
    for run, rows in _drop_junit_copies(entries, problems):
        run_rows.append(run)
        for column in _ROW_COLUMNS:
            columns[column].extend([row.get(column) for row in rows])
        for column in _RUN_FIELDS:
            columns[column].extend([run[column]] * len(rows))
    return Loaded(tests=tests_frame(columns), runs=_frame(run_rows, RUN_COLUMNS),
                  benchmarks=_benchmark_frame(bench_rows), problems=problems, files=[display_path(f) for f in files])


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
                                                               "which have more detail); this JUnit file is not counted again", "note"))
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
