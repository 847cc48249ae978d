"""Run history in a database: every run's test records and benchmark samples, appended.

Two stores, one schema and one behaviour:

* an **SQLite file** (the standard library's :mod:`sqlite3`, the default): no new dependency (the
  store is written by ``accel qualify`` and ``ci.collect`` on machines where only accel is
  installed), one file that CI can keep as an artifact or cache; WAL journal, so a report reads
  while another process appends. Good for one machine, or one CI job at a time.
* a **PostgreSQL database** (``postgresql://...``, through psycopg 3, the ``accel[postgres]``
  extra, imported only when such a URL is given): for a lab where many hosts import into one
  shared history at once. An SQLite file on a network share is not a shared database (its locks
  do not hold over most network file systems).

Concurrency: the schema check and its creation are one write transaction (SQLite ``BEGIN
IMMEDIATE``; PostgreSQL a transaction holding an advisory lock), and so is every import: the check
"already stored?" and the inserts of all its runs happen under the same lock, so any number of
processes may create, import into and read one history at once. A process waiting for the lock
waits up to :data:`BUSY_TIMEOUT` seconds. Each run gets its import order (``seq``) from the
database inside that transaction, unique by constraint. A reader sees whole imports only.

Layout (schema version :data:`SCHEMA_VERSION`, recorded in ``meta`` and, in SQLite, in
``PRAGMA user_version``):

* ``runs``: one row per run: ``run_id`` (primary key), ``kind`` (``tests`` or ``benchmarks``),
  ``digest`` (SHA-256 of the run's content, without file paths), the cell (backend, torch
  version, accel version), ``start_time``, ``quick``, ``source`` (where it was imported from: a
  label, never opened again), ``seq`` (import order, unique) and the loader's run row as JSON;
* ``tests``: one row per test record (its loader row as JSON, with the cell, test id and outcome
  as columns), indexed by (cell, test id);
* ``benchmarks``: one row per benchmark per run (its loader row as JSON, raw samples, problem
  sizes and the machine it ran on included), indexed by (backend, torch version, bench id).

The history holds everything a report shows: rendering from it reads no other file. It is input,
not trusted state (a CI cache restores it): nothing a row names is opened, and every stored value
is checked for its type when read (a wrong one is left empty, a record without a valid outcome left
out, each with a note in the report). A history written by schema
version 1 is upgraded in place when opened (its import order renumbered uniquely).

Importing is idempotent: a run whose id is already stored with the same digest is skipped
(``IngestResult.already``), also when another process stored it a moment before. A run id stored
with *different* content raises :class:`HistoryConflict` naming the run and both sources, and
nothing of that import is written: silently keeping either copy would make the history lie.

A **cell** is (backend, torch version, accel version), as in :mod:`accel_reports.analysis`. For
the benchmark noise band the accel version is *not* part of the key (comparing accel versions is
the point); see :mod:`accel_reports.benchmarks`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import operator
import math
import os
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import pandas as pd

from .groups import CELL, FAILING
from .loaders import BENCH_COLUMNS, RUN_COLUMNS, TEST_COLUMNS, Loaded, Problem, _benchmark_frame, _frame, tests_frame

__all__ = ["BUSY_TIMEOUT", "POSTGRES_EXTRA", "SCHEMA_VERSION", "History", "HistoryConflict", "HistoryError", "IngestResult",
           "append_results", "is_database_url", "open_history", "shown_location"]

SCHEMA_VERSION = 2
#: seconds a process waits for another one's write transaction (generous: a loaded 2-core CI machine)
BUSY_TIMEOUT = 300.0
#: the extra that installs the PostgreSQL driver
POSTGRES_EXTRA = "accel[postgres]"
_URL_SCHEMES = ("postgresql://", "postgres://")
#: the PostgreSQL advisory lock every write transaction of a history holds (any constant: "accelhst")
_PG_LOCK = 0x616363656C687374

#: (statement, with {real} and {rowkey} filled in per database); column ``row`` is quoted (a PostgreSQL keyword)
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('tests', 'benchmarks')),
    digest TEXT NOT NULL,
    backend TEXT, torch_version TEXT, accel_version TEXT,
    start_time TEXT, quick INTEGER, source TEXT,
    seq INTEGER NOT NULL, imported_at TEXT NOT NULL,
    info TEXT NOT NULL
)""",
    "CREATE UNIQUE INDEX IF NOT EXISTS runs_seq ON runs (seq)",
    """CREATE TABLE IF NOT EXISTS tests (
    {rowkey}run_id TEXT NOT NULL REFERENCES runs(run_id),
    backend TEXT, torch_version TEXT, accel_version TEXT,
    test_id TEXT, outcome TEXT, "row" TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS tests_cell ON tests (backend, torch_version, accel_version, test_id)",
    "CREATE INDEX IF NOT EXISTS tests_run ON tests (run_id)",
    """CREATE TABLE IF NOT EXISTS benchmarks (
    {rowkey}run_id TEXT NOT NULL REFERENCES runs(run_id),
    backend TEXT, torch_version TEXT, accel_version TEXT, device TEXT,
    bench_id TEXT, datetime TEXT, quick INTEGER, value {real},
    "row" TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS bench_cell ON benchmarks (backend, torch_version, bench_id)",
    "CREATE INDEX IF NOT EXISTS bench_run ON benchmarks (run_id)",
)
#: the environment fields a run row carries since schema version 2 (older rows: shown as not stored)
_STORED_SINCE_2 = ("devices",)


