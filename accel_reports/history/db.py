"""The two databases a run history lives in (part of :mod:`accel_reports.history.store`): an SQLite file
or a PostgreSQL database, behind one small interface (connecting, locking, a few SQL spellings), with
the schema, the errors and the helpers that recognise and print a database URL."""

from __future__ import annotations

import math
import os
import sqlite3
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

SCHEMA_VERSION = 2
#: seconds a process waits for another one's write transaction (generous: a loaded 2-core CI machine)
BUSY_TIMEOUT = 300.0
#: seconds a PostgreSQL history's server may take to answer a new connection, per address tried
#: (libpq's minimum is 2); a URL's own ``connect_timeout`` wins, then :data:`CONNECT_TIMEOUT_ENV`
CONNECT_TIMEOUT = 10
#: the environment variable that sets :data:`CONNECT_TIMEOUT` for every command that opens a history
CONNECT_TIMEOUT_ENV = "ACCEL_HISTORY_CONNECT_TIMEOUT"
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

    def __init__(self, path: Path, read_only: bool = False):
        super().__init__(str(path))
        self._path, self._tidy = path, False
        if path.is_dir():
            raise HistoryError(f"{path} is a folder, not a history database file")
        if read_only:
            self._db = self._open_read_only(path)
            return
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

    def _open_read_only(self, path: Path) -> sqlite3.Connection:
        """A connection that cannot write (``mode=ro``): a read needs no write permission and never
        changes the file. Where SQLite cannot make its WAL index beside the file (a read-only
        folder) and no write-ahead log is there (so no writer is active), the file is read as
        immutable. WAL index files this read had to make are removed again on close."""
        if not path.exists():
            raise HistoryError(f"{path}: no such history (a history is created by an import: give RESULTS, or "
                               "accel qualify --history; a read never creates one)")
        wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
        fresh = not wal.exists() and not shm.exists()
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
        try:
            db = self._probe(sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT, isolation_level=None))
        except sqlite3.OperationalError as exc:
            if not _cannot_make_files(exc):
                raise HistoryError(f"{path} cannot be read: {exc}") from None
            if wal.is_file() and wal.stat().st_size:
                raise HistoryError(f"{path} cannot be read: {exc} (its write-ahead log holds changes that cannot be "
                                   "read without write access to its folder)") from None
            try:
                db = self._probe(sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None))
            except sqlite3.OperationalError as again:
                raise HistoryError(f"{path} cannot be read: {again}") from None
            fresh = False
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"{path} is not an accel history database ({exc})") from None
        # SQLite leaves the WAL index of a read-only connection behind; tidied on close where this read made it
        self._tidy = fresh and (wal.exists() or shm.exists()) and os.access(path, os.W_OK) and \
            os.access(path.parent, os.W_OK)
        return db

    @staticmethod
    def _probe(db: sqlite3.Connection) -> sqlite3.Connection:
        """``db`` after a first read (SQLite opens the file lazily: a failure shows here, not at connect)."""
        try:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        except BaseException:
            db.close()
            raise
        return db

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
        if self._tidy:  # a plain connection that closes last removes the WAL index, under SQLite's own locks
            self._tidy = False
            try:
                tidy = sqlite3.connect(str(self._path), timeout=0, isolation_level=None)
                try:
                    tidy.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
                finally:
                    tidy.close()
            except sqlite3.Error:
                pass  # another process has the history open: it removes them when it closes


