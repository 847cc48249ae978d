"""A real PostgreSQL server for the run-history tests: initdb into a fresh folder, pg_ctl on a
unix socket in that folder (no TCP port to collide with), one new database per test, stopped at
the end of the session. Skips with the reason where no server binaries or no driver exist."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

#: seconds for initdb and for the server to start on a loaded 2-core machine
START_TIMEOUT = 240


def server_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: ``pg_config --bindir``, Debian's
    ``/usr/lib/postgresql/<version>/bin`` (newest first), or the PATH."""
    candidates = []
    if shutil.which("pg_config"):
        found = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        if found.returncode == 0:
            candidates.append(Path(found.stdout.strip()))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                           key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
                                           reverse=True)]
    if shutil.which("initdb"):
        candidates.append(Path(shutil.which("initdb")).resolve().parent)
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    return None


class Server:
    """One running server; :meth:`new_database` gives a URL to an empty database."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="accel-pg-"))  # not under pytest's root-only tmp folder
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 5432  # with listen_addresses='' it only names the socket file inside self.root
        self.prefix: list[str] = []
        if os.geteuid() == 0:  # initdb refuses to run as root: run the server as the postgres user
            import pwd

            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                shutil.rmtree(self.root, ignore_errors=True)
                pytest.skip("running as root and there is no 'postgres' user to run the PostgreSQL server as")
            runuser = shutil.which("runuser")
            if runuser is None:
                shutil.rmtree(self.root, ignore_errors=True)
                pytest.skip("running as root and runuser is missing: cannot start PostgreSQL as another user")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.prefix = [runuser, "-u", "postgres", "--"]

    def _run(self, *command: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.prefix, *command], capture_output=True, text=True, timeout=START_TIMEOUT)

    def start(self) -> None:
        """initdb, then pg_ctl start on a unix socket only; raises with the server's log when either fails."""
        init = self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                         "-E", "UTF8", "--no-sync", "--no-instructions")
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stdout}\n{init.stderr}")
        options = f"-k {self.root} -c listen_addresses='' -p {self.port} -c fsync=off -c max_connections=100"
        started = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options,
                            "-w", "-t", str(START_TIMEOUT), "start")
        if started.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {started.stdout}\n{started.stderr}\n{log}")

    def url(self, database: str = "postgres") -> str:
        """The libpq URL of ``database`` on this server (through its socket folder)."""
        return f"postgresql://postgres@/{database}?host={self.root}&port={self.port}"

    def new_database(self) -> str:
        """Create an empty database with a fresh name; its URL."""
        import psycopg

        name = f"accel_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        """Stop the server (immediate mode) and remove its folder."""
        if self.data.exists():
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server for this session (skips with the reason where none can run)."""
    pytest.importorskip("psycopg", reason="the PostgreSQL driver (pip install 'accel[postgres]') is not installed")
    bindir = server_binaries()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql")
    server = Server(bindir)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """The URL of a new, empty database on the session's server."""
    return postgres_server.new_database()
