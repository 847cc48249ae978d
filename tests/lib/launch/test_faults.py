"""`accel launch` under faults: a hung rank, a killed launcher, the first rank to fail, and faults injected
from outside (a rank SIGKILLed as the out-of-memory killer does, a rank frozen with SIGSTOP as a stuck
driver call looks) on one node and on two simulated nodes (two launchers on 127.0.0.1).

Real launches run `python -m accel.commands.cli launch ...` in a subprocess with CPU ranks; the
ranks write their pids (and the points they reached) into $ACCEL_TEST_OUT, and the tests wait for
those files, never for a fixed time. Tests marked ``slow`` run with RUN_SLOW=1 (tests/conftest.py; the
nightly workflow sets it): the 20-run blame check (one run of it is in the default suite) and cases whose
behaviour a faster test covers, named beside each.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from accel.commands import UsageError
from accel.commands import launch as L
from accel.launch import bootstrap, heartbeat
from accel.launch import diagnosis as D
from accel.launch import nodes as N
from accel.launch.plan import DEFAULT_HANG_TIMEOUT
from accel.launch.watchdog import HANG_EXIT_CODE
from _waits import SAFETY_NET_S
from dist_utils import free_port

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
REPO = Path(__file__).resolve().parents[3]
HANG_TIMEOUT = 4
#: slow tests run only when asked (RUN_SLOW=1, tests/conftest.py); CI's default run stays short
SLOW = [pytest.mark.slow]


def _env(out: Path) -> dict[str, str]:
    env = dict(os.environ, ACCEL_TEST_OUT=str(out), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    for name in ("ACCEL_DEVICE", "ACCEL_CONFIG_FILE", "ACCEL_HANG_TIMEOUT", heartbeat.RUN_DIR_ENV, bootstrap.LAUNCHER_PID_ENV):
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
    out = tmp_path / "out"
    err = done.stderr
    assert done.returncode == HANG_EXIT_CODE, err[-4000:]
    assert "got past the collective" not in done.stdout
    assert (out / "hang-started").is_file()
    headline = [line for line in err.splitlines() if line.startswith("accel launch: rank")][0]
    assert headline.startswith("accel launch: rank 1 ") and "hung" in headline, err[-4000:]
    # the watchdog ended it at the given timeout, not the default 600 s (which would outlast _launch's wait)
    assert f"(--hang_timeout {HANG_TIMEOUT})" in headline, headline
    # every rank's stack: the hung rank where it is stuck, the waiting peer in its collective
    assert "--- rank 0 " in err and "--- rank 1 " in err
    rank1 = err.split("--- rank 1 ")[1]
    rank0 = err.split("--- rank 0 ")[1].split("--- rank 1 ")[0]
    assert "in stuck_forever" in rank1 and "not in a collective" in rank1.splitlines()[0]
    assert "waiting in a collective" in rank0.splitlines()[0]
    assert ("in gather" if mode == "gather" else "in wait_for_everyone") in rank0
    assert _wait_gone(_pids(out), SAFETY_NET_S) == []
    return err


def test_hung_rank_is_named_with_every_stack_and_ended(tmp_path):
    """Rank 1 hangs after 3 steps while rank 0 waits in accel's gather: rank 1 is behind by one progress point.

    Each step passes two points (``backward`` and the optimizer step), the gather one more.
    """
    err = _check_hang(tmp_path, "gather")
    assert "rank 1 is behind: 6 progress point(s)" in err and "rank 0: 7" in err


@pytest.mark.slow
def test_hung_rank_is_named_when_the_peer_waits_in_a_plain_barrier(tmp_path):
    """wait_for_everyone passes no progress point: both ranks are even, the stacks tell the waiter apart."""
    _check_hang(tmp_path, "barrier")


# ---------------------------------------------------------------------------------------------- a killed launcher
# slow (nightly), every signal: test_the_folder_of_a_killed_launcher_is_removed_by_the_next_start SIGKILLs the
# launcher of the same sleeping ranks (running, both of them) and asserts they are gone
@pytest.mark.parametrize("how", [pytest.param(signal.SIGKILL, marks=SLOW), pytest.param(signal.SIGTERM, marks=SLOW),
                                 pytest.param(signal.SIGINT, marks=SLOW)])
def test_ranks_die_with_the_launcher(tmp_path, how):
    out = tmp_path / "out"
    out.mkdir()
    launcher = subprocess.Popen(_command(str(SCRIPTS / "sleep_rank.py")), env=_env(out), cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + SAFETY_NET_S
        while len(_pids(out)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = _pids(out)
        assert len(pids) == 2, "the ranks did not start"
        assert all(_running(p) for p in pids)
        launcher.send_signal(how)
        launcher.wait(timeout=SAFETY_NET_S)
        assert _wait_gone(pids, SAFETY_NET_S) == [], "ranks still running after the launcher was killed"
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
def test_the_first_rank_to_fail_is_named_in_every_run(tmp_path):
    wrong = []
    for i in range(20):
        code, headline = _blamed(tmp_path / str(i))
        if code != 1 or not headline.startswith("accel launch: rank 1 "):
            wrong.append(headline)
    assert wrong == []


def test_heartbeat_file_round_trip(tmp_path, monkeypatch):
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
        assert heartbeat.active
    finally:
        heartbeat.stop()
    assert not heartbeat.active
    heartbeat.beat()  # a no-op once stopped
    assert heartbeat.read(tmp_path)[3].count == 2
    monkeypatch.setenv(heartbeat.RUN_DIR_ENV, str(tmp_path))
    heartbeat.record_failure()
    assert heartbeat.read_failure(tmp_path, 3) is not None and heartbeat.read_failure(tmp_path, 0) is None


def test_hang_timeout_option(monkeypatch):
    monkeypatch.delenv(L.HANG_TIMEOUT_ENV, raising=False)
    assert L._hang_timeout(None) == DEFAULT_HANG_TIMEOUT == 600
    assert L._hang_timeout(30) == 30 and L._hang_timeout(0) == 0
    monkeypatch.setenv(L.HANG_TIMEOUT_ENV, "90")
    assert L._hang_timeout(None) == 90 and L._hang_timeout(5) == 5  # the flag wins
    monkeypatch.setenv(L.HANG_TIMEOUT_ENV, "soon")
    with pytest.raises(UsageError, match="ACCEL_HANG_TIMEOUT must be a number of seconds, got 'soon'"):
        L._hang_timeout(None)
    with pytest.raises(UsageError, match="--hang_timeout must be 0"):
        L._hang_timeout(-1)


# ---------------------------------------------------------------------------------------------- faults from outside
FAULT = SCRIPTS / "fault_rank.py"
#: how long a test waits for ranks to reach a point or a launcher to end (a loaded 2-core machine is slow)
PATIENCE = SAFETY_NET_S


def _start_job(tmp_path: Path, nodes: int, ranks: int, hang_timeout: float,
               extra_env: dict[str, str] | None = None) -> tuple[list[subprocess.Popen], Path]:
    """``nodes`` launchers of fault_rank.py (``ranks`` in all), on one host; their stderr goes to files."""
    out = tmp_path / "out"
    out.mkdir(parents=True, exist_ok=True)
    env = {**_env(out), **(extra_env or {})}
    common = ["--cpu", "--num_processes", str(ranks), "--hang_timeout", str(hang_timeout)]
    if nodes > 1:
        common += ["--num_machines", str(nodes), "--main_process_ip", "127.0.0.1", "--main_process_port", free_port()]
    launchers = []
    for node in range(nodes):
        where = ["--machine_rank", str(node)] if nodes > 1 else []
        err = open(tmp_path / f"stderr-{node}", "w")
        launchers.append(subprocess.Popen(
            [sys.executable, "-m", "accel.commands.cli", "launch", *common, *where, str(FAULT)],
            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err))
        err.close()
    return launchers, out


def _wait_ready(launchers: list[subprocess.Popen], out: Path, ranks: int) -> list[int]:
    """Wait until every rank wrote ``ready-RANK`` (it trained a few steps); the ranks' pids, by rank."""
    deadline = time.monotonic() + PATIENCE
    while len(list(out.glob("ready-*"))) < ranks:
        assert time.monotonic() < deadline, "the ranks never got ready"
        assert all(p.poll() is None for p in launchers), "a launcher ended before its ranks were ready"
        time.sleep(0.1)
    pids = {int(p.name.split("-")[1]): int(p.read_text()) for p in out.glob("pid-*")}
    return [pids[r] for r in range(ranks)]


