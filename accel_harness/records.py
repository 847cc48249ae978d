"""Result records: the JSON Lines file a harness run writes and the reports read.

File layout (one JSON object per line, every line has a ``"type"``)::

    {"type": "header", "schema": "accel.results", "schema_version": "1.0", "run_id": ..., ...}
    {"type": "test", "run_id": ..., "nodeid": ..., "test_id": ..., "outcome": ..., ...}
    ...
    {"type": "run_end", "run_id": ..., "end_time": ..., "counts": {...}}

The file is append-only: the header is never rewritten, each record is flushed as soon as its test
finishes, and the end time goes into the final ``run_end`` line. A run that is killed therefore
keeps every record that finished, and :func:`read_records` flags it as interrupted.

Schema versions are ``major.minor``. Adding fields or line types bumps the minor version and old
readers ignore what they do not know; renaming or removing a field bumps the major version, and a
reader refuses a major version it does not know.
"""

from __future__ import annotations

import copy
import json
import math
import os
import platform
import re
import subprocess
import threading
import uuid
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple

__all__ = [
    "OUTCOMES",
    "PROBLEM_KINDS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "WHEN",
    "Problem",
    "Results",
    "RecordWriter",
    "RunHeader",
    "SchemaVersionError",
    "TestRecord",
    "device_neutral_id",
    "failure_signature",
    "first_error_line",
    "accel_commit",
    "git_commit",
    "json_type",
    "make_record",
    "new_run_id",
    "read_records",
    "truncate",
    "utc_now",
]

SCHEMA = "accel.results"
SCHEMA_VERSION = "1.0"
_MAJOR = int(SCHEMA_VERSION.split(".")[0])

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
WHEN = ("setup", "call", "teardown")

#: traceback text kept per record (characters); the head and the tail survive truncation
TRACEBACK_LIMIT = 8 * 1024
#: message text kept per record (characters)
MESSAGE_LIMIT = 2 * 1024
#: longest signature (characters)
SIGNATURE_LIMIT = 300


# ---------------------------------------------------------------------------- small helpers
def utc_now() -> str:
    """The current time as ISO-8601 UTC with milliseconds (``2025-01-31T12:00:00.123+00:00``)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_run_id() -> str:
    """A unique, sortable run id: ``20250131T120000Z-1a2b3c4d``."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def truncate(text: str | None, limit: int) -> str | None:
    """``text`` cut to at most ``limit`` characters, keeping its head and (longer) tail."""
    if text is None or len(text) <= limit:
        return text
    marker = "\n... [{} characters truncated] ...\n"
    room = max(limit - len(marker.format(len(text))), 0)
    head = room // 4
    tail = room - head
    cut = len(text) - head - tail
    return text[:head] + marker.format(cut) + (text[-tail:] if tail else "")


def git_commit(cwd: str | os.PathLike[str] | None = None) -> str | None:
    """The commit checked out in ``cwd`` (default: the current directory), or None."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd, capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if out.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40,64}", commit):
        return None
    return commit


def _installed_commit(distribution: str = "accel") -> str | None:
    """The VCS commit an installed wheel was built from (PEP 610 ``direct_url.json``), or None."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution as find

        text = find(distribution).read_text("direct_url.json")
    except (ImportError, PackageNotFoundError, OSError, ValueError):
        return None
    try:
        info = json.loads(text) if text else None
    except ValueError:
        return None
    vcs = info.get("vcs_info") if isinstance(info, dict) else None
    commit = vcs.get("commit_id") if isinstance(vcs, dict) else None
    return commit if isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40,64}", commit) else None


def accel_commit(cwd: str | os.PathLike[str] | None = None) -> str | None:
    """The commit of the code under test, for a run's header.

    The checkout in ``cwd`` when it is one; else the checkout accel itself is imported from (a run
    started outside the repository, e.g. ``accel qualify`` in a scratch folder); else the commit an
    installed wheel records in its ``direct_url.json``; else None.
    """
    commit = git_commit(cwd)
    if commit:
        return commit
    package = Path(__file__).resolve().parent.parent  # the folder holding accel_harness/ (and accel/)
    if (package / ".git").exists():
        commit = git_commit(package)
        if commit:
            return commit
    return _installed_commit("accel")


