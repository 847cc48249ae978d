"""Run history in an embedded database: every run's test records and benchmark samples, appended.

Why SQLite (the standard library's :mod:`sqlite3`) and not DuckDB: no new dependency (the store is
written by ``accel qualify`` and ``ci.collect`` on machines where only accel is installed), one
file that CI can keep as an artifact or cache, and atomic transactions: a run is imported in one
transaction, so an import killed half-way leaves no half run behind (WAL journal, so a report can
read while another process appends). The analyses are small group-bys done in pandas after one
indexed query; DuckDB's column engine would only pay off at millions of rows.

Layout (schema version :data:`SCHEMA_VERSION`, recorded in ``meta`` and ``PRAGMA user_version``):

* ``runs``: one row per run: ``run_id`` (primary key), ``kind`` (``tests`` or ``benchmarks``),
  ``digest`` (SHA-256 of the run's content, without file paths), the cell (backend, torch
  version, accel version), ``start_time``, ``quick``, ``source``, ``seq`` (import order) and the
  loader's run row as JSON;
* ``tests``: one row per test record (its loader row as JSON, with the cell, test id and outcome
  as columns), indexed by (cell, test id);
* ``benchmarks``: one row per benchmark per run (its loader row as JSON, raw samples included),
  indexed by (backend, torch version, bench id).

Importing is idempotent: a run whose id is already stored with the same digest is skipped
(``IngestResult.already``). A run id stored with *different* content raises
:class:`HistoryConflict` naming the run and both sources, and nothing of that import is written:
silently keeping either copy would make the history lie.

A **cell** is (backend, torch version, accel version), as in :mod:`accel_reports.analysis`. For
the benchmark noise band the accel version is *not* part of the key (comparing accel versions is
the point); see :mod:`accel_reports.benchmarks`.
"""

from __future__ import annotations

import hashlib
import json
import operator
import math
import os
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from .loaders import RUN_COLUMNS, TEST_COLUMNS, Loaded, _benchmark_frame, _frame, tests_frame

__all__ = ["SCHEMA_VERSION", "History", "HistoryConflict", "HistoryError", "IngestResult", "append_results", "open_history"]