class HistoryError(RuntimeError):
    """The history database cannot be used (another schema version, not a history, no driver, ...)."""


class HistoryConflict(HistoryError):
    """A run id already stored with other content; nothing of the import was written."""


@dataclass
class IngestResult:
    """Run ids newly stored (``added``) and already stored with the same content (``already``)."""

    added: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """The one line ``accel report``/``accel qualify`` print after an import."""
        return f"{len(self.added)} run(s) added, {len(self.already)} already stored"


def is_database_url(target: Any) -> bool:
    """True when ``target`` names a PostgreSQL database (``postgresql://`` or ``postgres://``), not a file."""
    return isinstance(target, str) and target.lower().startswith(_URL_SCHEMES)


def shown_location(url: str) -> str:
    """A database URL as printed in messages and reports: its password replaced by ``***``."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rsplit("@", 1)
        return urlunsplit(parts._replace(netloc=netloc[0].split(":", 1)[0] + ":***@" + netloc[1]))
    except ValueError:
        return url.split("://", 1)[0] + "://(unparseable URL)"


# ---------------------------------------------------------------------------- the two databases
class _Database:
    """What differs between SQLite and PostgreSQL: connecting, locking, a few SQL spellings.
    SQL is written with ``?`` placeholders and converted where the driver wants ``%s``."""

    kind = ""
    rowkey = ""  # the column that keeps insertion order of test and benchmark rows
    real = "REAL"
    errors: tuple[type[BaseException], ...] = ()

    def __init__(self, shown: str):
        self.shown = shown

    def sql(self, statement: str) -> str:
        return statement

    def execute(self, statement: str, params: Sequence[Any] = ()) -> Any:
        raise NotImplementedError

    def executemany(self, statement: str, rows: list[Sequence[Any]]) -> None:
        raise NotImplementedError

    def begin_write(self) -> None:
        raise NotImplementedError

    def begin_read(self) -> None:
        self.execute("BEGIN")

    def commit(self) -> None:
        self.execute("COMMIT")

    def rollback(self) -> None:
        self.execute("ROLLBACK")

    def tables(self) -> set[str]:
        raise NotImplementedError

    def version(self) -> int:
        raise NotImplementedError

    def set_version(self, version: int) -> None:
        self.execute("DELETE FROM meta WHERE key = 'schema_version'")
        self.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(version),))

    def close(self) -> None:
        raise NotImplementedError


class _SQLite(_Database):
    kind = "SQLite"
    rowkey = "rowid"
    errors = (sqlite3.Error,)

    def __init__(self, path: Path):
        super().__init__(str(path))
        if path.is_dir():
            raise HistoryError(f"{path} is a folder, not a history database file")
        if not path.exists():
            from .outputs import OutputPathError, writable_folder

            try:
                writable_folder(path.parent, label="the history's folder")
            except OutputPathError as exc:
                raise HistoryError(str(exc)) from None
        try:
            # isolation_level=None: no implicit transactions; every one is begun and ended here
            self._db = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")  # persistent in the file; outside any transaction
        except sqlite3.OperationalError as exc:
            raise HistoryError(f"{path} cannot be opened: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"{path} is not an accel history database ({exc})") from None

    def execute(self, statement: str, params: Sequence[Any] = ()) -> Any:
        return self._db.execute(statement, params)

    def executemany(self, statement: str, rows: list[Sequence[Any]]) -> None:
        self._db.executemany(statement, rows)

    def begin_write(self) -> None:
        self.execute("BEGIN IMMEDIATE")  # the write lock now (waits up to BUSY_TIMEOUT), not at the first write

    def tables(self) -> set[str]:
        return {r[0] for r in self.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def version(self) -> int:
        return int(self.execute("PRAGMA user_version").fetchone()[0])

    def set_version(self, version: int) -> None:
        super().set_version(version)
        self.execute(f"PRAGMA user_version = {int(version)}")

    def close(self) -> None:
        self._db.close()


class _Postgres(_Database):
    kind = "PostgreSQL"
    rowkey = "id"
    real = "DOUBLE PRECISION"

    def __init__(self, url: str):
        super().__init__(shown_location(url))
        try:
            import psycopg
        except ImportError:
            raise HistoryError(f"a PostgreSQL history needs the psycopg driver: pip install '{POSTGRES_EXTRA}'") from None
        self._psycopg = psycopg
        self.errors = (psycopg.Error,)
        try:
            # autocommit: psycopg opens no transaction of its own; BEGIN/COMMIT are sent here
            self._db = psycopg.connect(url, autocommit=True, connect_timeout=int(BUSY_TIMEOUT))
            self.execute(f"SET lock_timeout = {int(BUSY_TIMEOUT * 1000)}")
        except psycopg.Error as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise HistoryError(f"{self.shown}: cannot connect: {text}") from None

    def sql(self, statement: str) -> str:
        return statement.replace("?", "%s")

    def execute(self, statement: str, params: Sequence[Any] = ()) -> Any:
        return self._db.execute(self.sql(statement), tuple(params))

    def executemany(self, statement: str, rows: list[Sequence[Any]]) -> None:
        if rows:
            with self._db.cursor() as cursor:
                cursor.executemany(self.sql(statement), rows)

    def begin_write(self) -> None:
        self.execute("BEGIN")
        self.execute("SELECT pg_advisory_xact_lock(?)", (_PG_LOCK,))  # one writer at a time, until COMMIT

    def begin_read(self) -> None:
        self.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")  # one snapshot for every query

    def tables(self) -> set[str]:
        return {r[0] for r in self.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}

    def version(self) -> int:
        if "meta" not in self.tables():
            return 0
        row = self.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        try:
            return int(row[0]) if row else 0
        except ValueError:
            return 0

    def close(self) -> None:
        self._db.close()


def _connect(target: str | os.PathLike[str]) -> _Database:
    if is_database_url(target):
        return _Postgres(str(target))
    if isinstance(target, str) and "://" in target:
        scheme = target.split("://", 1)[0]
        raise HistoryError(f"{scheme}:// is not a history this accel can use: give an SQLite file path or a "
                           "postgresql:// URL")
    return _SQLite(Path(target))


def _is_operational(exc: BaseException) -> bool:
    """A database failure that is no bug of accel's: locked too long, read-only, disk full, connection lost."""
    if isinstance(exc, sqlite3.OperationalError):
        return True
    return type(exc).__name__ in ("OperationalError", "LockNotAvailable", "QueryCanceled", "ReadOnlySqlTransaction",
                                  "InsufficientPrivilege", "DiskFull", "AdminShutdown") or \
        any(cls.__name__ == "OperationalError" for cls in type(exc).__mro__)


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
    value = (_object(text) or {}).get("signature")
    return value if isinstance(value, str) else None


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


