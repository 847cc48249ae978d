"""The run history against slow or hostile stores: a PostgreSQL host that never answers fails after
the connection timeout in one line, a read never creates or writes a history (an SQLite file is read
``mode=ro``), and stored messages and tracebacks are truncated to the harness's limits."""

from __future__ import annotations

import os
import socket
import sqlite3

import pytest

from accel_harness.records import MESSAGE_LIMIT, TRACEBACK_LIMIT
from accel_reports.history.store import History, HistoryError, open_history
from accel_reports.history.db import CONNECT_TIMEOUT, CONNECT_TIMEOUT_ENV
from accel_reports.load.loaders import load_results

from _report_data import longrepr, rec, run_file
from _report_postgres import postgres_server  # noqa: F401  (fixture)
from _waits import SAFETY_NET_S


def _results(folder, *, traceback: str | None = None, message: str | None = None):
    """One run with a failing test (its traceback and message as given) and a passing one."""
    failing = rec("run-1", "test_broken", "cpu", "failed", longrepr(["AssertionError: boom"]))
    if traceback is not None:
        failing.traceback = traceback
    if message is not None:
        failing.message = message
    run_file(folder, "night", "cpu", [failing, rec("run-1", "test_ok", "cpu", "passed")])
    return folder


@pytest.fixture
def report(monkeypatch, capsys):
    """``accel report ARGS`` through main() in this process: ``(exit code, stderr)``."""
    from accel.commands.cli import main

    monkeypatch.setenv("CI", "")

    def run(*args):
        capsys.readouterr()
        code = main(["report", *map(str, args)])
        return code, capsys.readouterr().err

    return run


# ---------------------------------------------------------------------------- a PostgreSQL host that never answers
@pytest.fixture(params=["accept queue full", "accepted, never answered"])
def unanswered(request):
    """``host:port`` on this machine where a connection is never answered, and never refused:
    a listening socket nobody accepts on, its accept queue full (the handshake itself hangs) or
    not (the handshake completes; the server never says a word)."""
    pytest.importorskip("psycopg", reason="the PostgreSQL driver (accel[postgres]) is not installed")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    held = [server]
    full = request.param == "accept queue full"
    server.listen(0 if full else 8)
    port = server.getsockname()[1]
    if full:
        filler = socket.create_connection(("127.0.0.1", port), timeout=SAFETY_NET_S)  # the one place in the queue
        held.append(filler)
        for _ in range(4):  # more handshakes in flight, in case this kernel queues one more
            extra = socket.socket()
            extra.setblocking(False)
            extra.connect_ex(("127.0.0.1", port))
            held.append(extra)
    yield f"127.0.0.1:{port}"
    for sock in held:
        sock.close()


@pytest.mark.timeout(SAFETY_NET_S)
def test_a_host_that_never_answers_fails_after_the_timeout_in_one_line(unanswered, monkeypatch):
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "2")
    with pytest.raises(HistoryError) as caught:
        History(f"postgresql://someone:hunter2@{unanswered}/accel")
    message = str(caught.value)
    assert f"PostgreSQL at {unanswered} did not answer within 2 s" in message, message
    assert CONNECT_TIMEOUT_ENV in message and "\n" not in message and "hunter2" not in message


@pytest.mark.timeout(SAFETY_NET_S)
def test_the_urls_own_connect_timeout_wins_and_the_command_exits_2(unanswered, monkeypatch, report, tmp_path):
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "600")  # would outlast the safety net: the URL's 2 s must be the one used
    code, err = report("--history", f"postgresql://someone@{unanswered}/accel?connect_timeout=2", "-o", tmp_path / "out")
    assert code == 2, err
    assert f"did not answer within 2 s" in err and unanswered in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_the_default_timeout_is_10_s_and_the_setting_is_checked(monkeypatch, tmp_path):
    psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL driver (accel[postgres]) is not installed")
    seen = []

    def refuse(conninfo, **kwargs):
        seen.append(kwargs.get("connect_timeout"))
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(psycopg, "connect", refuse)
    monkeypatch.delenv(CONNECT_TIMEOUT_ENV, raising=False)
    url = f"postgresql://u@/accel?host={tmp_path}"
    with pytest.raises(HistoryError, match=f"cannot connect to PostgreSQL at {tmp_path}:5432"):
        History(url)
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "2.5")
    with pytest.raises(HistoryError):
        History(url)
    with pytest.raises(HistoryError):
        History(url + "&connect_timeout=7")  # the URL's own: passed as it is, not overridden
    assert CONNECT_TIMEOUT == 10 and seen == [10, 3, None]
    for bad in ("soon", "0", "-1", "inf"):
        monkeypatch.setenv(CONNECT_TIMEOUT_ENV, bad)
        with pytest.raises(HistoryError, match=f"{CONNECT_TIMEOUT_ENV}=.*expected a number of seconds"):
            History(url)
    assert seen == [10, 3, None]  # a bad setting is refused before any connection is tried