def _finish(launchers: list[subprocess.Popen], tmp_path: Path, pids: list[int]) -> list[tuple[int, str, float]]:
    """(exit code, stderr, seconds taken) of each launcher; afterwards no rank may be left running."""
    started = time.monotonic()
    results = []
    try:
        for node, launcher in enumerate(launchers):
            code = launcher.wait(timeout=PATIENCE)
            results.append((code, (tmp_path / f"stderr-{node}").read_text(), time.monotonic() - started))
        assert _wait_gone(pids, SAFETY_NET_S) == [], "ranks left running"
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
        for pid in pids:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
    return results


def _headline(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("accel launch: rank ")]
    assert lines, err[-4000:]
    return lines[0]


def _rank_section(err: str, rank: int) -> str:
    return err.split(f"--- rank {rank} ")[1].split("--- rank ")[0]


# two-nodes: one rank per node (the victim's node has no peer of its own; one-node has that race), so the peer
# that fails first is on the other node and only the evidence the launchers swap names the killed rank
@pytest.mark.parametrize("nodes, ranks, victim", [(1, 2, 1), (2, 2, 1)], ids=["one-node", "two-nodes"])
def test_a_rank_killed_by_a_signal_is_named_first(tmp_path, nodes, ranks, victim):
    """SIGKILL (what the out-of-memory killer sends) to one rank: its peers then fail with "connection reset",
    and may even record their failure before the launcher's agent notices the dead rank; the killed rank
    is named, on every node, with exit status 128 + 9."""
    launchers, out = _start_job(tmp_path, nodes, ranks, hang_timeout=120)
    pids = []
    try:
        pids = _wait_ready(launchers, out, ranks)
        os.kill(pids[victim], signal.SIGKILL)
    finally:
        results = _finish(launchers, tmp_path, pids)
    for code, err, _ in results:
        headline = _headline(err)
        assert headline.startswith(f"accel launch: rank {victim} ") and "failed with signal 9 (SIGKILL)" in headline, err[-4000:]
        assert f"rank {victim} was killed by SIGKILL before any other rank reported an error" in err
        assert code == 128 + signal.SIGKILL, err[-4000:]
    if nodes > 1:
        assert "(node 1, local rank 0," in _headline(results[0][1])  # node 0 names the rank of node 1