_TEXT_FIELDS = ("run_id", "source", "format", "backend", "torch_version", "accel_version", "torch_build", "host",
                "start_time", "end_time", "nodeid", "test_id", "when", "reason_code", "message", "signature", "traceback",
                "known_issue", "backends", "device_models", "git_commit", "os", "kernel", "python", "devices", "datetime",
                "name", "fullname", "group", "bench_id", "device", "dtype", "metric", "unit", "host_bound", "work_unit")
#: the type each stored field must have (a value of another type is left empty); text unless named here
_TYPES = {**{name: _is_text for name in _TEXT_FIELDS},
          "duration": _is_number, "world_size": _is_int, "tracked_pass": _is_texts, "interrupted": _is_flag,
          "records": _is_int, "upstream": _is_mapping, "driver_versions": _is_mapping, "runtime_versions": _is_mapping,
          "device_count": _is_mapping, "higher_is_better": _is_flag, "value": _is_number, "samples": _is_numbers,
          "n_samples": _is_int, "rounds": _is_int, "time_median": _is_number, "throughput": _is_number,
          "host_ref": _is_number, "quick": _is_flag, "sizes": _is_mapping, "work_size": _is_number,
          "environment": _is_mapping}
#: checks that a value's type alone decides (numbers: a non-finite duration is made 0 by the tests frame)
_PLAIN_TYPES = {_is_text: {str, type(None)}, _is_number: {int, float, type(None)}, _is_int: {int, type(None)}}
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