class _Postgres(_Database):
    kind = "PostgreSQL"
    rowkey = "id"
    real = "DOUBLE PRECISION"

    def __init__(self, url: str, read_only: bool = False):
        super().__init__(shown_location(url))
        try:
            import psycopg
        except ImportError:
            raise HistoryError(f"a PostgreSQL history needs the psycopg driver: pip install '{POSTGRES_EXTRA}'") from None
        self._psycopg = psycopg
        self.errors = (psycopg.Error,)
        from psycopg.conninfo import conninfo_to_dict

        try:
            params = conninfo_to_dict(url)
        except psycopg.Error:  # its text may quote the URL, password included
            raise HistoryError(f"{self.shown}: not a PostgreSQL URL that libpq accepts") from None
        extra: dict[str, Any] = {}
        if params.get("connect_timeout") in (None, ""):  # the URL's own setting wins
            extra["connect_timeout"] = math.ceil(connect_timeout())  # libpq takes whole seconds
        seconds = _effective_timeout(params.get("connect_timeout", extra.get("connect_timeout")))
        within = f"within {seconds} s" if seconds else "in time"
        try:
            # autocommit: psycopg opens no transaction of its own; BEGIN/COMMIT are sent here
            self._db = psycopg.connect(url, autocommit=True, **extra)
        except getattr(psycopg.errors, "ConnectionTimeout", ()):  # psycopg 3.2 and later
            raise HistoryError(
                f"{self.shown}: cannot connect: PostgreSQL at {_server(params)} did not answer {within} (set "
                f"connect_timeout in the URL or {CONNECT_TIMEOUT_ENV} for a slower server)") from None
        except psycopg.Error as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise HistoryError(f"{self.shown}: cannot connect to PostgreSQL at {_server(params)}: {text}") from None
        try:
            self.execute(f"SET lock_timeout = {int(BUSY_TIMEOUT * 1000)}")
            if read_only:
                self.execute("SET default_transaction_read_only = on")
        except psycopg.Error as exc:
            self._db.close()
            raise HistoryError(f"{self.shown}: the PostgreSQL database failed: {' '.join(str(exc).split())}") from None

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


def _connect(target: str | os.PathLike[str], read_only: bool = False) -> _Database:
    if is_database_url(target):
        return _Postgres(str(target), read_only)
    if isinstance(target, str) and "://" in target:
        scheme = target.split("://", 1)[0]
        raise HistoryError(f"{scheme}:// is not a history this accel can use: give an SQLite file path or a "
                           "postgresql:// URL")
    return _SQLite(Path(target), read_only)


def connect_timeout() -> float:
    """The PostgreSQL connection timeout in seconds: :data:`CONNECT_TIMEOUT_ENV` when set, else
    :data:`CONNECT_TIMEOUT`, so a server that never answers costs seconds, not minutes. Raises
    :class:`HistoryError` for a value that is not a positive number."""
    text = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    if not text:
        return CONNECT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise HistoryError(f"{CONNECT_TIMEOUT_ENV}={text!r}: expected a number of seconds above 0")
    return value


def _effective_timeout(value: Any) -> int | None:
    """The seconds libpq (and psycopg) wait for a given ``connect_timeout`` (whole seconds, at least
    2); None where that is the driver's own default (0, or a value it does not read as a number)."""
    try:
        seconds = int(float(value))
    except (TypeError, ValueError):
        return None
    return max(seconds, 2) if seconds > 0 else None


def _server(params: dict[str, Any]) -> str:
    """Where a connection goes, for messages: ``host:port`` (a socket folder for a path host)."""
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    return f"{host}:{port}"


def _cannot_make_files(exc: sqlite3.Error) -> bool:
    """An SQLite failure to open or write a file (a read-only folder refusing the WAL index), not a
    lock or a damaged file."""
    name = getattr(exc, "sqlite_errorname", "")
    if name:
        return name.startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY"))
    return any(text in str(exc) for text in ("unable to open", "readonly"))


def _is_operational(exc: BaseException) -> bool:
    """A database failure that is no bug of accel's: locked too long, read-only, disk full, connection lost."""
    if isinstance(exc, sqlite3.OperationalError):
        return True
    return type(exc).__name__ in ("OperationalError", "LockNotAvailable", "QueryCanceled", "ReadOnlySqlTransaction",
                                  "InsufficientPrivilege", "DiskFull", "AdminShutdown") or \
        any(cls.__name__ == "OperationalError" for cls in type(exc).__mro__)
