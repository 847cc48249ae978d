"""Many processes create and import into one run history at once (SQLite file and PostgreSQL).

Each worker process waits for the word "go" on its stdin, so all of them open the new history
together, then imports its share of the runs one import at a time; the runs overlap so that every
run is imported by two workers, often at the same moment. Every process must exit 0, every run
must be stored once, added by exactly one worker, and the import order must be unique.

``ACCEL_TEST_HISTORY_IMPORTS`` (imports per worker, default 10) and ``ACCEL_TEST_HISTORY_ROUNDS``
(how many times in a row, default 1) make it the full stress test: 50 and 20.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _report_data import rec, run_file
from _report_postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)

WORKERS = 8
IMPORTS = int(os.environ.get("ACCEL_TEST_HISTORY_IMPORTS", "10"))
ROUNDS = int(os.environ.get("ACCEL_TEST_HISTORY_ROUNDS", "1"))
TIMEOUT = 600  # seconds for one round on a loaded 2-core machine


def _runs(folder: Path, count: int) -> list[Path]:
    paths = []
    for i in range(count):
        run_id = f"run-{i:04d}"
        records = [rec(run_id, "test_a", "cpu", "passed"), rec(run_id, "test_b", "cpu", "failed" if i % 3 else "passed"),
                   rec(run_id, "test_c", "cpu", "skipped", "Skipped: [needs-devices] needs 2 cpu devices")]
        paths.append(run_file(folder, run_id, "cpu", records, start=f"2025-06-01T00:{i // 60:02d}:{i % 60:02d}.000+00:00"))
    return paths


def _worker(target: str, files: list[str]) -> int:
    """One worker: ready, wait for go, then one import per file, one JSON line per import."""
    from accel_reports.history.store import append_results

    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 3
    for path in files:
        result = append_results(target, [path])
        print(json.dumps({"added": result.added, "already": result.already}), flush=True)
    return 0


def _round(target: str, files: list[Path]) -> list[dict]:
    """Start the workers, release them together, and collect every import's result."""
    count = len(files)
    half = IMPORTS // 2
    shares = [[str(files[(w * half + i) % count]) for i in range(IMPORTS)] for w in range(WORKERS)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / "support"), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, __file__, target, *share], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for share in shares]
    try:
        for proc in procs:  # every worker has imported what it needs before any opens the history
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.stderr.read()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT)
            assert proc.returncode == 0, f"worker exited {proc.returncode}: {err[-3000:]}"
            lines = [json.loads(line) for line in out.splitlines() if line.strip()]
            assert len(lines) == IMPORTS, err
            results.extend(lines)
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _check(target: str, files: list[Path], results: list[dict]) -> None:
    from accel_reports.history.store import History

    expected = {f"run-{i:04d}" for i in range(len(files))}
    added = [run_id for r in results for run_id in r["added"]]
    assert sorted(added) == sorted(expected)  # every run added once, by exactly one worker
    assert sum(len(r["added"]) + len(r["already"]) for r in results) == WORKERS * IMPORTS
    with History(target) as history:
        stored = history.run_ids()
        seqs = [row[0] for row in history._db.execute("SELECT seq FROM runs ORDER BY seq")]
        tests = history._db.execute("SELECT COUNT(*) FROM tests").fetchone()[0]
    assert sorted(stored) == sorted(expected)
    assert seqs == list(range(1, len(expected) + 1))  # unique import order, no gaps
    assert tests == 3 * len(expected)


def _stress(target_for_round, tmp_path: Path) -> None:
    files = _runs(tmp_path / "runs", WORKERS * IMPORTS // 2)
    for number in range(ROUNDS):
        target = target_for_round(number)
        _check(target, files, _round(target, files))


def test_concurrent_imports_into_a_new_sqlite_history(tmp_path):
    _stress(lambda n: str(tmp_path / f"round{n}" / "history.db"), tmp_path)


def test_concurrent_imports_into_a_new_postgres_history(tmp_path, postgres_server):
    _stress(lambda n: postgres_server.new_database(), tmp_path)


def test_concurrent_accel_report_history_commands_all_exit_0(tmp_path):
    """The same through the real CLI: four `accel report --history` at once, into a new file,
    with overlapping runs: every one exits 0 and every run is stored once."""
    files = _runs(tmp_path / "runs", 6)
    db = tmp_path / "new" / "history.db"
    env = {**os.environ, "CI": ""}
    procs = [subprocess.Popen([sys.executable, "-m", "accel.commands.cli", "report", *map(str, files[i:i + 3]),
                               "--history", str(db), "-o", str(tmp_path / f"out{i}"), "--fail-on", "none"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(4)]
    outputs = [proc.communicate(timeout=TIMEOUT) for proc in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    added = sum(int(re.search(r"(\d+) run\(s\) added", err).group(1)) for _, err in outputs)
    assert added == 6
    from accel_reports.history.store import History

    with History(db) as history:
        assert sorted(history.run_ids()) == [f"run-{i:04d}" for i in range(6)]


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1], sys.argv[2:]))