# slow (nightly): test_the_watchdog_names_another_nodes_failed_rank_over_a_hang[peer-failure-declared] covers the
# quiet node's watchdog, test_node_exchange_swaps_evidence_and_a_silent_node_costs_a_bounded_wait the store between
# nodes, and test_a_rank_killed_by_a_signal_is_named_first[two-nodes] the same fault across two real launchers
@pytest.mark.slow
def test_a_node_whose_ranks_miss_a_peers_death_ends_and_names_it(tmp_path):
    """gloo can leave one node's ranks waiting without an error after a rank on another node was killed;
    here node 0's ranks sleep outside any collective, so they never notice. Node 1's launcher declares
    the failure, and node 0's watchdog ends its ranks after 5 s without progress and names the killed
    rank with its exit status, long before the hour-long hang timeout."""
    launchers, out = _start_job(tmp_path, 2, 4, hang_timeout=3600, extra_env={"ACCEL_TEST_QUIET_NODE": "0"})
    pids = []
    try:
        pids = _wait_ready(launchers, out, 4)
        os.kill(pids[3], signal.SIGKILL)
    finally:
        results = _finish(launchers, tmp_path, pids)
    for code, err, _ in results:
        headline = _headline(err)
        assert headline.startswith("accel launch: rank 3 (node 1, local rank 1,") and "failed with signal 9 (SIGKILL)" in headline, err[-4000:]
        assert code == 128 + signal.SIGKILL, err[-4000:]
    assert "this node's ranks (0, 1) had made no progress for" in results[0][1], results[0][1][-4000:]