# ---------------------------------------------------------------------------- the store
class History:
    """A run history in an SQLite file or a PostgreSQL database (created with its schema when
    absent; see the module doc). Use as a context manager, or call :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str]):
        self.url = str(path) if is_database_url(path) else None
        self.path = None if self.url else Path(path)
        self._grouped: tuple[dict[tuple, list[tuple]], dict[tuple, str]] | None = None  # _per_test, until an import
        self._db = _connect(path)
        self.location = self._db.shown
        try:
            self._ensure_schema()
        except BaseException:
            self._db.close()
            raise

    # -- transactions
    @contextlib.contextmanager
    def _transaction(self, write: bool) -> Iterator[None]:
        """One transaction: a write one holds the history's write lock from its first statement."""
        try:
            self._db.begin_write() if write else self._db.begin_read()
        except self._db.errors as exc:
            raise self._failure(exc) from None
        try:
            yield
        except BaseException as exc:
            with contextlib.suppress(*self._db.errors):
                self._db.rollback()
            if isinstance(exc, self._db.errors) and _is_operational(exc):
                raise self._failure(exc) from None
            raise
        try:
            self._db.commit()
        except self._db.errors as exc:
            raise self._failure(exc) from None

    def _failure(self, exc: BaseException) -> HistoryError:
        text = " ".join(str(exc).split()) or type(exc).__name__
        return HistoryError(f"{self.location}: the {self._db.kind} database failed: {text}")

    def _ensure_schema(self) -> None:
        """Check the schema and create (or upgrade) it: read first, and where something must be
        written, check again under the write lock (another process may have done it meanwhile)."""
        try:
            with self._transaction(write=False):
                ready = self._check_schema()
            if ready:
                return
            with self._transaction(write=True):
                if not self._check_schema():
                    self._create_schema()
        except self._db.errors as exc:  # a file that is no SQLite database fails at its first read
            raise HistoryError(f"{self.location} is not an accel history database ({' '.join(str(exc).split())})") from None

    def _check_schema(self) -> bool:
        """True when the schema is there at this version; False when it must be created or upgraded."""
        tables = self._db.tables()
        if not tables:
            return False
        if "runs" not in tables:
            raise HistoryError(f"{self.location} is a{'n' if self._db.kind == 'SQLite' else ''} {self._db.kind} database but "
                               "not an accel history (no runs table)")
        version = self._db.version()
        if version == SCHEMA_VERSION:
            return True
        if version == 1:
            return False
        raise HistoryError(f"{self.location} has history schema version {version}; this accel reads version "
                           f"{SCHEMA_VERSION} (use the accel that wrote it, or start a new history)")

    def _create_schema(self) -> None:
        """Create every table and index (under the write lock); a version-1 history gets its import
        order renumbered uniquely (concurrent imports of older accel versions repeated numbers)."""
        if "runs" in self._db.tables():
            key = self._db.rowkey
            order = [r[0] for r in self._db.execute(f"SELECT {key} FROM runs ORDER BY seq, {key}")]
            self._db.executemany(f"UPDATE runs SET seq = ? WHERE {key} = ?", [(i, k) for i, k in enumerate(order, start=1)])
        for statement in _SCHEMA:
            self._db.execute(statement.format(real=self._db.real, rowkey=self._rowkey_column()))
        self._db.set_version(SCHEMA_VERSION)

    def _rowkey_column(self) -> str:
        return "id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, " if self._db.rowkey == "id" else ""

    # -- lifecycle
    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<History {self.location}>"

    # -- writing
    def ingest(self, loaded: Loaded) -> IngestResult:
        """Append every run of ``loaded`` (test runs and benchmark runs) in one transaction.

        Runs already stored with the same content are skipped (also when another process stored
        them a moment ago); a run id stored with other content raises :class:`HistoryConflict` and
        nothing is written. The check and the inserts hold the history's write lock together.
        """
        entries = list(self._test_runs(loaded)) + list(self._bench_runs(loaded))
        result = IngestResult()
        if not entries:
            return result
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self._transaction(write=True):
            known = self._stored([e["run_id"] for e in entries])
            fresh = []
            for entry in entries:
                stored = known.get(entry["run_id"])
                if stored is None:
                    fresh.append(entry)
                    known[entry["run_id"]] = (entry["digest"], entry["source"])
                elif stored[0] == entry["digest"]:
                    if entry["run_id"] not in result.already:
                        result.already.append(entry["run_id"])
                else:
                    raise HistoryConflict(
                        f"run {entry['run_id']!r} is already in {self.location} (imported from {stored[1]}) with other "
                        f"content than the one from {entry['source']}; nothing was imported (a run id must name one run: "
                        "remove one copy, or use another history)")
            for entry in fresh:
                self._insert(entry, now)
                result.added.append(entry["run_id"])
        if result.added:
            self._grouped = None
        return result

    def _stored(self, run_ids: list[str]) -> dict[str, tuple[str, str]]:
        """run id -> (digest, source) of those of ``run_ids`` already stored."""
        found: dict[str, tuple[str, str]] = {}
        unique = list(dict.fromkeys(run_ids))
        for start in range(0, len(unique), 500):
            chunk = unique[start:start + 500]
            for run_id, digest, source in self._db.execute(
                    f"SELECT run_id, digest, source FROM runs WHERE run_id IN ({','.join('?' * len(chunk))})", chunk):
                found[run_id] = (digest, source)
        return found

    def _insert(self, entry: dict[str, Any], now: str) -> None:
        # the import order from the database itself, inside the write lock: unique (and a UNIQUE index says so)
        self._db.execute(
            "INSERT INTO runs (run_id, kind, digest, backend, torch_version, accel_version, start_time, quick, "
            "source, seq, imported_at, info) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
            "(SELECT COALESCE(MAX(seq), 0) + 1 FROM runs), ?, ?)",
            (entry["run_id"], entry["kind"], entry["digest"], entry["backend"], entry["torch_version"],
             entry["accel_version"], entry["start_time"], entry["quick"], entry["source"], now, _dumps(entry["info"])))
        if entry["kind"] == "tests":
            self._db.executemany(
                "INSERT INTO tests (run_id, backend, torch_version, accel_version, test_id, outcome, \"row\") "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(entry["run_id"], _text(r.get("backend")), _text(r.get("torch_version")), _text(r.get("accel_version")),
                  _text(r.get("test_id")), _text(r.get("outcome")), _dumps(r)) for r in entry["rows"]])
        else:
            self._db.executemany(
                "INSERT INTO benchmarks (run_id, backend, torch_version, accel_version, device, bench_id, datetime, "
                "quick, value, \"row\") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(entry["run_id"], _text(r.get("backend")), _text(r.get("torch_version")), _text(r.get("accel_version")),
                  _text(r.get("device")), _text(r.get("bench_id")), _text(r.get("datetime")),
                  int(bool(_plain(r.get("quick")))), _plain(r.get("value")), _dumps(r)) for r in entry["rows"]])

    @staticmethod
    def _test_runs(loaded: Loaded) -> Iterable[dict[str, Any]]:
        tests = loaded.tests
        by_run = {run_id: _records(group) for run_id, group in tests.groupby("run_id", sort=False)} if not tests.empty else {}
        for run in _records(loaded.runs):
            rows = by_run.get(run["run_id"], [])
            content = sorted((str(r.get("nodeid")), str(r.get("outcome")), str(r.get("when")), _text(r.get("world_size")),
                              _text(r.get("signature")), _text(r.get("known_issue"))) for r in rows)
            header = {k: run.get(k) for k in ("run_id", "format", "backends", "torch_version", "accel_version", "host",
                                              "start_time", "interrupted", "git_commit")}
            first = rows[0] if rows else {}
            yield {
                "run_id": str(run["run_id"]), "kind": "tests", "digest": _digest([header, content]),
                "backend": _text(first.get("backend")) or _text((run.get("backends") or "").split(", ")[0] or None),
                "torch_version": _text(first.get("torch_version")) or _text(run.get("torch_version")),
                "accel_version": _text(first.get("accel_version")) or _text(run.get("accel_version")),
                "start_time": _text(run.get("start_time")), "quick": None, "source": _text(run.get("source")),
                "info": run, "rows": rows,
            }

    @staticmethod
    def _bench_runs(loaded: Loaded) -> Iterable[dict[str, Any]]:
        frame = loaded.benchmarks
        if frame.empty:
            return
        for run_id, group in frame.groupby("run_id", sort=False):
            rows = _records(group)
            content = sorted((str(r.get("fullname")), str(r.get("backend")), _plain(r.get("samples")), _plain(r.get("quick")))
                             for r in rows)
            first = rows[0]
            yield {
                "run_id": str(run_id), "kind": "benchmarks", "digest": _digest([_text(first.get("datetime")), content]),
                "backend": _text(first.get("backend")), "torch_version": _text(first.get("torch_version")),
                "accel_version": _text(first.get("accel_version")), "start_time": _text(first.get("datetime")),
                "quick": int(any(bool(_plain(r.get("quick"))) for r in rows)), "source": _text(first.get("source")),
                "info": {"run_id": str(run_id), "source": _text(first.get("source")), "datetime": _text(first.get("datetime")),
                         "benchmarks": len(rows)},
                "rows": rows,
            }

    # -- reading
    def run_ids(self) -> list[str]:
        """Every stored run id, in import order."""
        with self._transaction(write=False):
            return [r[0] for r in self._db.execute("SELECT run_id FROM runs ORDER BY seq")]

    def _runs(self, kind: str, last: int | None, problems: list[Problem] | None = None) -> list[tuple[str, dict[str, Any]]]:
        rows = self._db.execute(
            "SELECT run_id, backend, torch_version, accel_version, start_time, seq, info FROM runs WHERE kind = ? "
            "ORDER BY COALESCE(start_time, ''), seq", (kind,)).fetchall()
        if last is not None:
            if last < 1:
                raise ValueError(f"last must be at least 1, got {last}")
            per_cell: dict[tuple, list] = {}
            for row in rows:
                per_cell.setdefault(tuple(row[1:4]), []).append(row)
            keep = {r[0] for runs in per_cell.values() for r in runs[-last:]}
            rows = [r for r in rows if r[0] in keep]
        out = []
        for row in rows:
            info = _object(row[6])
            if info is None:
                self._note(problems, f"run {row[0]!r}: its stored run row is not a JSON object; the run is left out")
                continue
            info["run_id"] = str(row[0])
            out.append((str(row[0]), info))
        return out

    def _note(self, problems: list[Problem] | None, message: str) -> None:
        if problems is not None:
            problems.append(Problem(self.location, 0, message, "note"))

    def _rows(self, table: str, run_ids: list[str], problems: list[Problem] | None = None) -> list[dict[str, Any]]:
        if not run_ids:
            return []
        order = {run_id: i for i, run_id in enumerate(run_ids)}
        found: list[tuple[int, int, str]] = []
        for start in range(0, len(run_ids), 500):  # SQLite limits the number of parameters
            chunk = run_ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for rowid, run_id, text in self._db.execute(
                    f"SELECT {self._db.rowkey}, run_id, \"row\" FROM {table} WHERE run_id IN ({marks})", chunk):
                found.append((order[run_id], rowid, text))
        found.sort(key=lambda item: (item[0], item[1]))
        try:  # one parse of one array instead of one call per row (faster on large histories)
            rows = json.loads("[" + ",".join(text for _, _, text in found) + "]")
            if all(type(row) is dict for row in rows):
                return rows
        except (ValueError, TypeError, RecursionError):
            pass
        kept = []  # a history is input: a row edited into something else is left out, with a note
        for _, _, text in found:
            row = _object(text)
            if row is None:
                continue
            kept.append(row)
        if len(kept) < len(found):
            self._note(problems, f"{len(found) - len(kept)} stored {table} row(s) are not JSON objects; left out")
        return kept

    def load(self, *, last: int | None = None) -> Loaded:
        """The stored runs as :func:`accel_reports.loaders.load_results` frames (every run, or the
        ``last`` N runs of each cell, by start time), so a report can be rendered from the store.
        Read in one transaction (a consistent snapshot); no file a row names is opened."""
        problems: list[Problem] = []
        with self._transaction(write=False):
            test_runs = self._runs("tests", last, problems)
            bench_runs = self._runs("benchmarks", last, problems)
            test_rows = self._rows("tests", [r for r, _ in test_runs], problems)
            bench_rows = self._rows("benchmarks", [r for r, _ in bench_runs], problems)
        try:  # rows stored from a tests frame carry every column: one C-level lookup per row
            pick = operator.itemgetter(*TEST_COLUMNS)
            columns: dict[str, list[Any]] = dict(zip(TEST_COLUMNS, map(list, zip(*map(pick, test_rows))))) \
                if test_rows else {c: [] for c in TEST_COLUMNS}
        except KeyError:  # a row from an older accel lacks a column
            columns = {c: [row.get(c) for row in test_rows] for c in TEST_COLUMNS}
        columns["tracked_pass"] = [tuple(v) if isinstance(v, list) else v for v in columns["tracked_pass"]]
        run_rows = [info for _, info in test_runs]
        emptied, dropped = _clean_tests(columns)
        emptied += _clean_rows(run_rows, _RUN_TYPES)
        bench_emptied, bench_dropped = _clean_benchmarks(bench_rows)
        if emptied or bench_emptied:
            self._note(problems, f"{emptied + bench_emptied} stored value(s) of a wrong type were left empty (an edited history?)")
        if dropped or bench_dropped:
            self._note(problems, f"{dropped} stored test record(s) without a valid outcome and {bench_dropped} benchmark row(s) "
                                 "without a name or a finite value were left out (an edited history?)")
        older = sum(1 for info in run_rows if any(k not in info for k in _STORED_SINCE_2))
        if older:
            self._note(problems, f"{older} run(s) were stored by an older accel without their device details; the report "
                                 "shows what the history holds (the files a history row names are never read)")
        return Loaded(tests=tests_frame(columns), runs=_frame(run_rows, RUN_COLUMNS),
                      benchmarks=self._bench_frame(bench_rows), problems=problems, files=[self.location])

    @staticmethod
    def _bench_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
        for row in rows:
            if isinstance(row.get("samples"), list):
                row["samples"] = tuple(row["samples"])
            row["quick"] = bool(row.get("quick"))
        return _benchmark_frame(rows)

    def benchmarks_frame(self) -> pd.DataFrame:
        """Every stored benchmark row of every run (columns of :data:`~accel_reports.loaders.BENCH_COLUMNS`,
        raw ``samples`` included), oldest run first: the ``history`` of
        :func:`accel_reports.benchmarks.compare_benchmarks`."""
        with self._transaction(write=False):
            rows = self._rows("benchmarks", [r for r, _ in self._runs("benchmarks", None)])
        _clean_benchmarks(rows)
        return self._bench_frame(rows)

    # -- analyses
    def _per_test(self) -> tuple[dict[tuple, list[list]], dict[tuple, str]]:
        """(cell..., test id) -> one entry per run it ran in, oldest first: ``[run_id, start_time,
        failing, passing, mixed, signature]`` (failing when any record of the run failed, passing
        when one passed, mixed for both, the last failing record's signature); and cell -> its latest
        run with test records. Grouped in plain Python over the database's ordered rows (cheaper than
        a pandas group-by on large histories); kept until the next import."""
        if self._grouped is not None:
            return self._grouped
        failing_outcomes = frozenset(FAILING)
        grouped: dict[tuple, list[list]] = {}
        latest: dict[tuple, str] = {}
        with self._transaction(write=False):
            rows = self._db.execute(
                "SELECT t.backend, t.torch_version, t.accel_version, t.test_id, t.run_id, t.outcome, COALESCE(r.start_time, ''), "
                # the record only where a test failed (for its signature): parsing every record is most of the cost
                f"CASE WHEN t.outcome IN ({', '.join(repr(o) for o in FAILING)}) THEN t.\"row\" END "
                f"FROM tests t JOIN runs r ON r.run_id = t.run_id ORDER BY COALESCE(r.start_time, ''), r.seq, t.{self._db.rowkey}"
            ).fetchall()
        for backend, torch_version, accel_version, test_id, run_id, outcome, start, record in rows:
            signature = _signature(record) if record is not None else None
            cell = (backend, torch_version, accel_version)
            latest[cell] = run_id  # oldest first: the last run seen in a cell is its latest
            runs = grouped.setdefault((*cell, test_id), [])
            failed, passed = outcome in failing_outcomes, outcome in ("passed", "xpassed")
            if runs and runs[-1][0] == run_id:  # another record of the same test in the same run
                entry = runs[-1]
                entry[2], entry[3] = entry[2] or failed, entry[3] or passed
                entry[4] = entry[2] and entry[3]
                entry[5] = signature if failed else entry[5]
            else:
                runs.append([run_id, start, failed, passed, failed and passed, signature if failed else None])
        self._grouped = (grouped, latest)
        return self._grouped

    def flakiness(self) -> pd.DataFrame:
        """Per test id and cell across the stored runs: ``runs`` (runs the test ran in), ``passes``,
        ``failures``, ``flips`` (changes between passing and failing from one run to the next, runs
        where it neither passed nor failed left out) and ``flaky``: two or more flips, or passing
        and failing records within one run. A single flip is a change (it broke, or it was fixed),
        not flakiness. Sorted flakiest first."""
        columns = CELL + ["test_id", "runs", "passes", "failures", "flips", "flaky", "last_outcome"]
        out = []
        for key, runs in sorted(self._per_test()[0].items(), key=lambda kv: tuple(map(str, kv[0]))):
            decided = ["fail" if failing else "pass" for _, _, failing, passing, _, _ in runs if failing or passing]
            flips = sum(a != b for a, b in zip(decided, decided[1:]))
            out.append(dict(zip(CELL + ["test_id"], key), runs=len(runs),
                            passes=sum(1 for r in runs if r[3] and not r[2]), failures=sum(1 for r in runs if r[2]),
                            flips=flips, flaky=flips >= 2 or any(r[4] for r in runs),
                            last_outcome=decided[-1] if decided else "other"))
        frame = pd.DataFrame(out, columns=columns)
        return frame.sort_values(["flaky", "flips", "failures", "test_id"], ascending=[False, False, False, True],
                                 kind="mergesort").reset_index(drop=True)

    def first_failed(self) -> pd.DataFrame:
        """For every test failing in the latest run of its cell: where its current failing streak
        began (``first_failed_run``/``first_failed_time``), how many runs it has failed in a row
        (``streak``) and the last run it passed in (``last_passed_run``, None if never). Runs where
        the test was absent or skipped do not break the streak."""
        columns = CELL + ["test_id", "latest_run", "first_failed_run", "first_failed_time", "streak", "last_passed_run",
                          "signature"]
        per_test, latest_run = self._per_test()
        out = []
        for key, runs in sorted(per_test.items(), key=lambda kv: tuple(map(str, kv[0]))):
            last = runs[-1]
            if last[0] != latest_run.get(tuple(key[:3])) or not last[2]:
                continue
            first, streak, passed = last, 0, None
            for run in reversed(runs):
                if run[2]:
                    first, streak = run, streak + 1
                elif run[3]:
                    passed = run[0]
                    break
            out.append(dict(zip(CELL + ["test_id"], key), latest_run=last[0], first_failed_run=first[0],
                            first_failed_time=first[1] or None, streak=streak, last_passed_run=passed,
                            signature=last[5]))
        frame = pd.DataFrame(out, columns=columns)
        for column in ("last_passed_run", "first_failed_time", "signature"):  # None stays None, not NaN
            frame[column] = pd.Series([row[column] for row in out], dtype=object)
        return frame

    def trends(self, *, window: int | None = None, threshold: float | None = None) -> pd.DataFrame:
        """Per benchmark and cell, one row per run, oldest first: ``median``, the noise band the run
        was judged against (from the earlier runs of the same kind, see
        :mod:`accel_reports.benchmarks`), ``history_runs``, ``status`` of the run against it
        (``unchanged``, ``suspect``, ``too noisy``, ``regression``, ``improvement``, ``no reference``),
        ``host_relative`` (judged relative to the host probe) and ``quick``. Quick and full runs are
        separate series."""
        from . import benchmarks as bench

        window = bench.DEFAULT_WINDOW if window is None else window
        threshold = bench.DEFAULT_THRESHOLD if threshold is None else threshold
        columns = ["backend", "torch_version", "device", "bench_id", "name", "quick", "run_id", "datetime",
                   "accel_version", "median", "n_samples", "spread", "band_low", "band_high", "history_runs",
                   "host_relative", "status"]
        frame = self.benchmarks_frame()
        if frame.empty:
            return pd.DataFrame(columns=columns)
        frame = frame.assign(_device=frame["device"].fillna(""), _when=frame["datetime"].fillna("").astype(str))
        out = []
        for _, series in frame.groupby(["backend", "torch_version", "_device", "bench_id", "quick"], sort=True):
            series = series.sort_values("_when", kind="mergesort").drop_duplicates("run_id", keep="last")
            rows = _records(series)
            for i, row in enumerate(rows):
                result = bench.judge_series(rows[:i + 1], threshold=threshold, window=window)
                band = result["band"]
                out.append({"backend": row["backend"], "torch_version": row["torch_version"], "device": row["device"],
                            "bench_id": row["bench_id"], "name": row["name"], "quick": bool(row["quick"]),
                            "run_id": row["run_id"], "datetime": row["datetime"], "accel_version": row["accel_version"],
                            "median": float(row["value"]), "n_samples": row["n_samples"], "spread": result["spread"],
                            "band_low": result["band_low"], "band_high": result["band_high"],
                            "history_runs": band.runs if band else 0, "host_relative": result["host"],
                            "status": result["status"]})
        return pd.DataFrame(out, columns=columns)


def open_history(path: str | os.PathLike[str]) -> History:
    """Open (or create) the history at ``path``: an SQLite file, or a ``postgresql://`` URL. Raises
    :class:`HistoryError` with the reason when it is not one this accel can use."""
    return History(path)


def append_results(db: str | os.PathLike[str], paths: Iterable[str | os.PathLike[str]]) -> IngestResult:
    """Load the result files under ``paths`` (those that exist) and append their runs to the history
    ``db`` (a file or a ``postgresql://`` URL; ``accel qualify --history``). Raises :class:`HistoryError`
    when the history cannot take them."""
    from .loaders import load_results

    existing = [p for p in paths if Path(p).exists()]
    loaded = load_results(existing) if existing else None
    with open_history(db) as history:
        return history.ingest(loaded) if loaded is not None else IngestResult()
