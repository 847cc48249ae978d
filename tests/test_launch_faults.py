"""`accel launch` under faults (issue 20): a hung rank, a killed launcher, the first rank to fail.

Real launches run `python -m accel.commands.cli launch ...` in a subprocess with 2 CPU ranks; the
ranks write their pids (and the hanging rank the time it started hanging) into $ACCEL_TEST_OUT.
The 20-run blame check is slow (marker ``slow``, opt-in with RUN_SLOW=1 as accel.test_utils.slow is);
one run of it is in the default suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accel.commands import UsageError
from accel.commands import launch as L
from accel.utils import heartbeat

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[1]
HANG_TIMEOUT = 4
#: slow tests run only when asked (RUN_SLOW=1), as accel.test_utils.slow; CI's default run stays short
OPT_IN = pytest.mark.skipif(os.environ.get("RUN_SLOW", "").strip().lower() not in ("1", "true", "yes", "on"),
                            reason="[opt-in] test is slow: set RUN_SLOW=1 to run it")
SLOW = [pytest.mark.slow, OPT_IN]


def _env(out: Path) -> dict[str, str]:
    env = dict(os.environ, ACCEL_TEST_OUT=str(out), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    for name in ("ACCEL_DEVICE", "ACCEL_CONFIG_FILE", "ACCEL_HANG_TIMEOUT", heartbeat.RUN_DIR_ENV, L.LAUNCHER_PID_ENV):
        env.pop(name, None)
    env["XDG_CACHE_HOME"] = str(out / "cache")
    return env


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "accel.commands.cli", "launch", "--cpu", "--num_processes", "2", *args]


def _launch(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.run(_command(*args), capture_output=True, text=True, timeout=timeout, env=_env(out), cwd=tmp_path)


def _pids(out: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(out.glob("pid-*")) if p.read_text().strip()]


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie has exited; only its parent's reaping is pending)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if _running(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _running(p)]


# ---------------------------------------------------------------------------------------------- a hung rank
def _check_hang(tmp_path: Path, mode: str) -> str:
    done = _launch(tmp_path, "--hang_timeout", str(HANG_TIMEOUT), str(SCRIPTS / "hang_rank.py"), mode)
    ended = time.time()
    out = tmp_path / "out"
    err = done.stderr
    assert done.returncode == L.HANG_EXIT_CODE, err[-4000:]
    assert "got past the collective" not in done.stdout
    started = float((out / "hang-started").read_text())
    assert ended - started <= HANG_TIMEOUT + 10, f"hang ended {ended - started:.1f} s after it began"
    headline = [line for line in err.splitlines() if line.startswith("accel launch: rank")][0]
    assert headline.startswith("accel launch: rank 1 ") and "hung" in headline, err[-4000:]
    # every rank's stack: the hung rank where it is stuck, the waiting peer in its collective
    assert "--- rank 0 " in err and "--- rank 1 " in err
    rank1 = err.split("--- rank 1 ")[1]
    rank0 = err.split("--- rank 0 ")[1].split("--- rank 1 ")[0]
    assert "in stuck_forever" in rank1 and "not in a collective" in rank1.splitlines()[0]
    assert "waiting in a collective" in rank0.splitlines()[0]
    assert ("in gather" if mode == "gather" else "in wait_for_everyone") in rank0
    assert _wait_gone(_pids(out), 5) == []
    return err


def test_hung_rank_is_named_with_every_stack_and_ended(tmp_path):
    """Rank 1 hangs after 3 steps while rank 0 waits in accel's gather: rank 1 is behind by one progress point.

    Each step passes two points (``backward`` and the optimizer step), the gather one more.
    """
    err = _check_hang(tmp_path, "gather")
    assert "rank 1 is behind: 6 progress point(s)" in err and "rank 0: 7" in err


@pytest.mark.slow
@OPT_IN
def test_hung_rank_is_named_when_the_peer_waits_in_a_plain_barrier(tmp_path):
    """wait_for_everyone passes no progress point: both ranks are even, the stacks tell the waiter apart."""
    _check_hang(tmp_path, "barrier")


# ---------------------------------------------------------------------------------------------- a killed launcher
@pytest.mark.parametrize("how", [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=SLOW),
                                 pytest.param(signal.SIGINT, marks=SLOW)])
def test_ranks_die_with_the_launcher(tmp_path, how):
    out = tmp_path / "out"
    out.mkdir()
    launcher = subprocess.Popen(_command(str(SCRIPTS / "sleep_rank.py")), env=_env(out), cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(_pids(out)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = _pids(out)
        assert len(pids) == 2, "the ranks did not start"
        assert all(_running(p) for p in pids)
        launcher.send_signal(how)
        launcher.wait(timeout=10)
        assert _wait_gone(pids, 5) == [], "ranks still running after the launcher was killed"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in _pids(out):
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------- blame by event order
def _blamed(tmp_path: Path) -> tuple[int, str]:
    done = _launch(tmp_path, str(SCRIPTS / "blame_rank.py"), "slow-exit")
    headline = [line for line in done.stderr.splitlines() if line.startswith("accel launch: rank")]
    assert headline, done.stderr[-3000:]
    return done.returncode, headline[0]


def test_the_first_rank_to_fail_is_named(tmp_path):
    """Rank 1 raises; rank 0's collective breaks and it exits first (rank 1's exit is slow): rank 1 is named."""
    code, headline = _blamed(tmp_path)
    assert code == 1 and headline.startswith("accel launch: rank 1 ") and "failed with an error" in headline, headline


@pytest.mark.slow
@OPT_IN
def test_the_first_rank_to_fail_is_named_in_every_run(tmp_path):
    wrong = []
    for i in range(20):
        code, headline = _blamed(tmp_path / str(i))
        if code != 1 or not headline.startswith("accel launch: rank 1 "):
            wrong.append(headline)
    assert wrong == []


class _Failure:
    def __init__(self, exitcode: int, timestamp: int):
        self.exitcode, self.timestamp, self.local_rank, self.pid = exitcode, timestamp, 0, 1

    def signal_name(self) -> str:
        return signal.Signals(-self.exitcode).name if self.exitcode < 0 else ""


def test_root_failure_goes_by_recorded_time_not_by_exit_order():
    # rank 0 exited first with an error of its own (a broken collective); rank 1 failed earlier
    failures = {0: _Failure(1, 100), 1: _Failure(-15, 100)}
    assert L._root_failure(failures)[0] == 0  # without the ranks' records: the agent's view
    assert L._root_failure(failures, {0: 2_000, 1: 1_000})[0] == 1
    assert L._root_failure(failures, {0: 2_000})[0] == 0  # a rank with no record (killed by a signal) comes after


# ---------------------------------------------------------------------------------------------- the pieces
def _beat(rank: int, pid: int, count: int, last: float) -> heartbeat.Beat:
    return heartbeat.Beat(rank, pid, count, 0, last)


WAITING = 'Current thread 0x1 (most recent call first):\n  File "/x/torch/distributed/distributed_c10d.py", line 9 in barrier\n  File "t.py", line 1 in <module>\n'
BUSY = 'Thread 0x2 (most recent call first):\n  File "t.py", line 4 in stuck\n  File "t.py", line 1 in <module>\n'


def test_hung_rank_choice():
    # fewest progress points: its peers went on into a collective it never reached
    assert L.hung_rank({0: _beat(0, 1, 5, 10.0), 1: _beat(1, 2, 4, 9.0), 2: _beat(2, 3, 5, 10.0)}, {}) == 1
    # even: the stacks tell the rank outside a collective from those waiting in one
    beats = {0: _beat(0, 1, 3, 5.0), 1: _beat(1, 2, 3, 6.0)}
    assert L.hung_rank(beats, {0: WAITING, 1: BUSY}) == 1
    assert L.hung_rank(beats, {0: BUSY, 1: WAITING}) == 0
    # nothing else to go by: the oldest last progress
    assert L.hung_rank(beats, {}) == 0
    assert L.waiting_in_collective(WAITING) and not L.waiting_in_collective(BUSY) and not L.waiting_in_collective(None)


def test_heartbeat_file_round_trip(tmp_path, monkeypatch):
    import faulthandler

    heartbeat.beat()  # outside accel launch: nothing happens
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("RANK", "3")
    try:
        assert heartbeat.start(tmp_path)
        heartbeat.beat()
        heartbeat.beat()
        before = heartbeat.read(tmp_path)[3]
        assert before.pid == os.getpid() and before.count == 2 and before.busy == 0
        heartbeat.alive()  # busy moves, the progress count does not
        after = heartbeat.read(tmp_path)[3]
        assert after.count == 2 and after.busy == 1
    finally:
        faulthandler.unregister(heartbeat.STACK_SIGNAL)
        heartbeat._view = heartbeat._map = None
    monkeypatch.setenv(heartbeat.RUN_DIR_ENV, str(tmp_path))
    heartbeat.record_failure()
    assert heartbeat.read_failure(tmp_path, 3) is not None and heartbeat.read_failure(tmp_path, 0) is None


def test_hang_timeout_option(monkeypatch):
    monkeypatch.delenv(L.HANG_TIMEOUT_ENV, raising=False)
    assert L._hang_timeout(None) == L.DEFAULT_HANG_TIMEOUT == 600
    assert L._hang_timeout(30) == 30 and L._hang_timeout(0) == 0
    monkeypatch.setenv(L.HANG_TIMEOUT_ENV, "90")
    assert L._hang_timeout(None) == 90 and L._hang_timeout(5) == 5  # the flag wins
    monkeypatch.setenv(L.HANG_TIMEOUT_ENV, "soon")
    with pytest.raises(UsageError, match="ACCEL_HANG_TIMEOUT must be a number of seconds, got 'soon'"):
        L._hang_timeout(None)
    with pytest.raises(UsageError, match="--hang_timeout must be 0"):
        L._hang_timeout(-1)