_PLAIN_JSON = frozenset({str, int, bool, type(None)})


def _jsonable(value: Any) -> Any:
    """``value`` as strict JSON data: NaN/inf become None, unknown objects their ``str``."""
    kind = type(value)
    if kind in _PLAIN_JSON:  # the common case, ahead of the isinstance checks (a record has a dozen such values)
        return value
    if kind is dict:
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(_jsonable(obj), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


# ---------------------------------------------------------------------------- device-neutral ids
_NODEID_PARAMS = re.compile(r"\A(?P<base>.*?::[^:\[\]]+)\[(?P<params>.*)\]\Z", re.DOTALL)


def device_neutral_id(nodeid: str, backend_name: str | None) -> str:
    """``nodeid`` without the backend's parametrization id, so one test lines up across backends.

    ``suites/test_a.py::test_x[cpu-ws2]`` -> ``suites/test_a.py::test_x[ws2]``;
    ``t.py::test_y[cuda]`` -> ``t.py::test_y``; ``t.py::test_z[fp16-xpu-ws4]`` ->
    ``t.py::test_z[fp16-ws4]``. The plugin must use the backend name as the backend's id; only
    the first occurrence of it among the ``-``-separated ids is removed.
    """
    if not backend_name:
        return nodeid
    match = _NODEID_PARAMS.match(nodeid)
    if not match:
        return nodeid
    tokens = match.group("params").split("-")
    needle = backend_name.split("-")
    for i in range(len(tokens) - len(needle) + 1):
        if tokens[i:i + len(needle)] == needle:
            del tokens[i:i + len(needle)]
            break
    else:
        return nodeid
    rest = "-".join(tokens)
    return match.group("base") + (f"[{rest}]" if rest else "")


# ---------------------------------------------------------------------------- failure signatures
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PYTEST_E_LINE = re.compile(r"^E(?:\s+(?P<text>.*))?$")
_EXCEPTION_LINE = re.compile(
    r"^(?P<name>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning|Failure|Timeout|Fault)\w*|Failed))"
    r"(?::\s*(?P<message>.*))?$"
)
_LOCATION_PREFIX = re.compile(r"^(?:[A-Za-z]:)?[^\s:]+:\d+: ")
_TRACEBACK_NOISE = (
    "Traceback (most recent call last):",
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


def _candidate_lines(text: str) -> list[str]:
    text = _ANSI.sub("", text)
    lines = text.splitlines()
    e_lines = []
    for line in lines:
        match = _PYTEST_E_LINE.match(line.rstrip())
        if match and match.group("text"):
            e_lines.append(match.group("text").strip())
    if e_lines:  # pytest longrepr: the "E   " lines are the error
        return e_lines
    out = []
    for line in lines:  # a plain traceback: exception lines are not indented
        stripped = line.rstrip()
        if not stripped or stripped[0].isspace() or stripped in _TRACEBACK_NOISE:
            continue
        out.append(_LOCATION_PREFIX.sub("", stripped, count=1))  # --tb=line: "path:12: Error: ..."
    return out


def first_error_line(text: str | None) -> str | None:
    """The first line naming the error in ``text`` (pytest longrepr or a plain traceback).

    Prefers the first ``SomeError: message`` line (in a chained traceback, the root cause), then
    the first ``assert ...`` line, then the first ``E`` line (pytest) or non-indented line.
    """
    if not text or not text.strip():
        return None
    candidates = _candidate_lines(text)
    if not candidates:
        return text.strip().splitlines()[0].strip()
    for line in candidates:
        if _EXCEPTION_LINE.match(line):
            return line
    for line in candidates:
        if line.startswith("assert "):
            return line
    return candidates[0]


_DEVICE_NAMES = "cuda|xpu|hpu|mps|npu|mlu|musa|privateuseone|meta"
_NORMALISERS: list[tuple[re.Pattern[str], str]] = [
    # memory addresses
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<ADDR>"),
    # absolute paths (posix, home, windows) and relative paths ending in a file extension
    (re.compile(r"(?:(?<=\s)|(?<=^)|(?<=[\"'(\[=:]))(?:~|[A-Za-z]:)?(?:[\\/][\w.\-+@~]+)+[\\/]?"), "<PATH>"),
    (re.compile(r"\b[\w.\-]+(?:/[\w.\-]+)+\.[A-Za-z]\w*\b"), "<PATH>"),
    # uuid / long hex ids (git commits, request ids)
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<ID>"),
    (re.compile(r"\b(?=[0-9a-f]*[a-f])[0-9a-f]{12,}\b"), "<ID>"),
    # sizes (2.00 GiB, 512 MiB, 1024 bytes): one placeholder whatever the unit
    (re.compile(r"(?<!\w)\d+(?:\.\d+)?\s*(?:[KMGTPE]i?B|B|bytes)(?!\w)"), "<SIZE>"),
    # device indices: cuda:0, xpu:3 -> <device>:<N> keeps the device type
    (re.compile(rf"\b({_DEVICE_NAMES}):\d+\b"), r"\1:<N>"),
    # numbers (ints, decimals, versions, exponents; a time/ratio suffix kept), not parts of
    # identifiers such as fp16
    (re.compile(r"(?<!\w)[-+]?\d+(?:\.\d+)*(?:[eE][-+]?\d+)?((?:ms|us|ns|s|x|%)?)(?!\w)"), r"<N>\1"),
]
_CALLS = re.compile(r"\b(tensor|array|Parameter|Tensor)\(")


def _strip_calls(line: str) -> str:
    """Replace the contents of ``tensor(...)``/``array(...)`` with ``<VALUE>`` (brackets balanced)."""
    out = []
    pos = 0
    while True:
        match = _CALLS.search(line, pos)
        if not match:
            out.append(line[pos:])
            return "".join(out)
        out.append(line[pos:match.end()])
        depth = 1
        i = match.end()
        while i < len(line) and depth:
            if line[i] in "([{":
                depth += 1
            elif line[i] in ")]}":
                depth -= 1
            i += 1
        out.append("<VALUE>)" if depth == 0 else "<VALUE>")
        pos = i


def _normalise(line: str) -> str:
    line = _strip_calls(line)
    for pattern, replacement in _NORMALISERS:
        line = pattern.sub(replacement, line)
    line = re.sub(r"\s+", " ", line).strip()
    return line


def failure_signature(text: str | None) -> str | None:
    """The noise-free first error line of ``text``, for grouping failures by root cause.

    Numbers become ``<N>``, sizes (``2.00 GiB``, ``512 MiB``) ``<SIZE>``, addresses ``<ADDR>``,
    file paths ``<PATH>``, tensor/array contents ``<VALUE>``, long hex ids ``<ID>``, device indices
    ``cuda:<N>``; whitespace is collapsed. Two OOMs that differ only in sizes,
    or the same assertion on ``cuda:0`` and ``cuda:1``, give the same signature.
    """
    line = first_error_line(text)
    if line is None:
        return None
    signature = _normalise(line)
    if len(signature) > SIGNATURE_LIMIT:
        signature = signature[: SIGNATURE_LIMIT - 3] + "..."
    return signature


# ---------------------------------------------------------------------------- header and records
@dataclass
class RunHeader:
    """Line 1 of a results file: what ran, where, with what."""

    run_id: str
    start_time: str
    accel_version: str | None = None
    torch_version: str | None = None
    torch_build: str | None = None
    python: str | None = None
    os: str | None = None
    #: the operating system's kernel release (``platform.release()``, e.g. ``6.8.0-45-generic``)
    kernel: str | None = None
    host: str | None = None
    git_commit: str | None = None
    #: backends selected for the run, in probe order
    backends: list[str] = field(default_factory=list)
    #: backend name -> device model names (one per visible device)
    device_models: dict[str, list[str]] = field(default_factory=dict)
    #: backend name -> number of visible devices
    device_count: dict[str, int] = field(default_factory=dict)
    #: backend name -> driver version (None where the backend reports none)
    driver_versions: dict[str, str | None] = field(default_factory=dict)
    #: backend name -> runtime version (CUDA/HIP/SYCL/...)
    runtime_versions: dict[str, str | None] = field(default_factory=dict)
    #: backend name -> collective backend (None: single process only)
    comm_backends: dict[str, str | None] = field(default_factory=dict)
    #: written by readers only (the run_end line carries it in the file)
    end_time: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA
    schema_version: str = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"type": "header", **asdict(self)}

    @classmethod
    def collect(
        cls,
        backends: Iterable[Any] = (),
        *,
        run_id: str | None = None,
        start_time: str | None = None,
        environment: Mapping[str, Any] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> "RunHeader":
        """A header for a run on ``backends`` (Backend objects), filled from ``accel env`` data.

        ``environment`` defaults to :func:`accel.commands.env.collect_environment()`; pass it when
        it is already at hand. Device facts come from each backend's ``describe()``; a backend
        whose description fails is still listed, with the error in ``extra["backend_errors"]``.
        """
        if environment is None:
            from accel.commands.env import collect_environment

            environment = collect_environment(include_deepspeed=False)  # the suites test DeepSpeed's agreement
        env = environment

        def section(key: str) -> Mapping[str, Any]:
            value = env.get(key)
            return value if isinstance(value, Mapping) and set(value) != {"error"} else {}

        accel_info, torch_info, py, plat = section("accel"), section("torch"), section("python"), section("platform")
        header = cls(
            run_id=run_id or new_run_id(),
            start_time=start_time or utc_now(),
            accel_version=accel_info.get("version"),
            torch_version=torch_info.get("version"),
            torch_build=torch_info.get("build"),
            python=py.get("version") or platform.python_version(),
            os=plat.get("platform") or platform.platform(),
            kernel=plat.get("release") or platform.release() or None,
            host=plat.get("host") or platform.node(),
            git_commit=accel_commit(cwd),
            extra=dict(extra or {}),
        )
        errors: dict[str, str] = {}
        for backend in backends:
            name = str(getattr(backend, "name", backend))
            header.backends.append(name)
            try:
                info = backend.describe()
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            if info.get("error"):
                errors[name] = str(info["error"])
            devices = [d for d in info.get("devices") or [] if isinstance(d, Mapping)]
            header.device_models[name] = [str(d.get("name")) for d in devices if d.get("name")]
            header.device_count[name] = int(info.get("device_count", len(devices)) or 0)
            header.driver_versions[name] = next((d["driver_version"] for d in devices if d.get("driver_version")), None)
            header.runtime_versions[name] = next((d["runtime_version"] for d in devices if d.get("runtime_version")), None)
            header.comm_backends[name] = info.get("comm_backend")
        if errors:
            header.extra["backend_errors"] = errors
        return header


@dataclass
class TestRecord:
    """One test instance's result (one line of type ``test``)."""

    __test__ = False  # not a pytest test class, despite the name

    run_id: str
    nodeid: str
    test_id: str
    backend: str | None
    world_size: int | None
    outcome: str
    duration: float
    when: str = "call"
    #: skips: reason code (accel_harness.markers.SKIP_CODES or "unspecified") and message
    reason_code: str | None = None
    #: skips: the reason; failures/errors: the first error line; xfail: the xfail reason
    message: str | None = None
    #: failures/errors: the normalised first error line (see failure_signature)
    signature: str | None = None
    #: failures/errors: the traceback, truncated to TRACEBACK_LIMIT characters
    traceback: str | None = None
    known_issue: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}; got {self.outcome!r}")
        if self.when not in WHEN:
            raise ValueError(f"when must be one of {', '.join(WHEN)}; got {self.when!r}")

    def to_dict(self) -> dict[str, Any]:
        """The record as the JSON object of its line (a copy: changing it leaves the record alone).

        Built field by field: ``dataclasses.asdict`` deep-copies every value and cost more than the
        rest of writing a record; only ``extra`` can hold nested data, so only it is deep-copied."""
        data = {"type": "test"}
        for name in _RECORD_FIELDS:
            data[name] = getattr(self, name)
        data["extra"] = copy.deepcopy(self.extra) if self.extra else {}
        return data


#: TestRecord's fields in order, ``extra`` (copied apart) left out
_RECORD_FIELDS = tuple(f.name for f in fields(TestRecord) if f.name != "extra")


def make_record(
    *,
    run_id: str,
    nodeid: str,
    backend: str | None,
    outcome: str,
    duration: float = 0.0,
    when: str = "call",
    world_size: int | None = None,
    text: Any = None,
    message: str | None = None,
    known_issue: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> TestRecord:
    """A :class:`TestRecord` with the derived fields filled in.

    ``text`` is the report's text: for skips pytest's skip message or longrepr tuple (the reason
    code is parsed from it), for failures/errors/xfails the longrepr text (signature, first error
    line and truncated traceback are derived from it). ``message`` overrides the derived message
    (e.g. an xfail reason).
    """
    record = TestRecord(
        run_id=run_id,
        nodeid=nodeid,
        test_id=device_neutral_id(nodeid, backend),
        backend=backend,
        world_size=world_size,
        outcome=outcome,
        duration=float(duration),
        when=when,
        known_issue=known_issue,
        extra=dict(extra or {}),
    )
    if outcome == "skipped":
        from .markers import parse_skip

        reason = parse_skip(text)
        record.reason_code = reason.code
        record.message = truncate(reason.message, MESSAGE_LIMIT)
    elif text is not None:
        body = str(text)
        record.signature = failure_signature(body)
        record.message = truncate(first_error_line(body), MESSAGE_LIMIT)
        record.traceback = truncate(body, TRACEBACK_LIMIT)
    if message is not None:
        record.message = truncate(message, MESSAGE_LIMIT)
    return record


# ---------------------------------------------------------------------------- writing
class RecordWriter:
    """Appends a run's lines to ``path``: the header now, one record per :meth:`write`.

    Each line is flushed when written; ``fsync_every=N`` also forces it to disk every N records
    (0: only at close). Safe to call from several threads; not from several processes (under
    pytest-xdist let the controller, which sees every report, be the only writer).
    An existing file at ``path`` is replaced.
    """

    def __init__(self, path: str | os.PathLike[str], header: RunHeader | Mapping[str, Any], fsync_every: int = 0):
        self.path = Path(path)
        self.header = header.to_dict() if isinstance(header, RunHeader) else {"type": "header", **dict(header)}
        self.header.setdefault("schema", SCHEMA)
        self.header.setdefault("schema_version", SCHEMA_VERSION)
        if not self.header.get("run_id"):
            raise ValueError("the run header needs a run_id")
        self.run_id = str(self.header["run_id"])
        self.fsync_every = int(fsync_every)
        self.counts: dict[str, int] = {}
        self.written = 0
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "w", encoding="utf-8", newline="\n")
        self._line(self.header)
        self._sync()

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def _line(self, obj: Mapping[str, Any]) -> None:
        self._fh.write(_dumps(obj) + "\n")
        self._fh.flush()

    def _sync(self) -> None:
        try:
            os.fsync(self._fh.fileno())
        except OSError:
            pass

    def write(self, record: TestRecord | Mapping[str, Any]) -> None:
        data = record.to_dict() if isinstance(record, TestRecord) else {"type": "test", **dict(record)}
        data.setdefault("run_id", self.run_id)
        with self._lock:
            if self._fh.closed:
                raise ValueError(f"results file {self.path} is already closed")
            self._line(data)
            self.written += 1
            outcome = str(data.get("outcome"))
            self.counts[outcome] = self.counts.get(outcome, 0) + 1
            if self.fsync_every and self.written % self.fsync_every == 0:
                self._sync()

    def close(self, end_time: str | None = None, **extra: Any) -> None:
        """Append the ``run_end`` line (end time, record count, outcome counts) and close."""
        with self._lock:
            if self._fh.closed:
                return
            self._line({
                "type": "run_end",
                "run_id": self.run_id,
                "end_time": end_time or utc_now(),
                "records": self.written,
                "counts": dict(self.counts),
                **extra,
            })
            self._sync()
            self._fh.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- reading
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