# two-nodes is slow (nightly): one-node covers the stopped rank's verdict and stacks, the watchdog's plain-hang and
# own-timeout-peer-failed cases the hang declared to another node, test_node_exchange_swaps_evidence... the swap
@pytest.mark.parametrize("nodes, ranks, victim", [(1, 2, 0), pytest.param(2, 4, 3, marks=SLOW)],
                         ids=["one-node", "two-nodes"])
def test_a_stopped_rank_is_named_hung_and_its_peers_wait_in_a_collective(tmp_path, nodes, ranks, victim):
    """SIGSTOP to one rank (a driver call that never returns looks the same): its peers block in DDP's
    allreduce inside ``backward``; the stopped rank cannot answer the stack request. Every node names
    it as stopped -- not as exited -- and shows the peers waiting in a collective; the job ends with 124."""
    launchers, out = _start_job(tmp_path, nodes, ranks, hang_timeout=HANG_TIMEOUT + 4)
    pids = []
    try:
        pids = _wait_ready(launchers, out, ranks)
        os.kill(pids[victim], signal.SIGSTOP)
    finally:
        results = _finish(launchers, tmp_path, pids)
    for code, err, _ in results:
        headline = _headline(err)
        assert headline.startswith(f"accel launch: rank {victim} ") and "hung: it is stopped (SIGSTOP?)" in headline, err[-4000:]
        assert code == HANG_EXIT_CODE, err[-4000:]
        stopped = _rank_section(err, victim)
        assert "stopped (SIGSTOP?)" in stopped.splitlines()[0] and "did not answer" in stopped and "exited" not in stopped
        for peer in set(range(ranks)) - {victim}:
            section = _rank_section(err, peer)
            assert "waiting in a collective" in section.splitlines()[0], section
            assert "in backward" in section  # blocked in the gradient allreduce of DDP
    if nodes > 1:
        assert _headline(results[0][1]) == _headline(results[1][1])


