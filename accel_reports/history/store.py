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

A command that only reads (``accel report --history DB`` without results) opens the history
``read_only``: an SQLite file ``mode=ro`` (no write permission needed, nothing written), a history
that does not exist is an error and is not created. A PostgreSQL server that does not answer fails
after :data:`~accel_reports.history.db.CONNECT_TIMEOUT` seconds (``ACCEL_HISTORY_CONNECT_TIMEOUT``,
or the URL's ``connect_timeout``). A test record's message, traceback and signature are stored (and
read back) truncated to the harness's limits (:data:`~accel_reports.history.rows.TEXT_LIMITS`).

The history holds everything a report shows: rendering from it reads no other file. It is input,
not trusted state (a CI cache restores it): nothing a row names is opened, and every stored value
is checked for its type when read (a wrong one is left empty, a record without a valid outcome left
out, each with a note in the report). A history written by schema
version 1 is upgraded in place when opened (its import order renumbered uniquely).

Importing is idempotent: a run whose id is already stored with the same digest is skipped
(``IngestResult.already``), also when another process stored it a moment before. A run id stored
with *different* content raises :class:`HistoryConflict` naming the run and both sources, and
nothing of that import is written: silently keeping either copy would make the history lie.

A **cell** is (backend, torch version, accel version), as in :mod:`accel_reports.analyse.analysis`. For
the benchmark noise band the accel version is *not* part of the key (comparing accel versions is
the point); see :mod:`accel_reports.analyse.benchmarks`.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

import pandas as pd

from ..analyse.groups import CELL, FAILING
from .db import (BUSY_TIMEOUT, POSTGRES_EXTRA, SCHEMA_VERSION, _SCHEMA, _STORED_SINCE_2, HistoryConflict,
                 HistoryError, IngestResult, _connect, _is_operational, is_database_url, shown_location)
from .rows import (_RUN_TYPES, _clean_benchmarks, _clean_rows, _clean_tests, _clip_texts, _digest, _dumps,
                   _failure_facts, _object, _plain, _records, _text, _truncated)
from ..load.loaders import RUN_COLUMNS, TEST_COLUMNS, Loaded, Problem, _benchmark_frame, _frame, tests_frame
from ..load.model_records import MODEL_TEST
from .model_trends import model_regressions

#: the model suite's module (its records' test ids start with it)
MODEL_SUITE = MODEL_TEST.split("::")[0]

__all__ = ["BUSY_TIMEOUT", "POSTGRES_EXTRA", "SCHEMA_VERSION", "History", "HistoryConflict", "HistoryError", "IngestResult",
           "append_results", "is_database_url", "open_history", "shown_location"]


# ---------------------------------------------------------------------------- the store
class History:
    """A run history in an SQLite file or a PostgreSQL database (created with its schema when
    absent; see the module doc). Use as a context manager, or call :meth:`close`.

    ``read_only``: for a command that only reads (``accel report --history DB`` without results):
    nothing is created or written (an SQLite file is opened ``mode=ro``, so no write permission is
    needed; a PostgreSQL session is read-only), and a history that is not there is an error."""

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False):
        self.url = str(path) if is_database_url(path) else None
        self.path = None if self.url else Path(path)
        self.read_only = read_only
        self._grouped: tuple[dict[tuple, list[tuple]], dict[tuple, str]] | None = None  # _per_test, until an import
        self._db = _connect(path, read_only)
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
                if not ready and self.read_only:
                    self._check_readable()
            if ready or self.read_only:
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

    def _check_readable(self) -> None:
        """Read-only, where an import would create or upgrade the schema: an empty database is an
        error (nothing to render); a version-1 history is read as it is (its tables are the same)."""
        if not self._db.tables():
            raise HistoryError(f"{self.location} holds no accel history yet (a history is created by an import: give "
                               "RESULTS, or accel qualify --history; a read never creates one)")

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
        if self.read_only:
            raise HistoryError(f"{self.location} was opened read-only: nothing can be imported into it")
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
                "info": run, "rows": [_truncated(r) for r in rows],  # after the digest: it stays what it was
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
        """The stored runs as :func:`accel_reports.load.loaders.load_results` frames (every run, or the
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
        clipped = _clip_texts(columns)
        if clipped:
            self._note(problems, f"{clipped} stored message(s), traceback(s) or signature(s) longer than the limits were "
                                 "truncated (an edited or older history?)")
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
        """Every stored benchmark row of every run (columns of :data:`~accel_reports.load.loaders.BENCH_COLUMNS`,
        raw ``samples`` included), oldest run first: the ``history`` of
        :func:`accel_reports.analyse.benchmarks.compare_benchmarks`."""
        with self._transaction(write=False):
            rows = self._rows("benchmarks", [r for r, _ in self._runs("benchmarks", None)])
        _clean_benchmarks(rows)
        return self._bench_frame(rows)

    def model_records(self) -> pd.DataFrame:
        """Every stored record of the model suite (a tests frame, oldest run first, each value checked as
        :meth:`load` does): what :func:`accel_reports.history.model_trends.model_regressions` sets a run against."""
        with self._transaction(write=False):
            texts = self._db.execute(
                "SELECT t.\"row\" FROM tests t JOIN runs r ON r.run_id = t.run_id WHERE t.test_id LIKE ? "
                f"ORDER BY COALESCE(r.start_time, ''), r.seq, t.{self._db.rowkey}", (MODEL_SUITE + "::%",)).fetchall()
        rows = [row for row in (_object(text) for (text,) in texts) if row is not None]
        columns = {c: [row.get(c) for row in rows] for c in TEST_COLUMNS}
        columns["tracked_pass"] = [tuple(v) if isinstance(v, list) else v for v in columns["tracked_pass"]]
        _clean_tests(columns)
        return tests_frame(columns)

    def model_regressions(self, current: pd.DataFrame) -> pd.DataFrame:
        """The model suite records of ``current`` (a tests frame) that regressed against their latest earlier
        stored record (:func:`accel_reports.history.model_trends.model_regressions`: fails now, target not
        reached, steps to target or final accuracy past the mode's gate), with both runs' loss curves."""
        return model_regressions(current, self.model_records())

    # -- analyses
    def _per_test(self) -> tuple[dict[tuple, list[list]], dict[tuple, str]]:
        """(cell..., test id) -> one entry per run it ran in, oldest first: ``[run_id, start_time,
        failing, passing, mixed, signature, flake_rate]`` (failing when any record of the run failed,
        passing when one passed, mixed for both, the last failing record's signature and the flake
        rate its ``--flake-runs`` re-runs measured, else None); and cell -> its latest
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
            signature, rate = _failure_facts(record) if record is not None else (None, None)
            cell = (backend, torch_version, accel_version)
            latest[cell] = run_id  # oldest first: the last run seen in a cell is its latest
            runs = grouped.setdefault((*cell, test_id), [])
            failed, passed = outcome in failing_outcomes, outcome in ("passed", "xpassed")
            if runs and runs[-1][0] == run_id:  # another record of the same test in the same run
                entry = runs[-1]
                entry[2], entry[3] = entry[2] or failed, entry[3] or passed
                entry[4] = entry[2] and entry[3]
                entry[5] = signature if failed else entry[5]
                entry[6] = rate if failed and rate is not None else entry[6]
            else:
                runs.append([run_id, start, failed, passed, failed and passed, signature if failed else None,
                             rate if failed else None])
        self._grouped = (grouped, latest)
        return self._grouped

    def flakiness(self) -> pd.DataFrame:
        """Per test id and cell across the stored runs: ``runs`` (runs the test ran in), ``passes``,
        ``failures``, ``flips`` (changes between passing and failing from one run to the next, runs
        where it neither passed nor failed left out), ``flake_rate`` and ``measured`` (the mean of
        the flake rates that ``--flake-runs`` re-runs recorded for its failures, over the ``measured``
        runs that recorded one; None when none did) and ``flaky``: two or more flips, passing and
        failing records within one run, or a measured flake rate below 1. A single flip is a change
        (it broke, or it was fixed), not flakiness. Sorted flakiest first."""
        columns = CELL + ["test_id", "runs", "passes", "failures", "flips", "flake_rate", "measured", "flaky", "last_outcome"]
        out = []
        for key, runs in sorted(self._per_test()[0].items(), key=lambda kv: tuple(map(str, kv[0]))):
            decided = ["fail" if r[2] else "pass" for r in runs if r[2] or r[3]]
            flips = sum(a != b for a, b in zip(decided, decided[1:]))
            rates = [r[6] for r in runs if r[6] is not None]
            rate = round(sum(rates) / len(rates), 4) if rates else None
            out.append(dict(zip(CELL + ["test_id"], key), runs=len(runs),
                            passes=sum(1 for r in runs if r[3] and not r[2]), failures=sum(1 for r in runs if r[2]),
                            flips=flips, flake_rate=rate, measured=len(rates),
                            flaky=flips >= 2 or any(r[4] for r in runs) or any(x < 1 for x in rates),
                            last_outcome=decided[-1] if decided else "other"))
        frame = pd.DataFrame(out, columns=columns)
        frame["flake_rate"] = pd.Series([row["flake_rate"] for row in out], dtype=object)  # None stays None
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
        :mod:`accel_reports.analyse.benchmarks`), ``history_runs``, ``status`` of the run against it
        (``unchanged``, ``suspect``, ``too noisy``, ``regression``, ``improvement``, ``no reference``),
        ``host_relative`` (judged relative to the host probe) and ``quick``. Quick and full runs are
        separate series."""
        from ..analyse import benchmarks as bench

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


def open_history(path: str | os.PathLike[str], *, read_only: bool = False) -> History:
    """Open (or create) the history at ``path``: an SQLite file, or a ``postgresql://`` URL. Raises
    :class:`HistoryError` with the reason when it is not one this accel can use. ``read_only``: a
    command that only renders; the history must exist and nothing is written (see :class:`History`)."""
    return History(path, read_only=read_only)


def append_results(db: str | os.PathLike[str], paths: Iterable[str | os.PathLike[str]]) -> IngestResult:
    """Load the result files under ``paths`` (those that exist) and append their runs to the history
    ``db`` (a file or a ``postgresql://`` URL; ``accel qualify --history``). Raises :class:`HistoryError`
    when the history cannot take them."""
    from ..load.loaders import load_results

    existing = [p for p in paths if Path(p).exists()]
    loaded = load_results(existing) if existing else None
    with open_history(db) as history:
        return history.ingest(loaded) if loaded is not None else IngestResult()