# ---------------------------------------------------------------------------- a read creates and writes nothing
def test_reading_a_history_that_does_not_exist_names_it_and_creates_nothing(tmp_path, report):
    missing = tmp_path / "typo" / "history.db"
    code, err = report("--history", missing, "-o", tmp_path / "out")
    assert code == 2 and "no such history" in err and "history.db" in err, err
    assert not missing.exists() and not missing.parent.exists()
    with pytest.raises(HistoryError, match="no such history"):
        open_history(missing, read_only=True)
    assert not missing.parent.exists()
    code, err = report(_results(tmp_path / "r"), "--history", missing, "-o", tmp_path / "out", "--fail-on", "none")
    assert code == 0 and missing.is_file(), err  # an import creates it


def _state(path):
    """What a read must leave as it was: the folder's names, the file's bytes and modification time."""
    return sorted(os.listdir(path.parent)), path.read_bytes(), path.stat().st_mtime_ns


def test_a_read_opens_read_only_and_leaves_the_file_and_its_folder_as_they_were(tmp_path, report):
    db = tmp_path / "h" / "history.db"
    with open_history(db) as history:
        history.ingest(load_results([_results(tmp_path / "r")]))
    db.chmod(0o444)  # stops a write only where the tests do not run as root; the checks below hold as root too
    before = _state(db)
    with History(db, read_only=True) as history:
        assert history.run_ids() == ["run-1"]
        with pytest.raises(sqlite3.OperationalError, match="readonly"):  # opened mode=ro: SQLite refuses any write
            history._db.execute("CREATE TABLE intruder (x)")
        with pytest.raises(HistoryError, match="read-only"):
            history.ingest(load_results([tmp_path / "r"]))
    assert _state(db) == before  # no -wal, -shm or -journal left, the file untouched
    code, err = report("--history", db, "-o", tmp_path / "out", "--fail-on", "none")
    assert code == 0, err
    assert _state(db) == before


def test_a_history_whose_folder_refuses_the_wal_index_is_still_read(tmp_path, report):
    db = tmp_path / "h" / "history.db"
    with open_history(db) as history:
        history.ingest(load_results([_results(tmp_path / "r")]))
    # SQLite cannot make its write-ahead log here (as in a read-only folder, which root could still write)
    (db.parent / "history.db-wal").mkdir()
    before = _state(db)
    code, err = report("--history", db, "-o", tmp_path / "out", "--fail-on", "none")
    assert code == 0, err
    assert "first failed in run run-1" in (tmp_path / "out" / "report.md").read_text()  # rendered from the history
    assert _state(db)[1:] == before[1:] and not (db.parent / "history.db-journal").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder anyway")
def test_a_history_in_a_read_only_folder_renders(tmp_path, report):
    folder = tmp_path / "cache"
    db = folder / "history.db"
    with open_history(db) as history:
        history.ingest(load_results([_results(tmp_path / "r")]))
    db.chmod(0o444)
    folder.chmod(0o555)
    try:
        before = _state(db)
        code, err = report("--history", db, "-o", tmp_path / "out", "--fail-on", "none")
        assert code == 0, err
        assert _state(db) == before
    finally:
        folder.chmod(0o755)


def test_a_read_of_an_empty_postgres_database_creates_no_tables(postgres_server, report, tmp_path):
    import psycopg

    url = postgres_server.new_database()
    code, err = report("--history", url, "-o", tmp_path / "out")
    assert code == 2 and "holds no accel history yet" in err, err
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema()"
                            ).fetchone()[0] == 0


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
    with History(db, read_only=True) as history:
        loaded = history.load()
    traceback = loaded.tests.set_index("outcome").loc["failed", "traceback"]
    assert len(traceback) <= TRACEBACK_LIMIT and traceback.startswith("head") and traceback.endswith("tail")
    assert any("truncated" in p.message for p in loaded.problems)