def test_the_folder_of_a_killed_launcher_is_removed_by_the_next_start(tmp_path):
    """A SIGKILLed launcher cannot clean up, but its ranks die with it; its folder carries an owner file,
    and the next launch removes it."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    env = dict(_env(out), TMPDIR=str(temp))
    launcher = subprocess.Popen(_command(str(SCRIPTS / "sleep_rank.py")), env=env, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + PATIENCE
        while len(_pids(out)) < 2:
            assert time.monotonic() < deadline and launcher.poll() is None, "the ranks did not start"
            time.sleep(0.1)
        assert all(_running(p) for p in _pids(out))
        launcher.kill()
        launcher.wait(timeout=SAFETY_NET_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    running = _wait_gone(_pids(out), SAFETY_NET_S)
    for pid in running:
        os.kill(pid, signal.SIGKILL)
    assert running == [], "ranks still running after the launcher was SIGKILLed"
    left = list(temp.glob(D.RUN_DIR_PREFIX + "*"))
    assert len(left) == 1 and (left[0] / D.OWNER_FILE).is_file()
    live = Path(D.make_run_dir())  # a folder of a launcher that is still running (this process) stays
    try:
        done = subprocess.run(_command(str(SCRIPTS / "report_rank.py")), capture_output=True, text=True,
                              timeout=PATIENCE, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert not left[0].exists()
        assert live.is_dir()
        assert list(temp.glob(D.RUN_DIR_PREFIX + "*")) == []  # the second launch removed its own folder too
    finally:
        import shutil

        shutil.rmtree(live, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- the rules
def _ev(rank: int, **kw) -> D.RankEvidence:
    return D.RankEvidence(rank=rank, node=kw.pop("node", 0), **kw)


def test_blame_failure_goes_by_evidence():
    # rank 1 raised first (it recorded it), rank 0's collective broke later, though rank 0 exited first
    assert D.blame_failure([_ev(0, exitcode=1, failed_at=20.0, agent_time=20.0),
                            _ev(1, exitcode=-15, signal="SIGTERM", failed_at=10.0, last_alive=21.0)]).rank == 1
    # rank 3 was SIGKILLed: no record of its own, but the launcher saw it running last at 9.9, before any
    # peer recorded its failure; the agent's later stop of rank 2 (SIGTERM, no record) comes last
    killed = [_ev(0, exitcode=1, failed_at=10.0), _ev(1, exitcode=1, failed_at=10.01),
              _ev(2, exitcode=-15, signal="SIGTERM", last_alive=9.0, node=1),
              _ev(3, exitcode=-9, signal="SIGKILL", last_alive=9.9, node=1)]
    assert D.blame_failure(killed).rank == 3
    assert D.blame_failure(killed[:3]).rank == 0  # without rank 3: the first record
    # a rank that exited without raising (os._exit) before any peer failed
    assert D.blame_failure([_ev(0, exitcode=1, failed_at=5.0), _ev(1, exitcode=3, last_alive=4.0)]).rank == 1
    with pytest.raises(ValueError):
        D.blame_failure([])


def test_blame_failure_across_hosts_allows_for_clock_skew():
    # node 0's clock runs 0.1 s behind node 1's: its peer's record looks earlier than the killed rank's last sight
    skewed = [_ev(0, exitcode=1, failed_at=10.0), _ev(3, node=1, exitcode=-9, signal="SIGKILL", last_alive=10.1)]
    assert D.blame_failure(skewed).rank == 3
    # a failure recorded well before (more than the margin) is still the first, even against a killed rank
    earlier = [_ev(0, exitcode=1, failed_at=10.1 - D.CLOCK_SKEW_MARGIN - 0.5), skewed[1]]
    assert D.blame_failure(earlier).rank == 0
    # on one node there is one clock: no margin
    assert D.blame_failure([_ev(0, exitcode=1, failed_at=10.0), _ev(1, exitcode=-9, signal="SIGKILL", last_alive=10.1)]).rank == 0


STOPPED_STACK = None
AUTOGRAD = ('Current thread 0x1 (most recent call first):\n  File "/v/torch/autograd/graph.py", line 9 in _engine_run_backward\n'
            '  File "/v/torch/_tensor.py", line 6 in backward\n  File "t.py", line 1 in <module>\n')
C10D = ('Current thread 0x1 (most recent call first):\n  File "/v/torch/distributed/distributed_c10d.py", line 9 in barrier\n'
        '  File "t.py", line 1 in <module>\n')
DDP_FORWARD = ('Current thread 0x1 (most recent call first):\n  File "/v/torch/nn/parallel/distributed.py", line 9 in _sync_buffers\n'
               '  File "t.py", line 1 in <module>\n')
BUSY = 'Thread 0x2 (most recent call first):\n  File "t.py", line 4 in stuck\n  File "t.py", line 1 in <module>\n'


def test_waiting_in_a_collective_includes_ddp_backward_and_c10d():
    for stack in (AUTOGRAD, C10D, DDP_FORWARD):
        assert D.waiting_in_collective(stack)
    assert not D.waiting_in_collective(BUSY) and not D.waiting_in_collective(None)


def test_blame_hang_names_a_silent_live_rank_then_the_one_behind():
    peers = [_ev(r, count=7, idle=6.0, state="S", answered=True, stack=AUTOGRAD) for r in (0, 1, 2)]
    stopped = _ev(3, node=1, count=7, idle=6.0, state="T", answered=False)
    rank, why = D.blame_hang([*peers, stopped])
    assert rank.rank == 3 and why.startswith("it is stopped (SIGSTOP?)")
    stuck = _ev(3, count=7, idle=6.0, state="D", answered=False)
    assert "uninterruptible" in D.blame_hang([*peers, stuck])[1]
    # a rank that exited is not "silent": the progress rule applies
    gone = _ev(3, count=2, idle=30.0, state=None, answered=False)
    rank, why = D.blame_hang([*peers, gone])
    assert rank.rank == 3 and "rank 3 is behind: 2 progress point(s)" in why
    # even counts: the rank outside a collective
    busy = _ev(2, count=7, idle=6.0, state="S", answered=True, stack=BUSY)
    assert D.blame_hang([*peers[:2], busy]).__getitem__(0).rank == 2
    assert D.describe_state("T") == "stopped (SIGSTOP?)" and D.describe_state(None) == "exited"
    assert D.describe_state("R") == "not responding"


def test_node_exchange_swaps_evidence_and_a_silent_node_costs_a_bounded_wait():
    port = int(free_port())
    # 5 s: a loaded 2-core host can take seconds to answer a store request; node 2's silence still costs 5 s only
    host = N.NodeExchange("127.0.0.1", port, node=0, nnodes=3, wait=5.0)
    host.open()
    other = N.NodeExchange("127.0.0.1", port, node=1, nnodes=3, wait=5.0)
    try:
        assert other.end_declared() is None
        host.declare_end("failure")
        assert other.end_declared() == "failure"
        other.declare_end("hang")
        assert host.end_declared() == "hang"  # both declared: the first of END_KINDS is named
        with pytest.raises(ValueError, match="unknown kind of end 'crash'"):
            host.declare_end("crash")
        import threading

        got: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: got.update(other=other.swap([_ev(3, node=1, exitcode=-9, signal="SIGKILL")])))
        worker.start()
        merged, missing = host.swap([_ev(0, exitcode=1, failed_at=1.0)])
        worker.join(timeout=SAFETY_NET_S)
        assert not worker.is_alive()
        assert sorted(e.rank for e in merged) == [0, 3] and missing == [2]  # node 2 never answers: both gave up on it
        other_merged, other_missing = got["other"]
        assert sorted(e.rank for e in other_merged) == [0, 3] and other_missing == [2]
        assert next(e for e in merged if e.rank == 3).signal == "SIGKILL"
    finally:
        host.close()


def test_orphaned_run_dirs_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    mine = Path(D.make_run_dir())
    assert mine.parent == tmp_path
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / (D.RUN_DIR_PREFIX + "orphan")
    orphan.mkdir()
    (orphan / D.OWNER_FILE).write_text(dead.stdout.strip())
    foreign = tmp_path / (D.RUN_DIR_PREFIX + "no_owner")  # no owner file: not ours to judge
    foreign.mkdir()
    assert D.remove_orphaned_run_dirs() == [str(orphan)]
    assert mine.is_dir() and foreign.is_dir() and not orphan.exists()


def test_a_hang_that_cannot_be_declared_is_named_not_swallowed():
    # no store serves this port: the declaration is retried until the wait has passed, then kept as the error
    exchange = N.NodeExchange("127.0.0.1", int(free_port()), node=1, nnodes=2, wait=1.5)
    started = time.monotonic()
    exchange.declare_end("hang")
    assert time.monotonic() - started >= 1.5  # tried until the wait had passed
    assert exchange.error and exchange.end_declared() is None
    def no_second_wait(timeout):
        raise AssertionError("the store is known to be out of reach: swap must not wait for it again")

    exchange._client = no_second_wait
    evidence = [_ev(2, node=1, exitcode=-9, signal="SIGKILL")]
    assert exchange.swap(evidence) == (evidence, [0])


class _FakeExchange:
    """Another node's launcher as the watchdog sees it: what it declared and the evidence it sends."""

    error = None

    def __init__(self, declared: str | None, theirs: list[D.RankEvidence]):
        self.declared, self.theirs, self.sent = declared, theirs, []

    def end_declared(self) -> str | None:
        return self.declared

    def declare_end(self, kind: str) -> None:
        self.sent.append(kind)

    def lost_nodes(self) -> dict:
        return {}

    def swap(self, mine):
        return [*mine, *self.theirs], []


