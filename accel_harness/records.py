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
from typing import Any, Iterable, Mapping

# the schema, the derived text and the reader live apart; their names stay importable from here
from .failure_text import SIGNATURE_LIMIT, device_neutral_id, failure_signature, first_error_line, truncate  # noqa: F401
from .record_reader import PROBLEM_KINDS, Problem, Results, SchemaVersionError, json_type, read_records  # noqa: F401
from .record_schema import OUTCOMES, SCHEMA, SCHEMA_VERSION, WHEN  # noqa: F401

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

#: traceback text kept per record (characters); the head and the tail survive truncation
TRACEBACK_LIMIT = 8 * 1024
#: message text kept per record (characters)
MESSAGE_LIMIT = 2 * 1024


# ---------------------------------------------------------------------------- small helpers
def utc_now() -> str:
    """The current time as ISO-8601 UTC with milliseconds (``2025-01-31T12:00:00.123+00:00``)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_run_id() -> str:
    """A unique, sortable run id: ``20250131T120000Z-1a2b3c4d``."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


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

        ``environment`` defaults to :func:`accel.sysinfo.collect_environment()`; pass it when
        it is already at hand. Device facts come from each backend's ``describe()``; a backend
        whose description fails is still listed, with the error in ``extra["backend_errors"]``.
        """
        if environment is None:
            from accel.sysinfo import collect_environment

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
        from .skip_reasons import parse_skip

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

