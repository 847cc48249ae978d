"""The run history against hostile inputs: stored messages and tracebacks are truncated to the
harness's limits."""

from __future__ import annotations

import sqlite3

from accel_harness.records import MESSAGE_LIMIT, TRACEBACK_LIMIT
from accel_reports.history import History, open_history
from accel_reports.loaders import load_results

from _report_data import longrepr, rec, run_file


def _results(folder, *, traceback: str | None = None, message: str | None = None):
    """One run with a failing test (its traceback and message as given) and a passing one."""
    failing = rec("run-1", "test_broken", "cpu", "failed", longrepr(["AssertionError: boom"]))
    if traceback is not None:
        failing.traceback = traceback
    if message is not None:
        failing.message = message
    run_file(folder, "night", "cpu", [failing, rec("run-1", "test_ok", "cpu", "passed")])
    return folder


# ---------------------------------------------------------------------------- stored texts are truncated
def _stored(db, field: str) -> str:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(f"SELECT json_extract(\"row\", '$.{field}') FROM tests WHERE outcome = 'failed'").fetchone()[0]
    finally:
        conn.close()


def test_stored_tracebacks_and_messages_are_truncated_head_and_tail_kept(tmp_path):
    traceback = "Traceback (most recent call last):\n" + "x" * 500_000 + "\nAssertionError: the tail"
    results = _results(tmp_path / "r", traceback=traceback, message="M" * 100_000)
    db = tmp_path / "history.db"
    with open_history(db) as history:
        assert history.ingest(load_results([results])).added == ["run-1"]
    stored = _stored(db, "traceback")
    assert len(stored) <= TRACEBACK_LIMIT and "characters truncated" in stored
    assert stored.startswith("Traceback (most recent call last):") and stored.endswith("AssertionError: the tail")
    assert len(_stored(db, "message")) <= MESSAGE_LIMIT
    with open_history(db) as history:  # the content is the same run: the truncation does not change its digest
        assert history.ingest(load_results([results])).already == ["run-1"]
        shown = history.load().tests.set_index("outcome").loc["failed"]
    assert len(shown["traceback"]) <= TRACEBACK_LIMIT and len(shown["message"]) <= MESSAGE_LIMIT


def test_a_stored_text_over_the_limit_is_truncated_when_read(tmp_path):
    db = tmp_path / "history.db"
    with open_history(db) as history:
        history.ingest(load_results([_results(tmp_path / "r")]))
    conn = sqlite3.connect(db)  # an edited (or older) history holding a whole traceback
    conn.execute("""UPDATE tests SET "row" = json_set("row", '$.traceback', ?) WHERE outcome = 'failed'""",
                 ("head\n" + "y" * 100_000 + "\ntail",))
    conn.commit()
    conn.close()
    with History(db) as history:
        loaded = history.load()
    traceback = loaded.tests.set_index("outcome").loc["failed", "traceback"]
    assert len(traceback) <= TRACEBACK_LIMIT and traceback.startswith("head") and traceback.endswith("tail")
    assert any("truncated" in p.message for p in loaded.problems)