KILLED_ON_NODE_1 = [_ev(3, node=1, pid=4242, local_rank=1, exitcode=-9, signal="SIGKILL", last_alive=100.0),
                    _ev(2, node=1, pid=4241, local_rank=0, exitcode=-15, signal="SIGTERM", last_alive=101.0)]


#: a rank as the watchdog sees one: it writes its stack to the file named in argv[1] on signal argv[2] (as
#: heartbeat.start registers it), so the watchdog's stack request is answered at once
_STACK_ON_SIGNAL = """
import faulthandler, sys, time
faulthandler.register(int(sys.argv[2]), file=open(sys.argv[1], "w"), all_threads=True, chain=False)
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("declared, theirs, code, sent", [
    ("failure", KILLED_ON_NODE_1, 128 + 9, []),  # node 1 failed while this node's ranks noticed nothing
    (None, KILLED_ON_NODE_1, 128 + 9, ["hang"]),  # this node timed out first; node 1's failure is in the store
    (None, [], HANG_EXIT_CODE, ["hang"]),  # a hang, with no failure anywhere
], ids=["peer-failure-declared", "own-timeout-peer-failed", "plain-hang"])
def test_the_watchdog_names_another_nodes_failed_rank_over_a_hang(tmp_path, monkeypatch, declared, theirs, code, sent):
    import accel.launch.watchdog as W

    monkeypatch.setattr(W, "PEER_END_IDLE", 0.2)
    rank = subprocess.Popen([sys.executable, "-c", _STACK_ON_SIGNAL, str(tmp_path / "stack-0.txt"), str(heartbeat.STACK_SIGNAL)],
                            stdout=subprocess.PIPE, text=True)  # this node's rank 0
    try:
        assert rank.stdout.readline() == "ready\n"  # it answers the watchdog's stack request from now on
        record = heartbeat._RECORD
        (tmp_path / "rank-0.hb").write_bytes(record.pack(rank.pid, 5, 0, 0))
        exchange = _FakeExchange(declared, theirs)
        watchdog = W.HangWatchdog(str(tmp_path), timeout=60 if declared else 1.0, poll=0.05, exchange=exchange,
                                  node=0, nnodes=2)
        monkeypatch.setattr(watchdog, "_stop_agent", lambda: None)  # the agent is this pytest process
        watchdog.start()
        watchdog._thread.join(timeout=PATIENCE)
        assert watchdog.report is not None and not watchdog._thread.is_alive()
        assert rank.wait(timeout=PATIENCE) != 0  # the local rank was ended
    finally:
        if rank.poll() is None:
            rank.kill()
        rank.wait()
        rank.stdout.close()
    assert watchdog.exit_code == code and exchange.sent == sent
    headline = watchdog.report.splitlines()[0]
    if theirs:
        assert headline.startswith("accel launch: rank 3 (node 1, local rank 1, pid 4242) failed with signal 9 (SIGKILL)"), watchdog.report
        assert "rank 3 was killed by SIGKILL before any other rank reported an error" in watchdog.report
        assert "this node's ranks (0) had made no progress" in watchdog.report
    else:
        assert headline.startswith("accel launch: rank 0 (node 0, pid ") and " hung: " in headline, watchdog.report
        assert "in <module>" in watchdog.report  # the rank's own stack, as it answered the request