SCHEMA_VERSION = 1
CELL = ["backend", "torch_version", "accel_version"]
FAILING = ("failed", "error")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('tests', 'benchmarks')),
    digest TEXT NOT NULL,
    backend TEXT, torch_version TEXT, accel_version TEXT,
    start_time TEXT, quick INTEGER, source TEXT,
    seq INTEGER NOT NULL, imported_at TEXT NOT NULL,
    info TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tests (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    backend TEXT, torch_version TEXT, accel_version TEXT,
    test_id TEXT, outcome TEXT, row TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tests_cell ON tests (backend, torch_version, accel_version, test_id);
CREATE INDEX IF NOT EXISTS tests_run ON tests (run_id);
CREATE TABLE IF NOT EXISTS benchmarks (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    backend TEXT, torch_version TEXT, accel_version TEXT, device TEXT,
    bench_id TEXT, datetime TEXT, quick INTEGER, value REAL,
    row TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS bench_cell ON benchmarks (backend, torch_version, bench_id);
CREATE INDEX IF NOT EXISTS bench_run ON benchmarks (run_id);
"""


class HistoryError(RuntimeError):
    """The history database cannot be used (another schema version, not a history file, ...)."""


class HistoryConflict(HistoryError):
    """A run id already stored with other content; nothing of the import was written."""


@dataclass
class IngestResult:
    """Run ids newly stored (``added``) and already stored with the same content (``already``)."""

    added: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return f"{len(self.added)} run(s) added, {len(self.already)} already stored"


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
    """A run history in one SQLite file (created with its schema when absent). Use as a context
    manager, or call :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._grouped: tuple[dict[tuple, list[tuple]], dict[tuple, str]] | None = None  # _per_test, until an import
        if self.path.is_dir():
            raise HistoryError(f"{self.path} is a folder, not a history database file")
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(str(self.path), timeout=30.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"{self.path} is not an accel history database ({exc})") from None
        if tables and "runs" not in tables:
            self._db.close()
            raise HistoryError(f"{self.path} is an SQLite database but not an accel history (no runs table)")
        if tables and version != SCHEMA_VERSION:
            self._db.close()
            raise HistoryError(f"{self.path} has history schema version {version}; this accel reads version "
                               f"{SCHEMA_VERSION} (use the accel that wrote it, or start a new history file)")
        with self._db:
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    # -- lifecycle
    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<History {self.path}>"

    # -- writing
    def ingest(self, loaded: Loaded) -> IngestResult:
        """Append every run of ``loaded`` (test runs and benchmark runs) in one transaction.

        Runs already stored with the same content are skipped; a run id stored with other content
        raises :class:`HistoryConflict` and nothing is written.
        """
        entries = list(self._test_runs(loaded)) + list(self._bench_runs(loaded))
        result = IngestResult()
        known = {r[0]: (r[1], r[2]) for r in self._db.execute("SELECT run_id, digest, source FROM runs")}
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
                    f"run {entry['run_id']!r} is already in {self.path} (from {stored[1]}) with other content than "
                    f"{entry['source']}; nothing was imported (a run id must name one run: remove one copy, or use "
                    "another history file)")
        seq = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM runs").fetchone()[0]
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self._db:  # one transaction: all of this import or nothing
            for entry in fresh:
                seq += 1
                self._db.execute(
                    "INSERT INTO runs (run_id, kind, digest, backend, torch_version, accel_version, start_time, quick, "
                    "source, seq, imported_at, info) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (entry["run_id"], entry["kind"], entry["digest"], entry["backend"], entry["torch_version"],
                     entry["accel_version"], entry["start_time"], entry["quick"], entry["source"], seq, now,
                     _dumps(entry["info"])))
                if entry["kind"] == "tests":
                    self._db.executemany(
                        "INSERT INTO tests (run_id, backend, torch_version, accel_version, test_id, outcome, row) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [(entry["run_id"], _text(r.get("backend")), _text(r.get("torch_version")), _text(r.get("accel_version")),
                          _text(r.get("test_id")), _text(r.get("outcome")), _dumps(r)) for r in entry["rows"]])
                else:
                    self._db.executemany(
                        "INSERT INTO benchmarks (run_id, backend, torch_version, accel_version, device, bench_id, datetime, "
                        "quick, value, row) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [(entry["run_id"], _text(r.get("backend")), _text(r.get("torch_version")), _text(r.get("accel_version")),
                          _text(r.get("device")), _text(r.get("bench_id")), _text(r.get("datetime")),
                          int(bool(_plain(r.get("quick")))), _plain(r.get("value")), _dumps(r)) for r in entry["rows"]])
                result.added.append(entry["run_id"])
        if fresh:
            self._grouped = None
        return result

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
        return [r[0] for r in self._db.execute("SELECT run_id FROM runs ORDER BY seq")]

    def _runs(self, kind: str, last: int | None) -> list[tuple[str, dict[str, Any]]]:
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
        return [(r[0], json.loads(r[6])) for r in rows]

    def _rows(self, table: str, run_ids: list[str]) -> list[dict[str, Any]]:
        if not run_ids:
            return []
        order = {run_id: i for i, run_id in enumerate(run_ids)}
        found: list[tuple[int, int, str]] = []
        for start in range(0, len(run_ids), 500):  # SQLite limits the number of parameters
            chunk = run_ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for rowid, run_id, text in self._db.execute(
                    f"SELECT rowid, run_id, row FROM {table} WHERE run_id IN ({marks})", chunk):
                found.append((order[run_id], rowid, text))
        found.sort(key=lambda item: (item[0], item[1]))
        # one parse of one array instead of one call per row: a third less time for 100,000 rows
        return json.loads("[" + ",".join(text for _, _, text in found) + "]")

    def load(self, *, last: int | None = None) -> Loaded:
        """The stored runs as :func:`accel_reports.loaders.load_results` frames (every run, or the
        ``last`` N runs of each cell, by start time), so a report can be rendered from the store."""
        test_runs = self._runs("tests", last)
        bench_runs = self._runs("benchmarks", last)
        test_rows = self._rows("tests", [r for r, _ in test_runs])
        try:  # rows stored from a tests frame carry every column: one C-level lookup per row
            pick = operator.itemgetter(*TEST_COLUMNS)
            columns: dict[str, list[Any]] = dict(zip(TEST_COLUMNS, map(list, zip(*map(pick, test_rows))))) \
                if test_rows else {c: [] for c in TEST_COLUMNS}
        except KeyError:  # a row from an older accel lacks a column
            columns = {c: [row.get(c) for row in test_rows] for c in TEST_COLUMNS}
        columns["tracked_pass"] = [tuple(v) if isinstance(v, list) else v for v in columns["tracked_pass"]]
        run_rows = [info for _, info in test_runs]
        return Loaded(tests=tests_frame(columns), runs=_frame(run_rows, RUN_COLUMNS),
                      benchmarks=self._bench_frame(self._rows("benchmarks", [r for r, _ in bench_runs])),
                      problems=[], files=[str(self.path)])

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
        return self._bench_frame(self._rows("benchmarks", [r for r, _ in self._runs("benchmarks", None)]))

    # -- analyses
    def _per_test(self) -> tuple[dict[tuple, list[list]], dict[tuple, str]]:
        """(cell..., test id) -> one entry per run it ran in, oldest first: ``[run_id, start_time,
        failing, passing, mixed, signature]`` (failing when any record of the run failed, passing
        when one passed, mixed for both, the last failing record's signature); and cell -> its latest
        run with test records. Grouped in plain Python over SQLite's ordered rows (a pandas group-by
        of 100,000 records cost several times more); kept until the next import."""
        if self._grouped is not None:
            return self._grouped
        failing_outcomes = frozenset(FAILING)
        grouped: dict[tuple, list[list]] = {}
        latest: dict[tuple, str] = {}
        rows = self._db.execute(
            "SELECT t.backend, t.torch_version, t.accel_version, t.test_id, t.run_id, t.outcome, COALESCE(r.start_time, ''), "
            # the signature only where a test failed: reading it out of every record's JSON is most of the cost
            f"CASE WHEN t.outcome IN ({', '.join(repr(o) for o in FAILING)}) THEN json_extract(t.row, '$.signature') END "
            "FROM tests t JOIN runs r ON r.run_id = t.run_id ORDER BY COALESCE(r.start_time, ''), r.seq")
        for backend, torch_version, accel_version, test_id, run_id, outcome, start, signature in rows:
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
    """Open (or create) the history database at ``path``; raises :class:`HistoryError` with the reason
    when the file is not one this accel can use."""
    return History(path)


def append_results(db: str | os.PathLike[str], paths: Iterable[str | os.PathLike[str]]) -> IngestResult:
    """Load the result files under ``paths`` (those that exist) and append their runs to the history
    ``db`` (``accel qualify --history``). Raises :class:`HistoryError` when the history cannot take them."""
    from .loaders import load_results

    existing = [p for p in paths if Path(p).exists()]
    loaded = load_results(existing) if existing else None
    with open_history(db) as history:
        return history.ingest(loaded) if loaded is not None else IngestResult()
