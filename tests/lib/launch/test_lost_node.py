"""`accel launch` on two simulated nodes (two launchers on 127.0.0.1) when a whole node is lost or the
rendezvous port is taken: the surviving launcher names the lost node and its ranks, and a port held by
another program stops every node before any rank starts.

The launches run with ``ACCEL_LAUNCH_NODE_TIMEOUT=3`` (a node silent for 3 s counts as lost; 10 s by
default) so the verdicts come quickly; the tests assert verdicts and exit codes and wait for files and
exits, never for a fixed time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accel.launch import nodes as N
from accel.launch import heartbeat
from _waits import SAFETY_NET_S
from dist_utils import free_port
from tests.lib.launch.test_faults import _STACK_ON_SIGNAL, _env, _FakeExchange, _finish, _wait_ready

FAULT = Path(__file__).resolve().parents[2] / "scripts" / "fault_rank.py"
NODE_TIMEOUT = "3"


def _two_nodes(tmp_path: Path, port: str, ranks: int = 2) -> tuple[list[subprocess.Popen], Path]:
    """Two launchers of fault_rank.py (``ranks`` in all) meeting at 127.0.0.1:``port``; stderr goes to files."""
    out = tmp_path / "out"
    out.mkdir(parents=True, exist_ok=True)
    env = {**_env(out), N.NODE_TIMEOUT_ENV: NODE_TIMEOUT}
    common = ["--cpu", "--num_processes", str(ranks), "--hang_timeout", "120", "--num_machines", "2",
              "--main_process_ip", "127.0.0.1", "--main_process_port", port]
    launchers = []
    for node in range(2):
        with open(tmp_path / f"stderr-{node}", "w") as err:
            launchers.append(subprocess.Popen(
                [sys.executable, "-m", "accel.commands.cli", "launch", *common, "--machine_rank", str(node), str(FAULT)],
                env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err))
    return launchers, out


def _summary(err: str) -> list[str]:
    """The launcher's own verdict: its ``accel launch:`` lines from the first one on."""
    lines = err.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("accel launch: ")), len(lines))
    return lines[first:]


@pytest.mark.parametrize("lost", [1, 0], ids=["node-1-lost", "node-0-lost"])
def test_a_node_whose_launcher_is_killed_is_named_by_the_other(tmp_path, lost):
    """SIGKILL to one node's launcher: its rank dies with it, the other node's rank fails in its collective.
    The surviving launcher names the lost node, its host and its rank -- not a rank of its own -- and exits
    with LOST_EXIT_CODE; node 1 does so without torch's C++ frames (node 0 took its store with it)."""
    launchers, out = _two_nodes(tmp_path, free_port())
    survivor = 1 - lost
    pids = []
    try:
        pids = _wait_ready(launchers, out, 2)
        launchers[lost].kill()
    finally:
        results = _finish(launchers, tmp_path, pids)
    code, err, _ = results[survivor]
    summary = _summary(err)
    assert summary and summary[0] == f"accel launch: node {lost} (host 127.0.0.1) stopped answering; its rank {lost} is lost", err[-4000:]
    assert code == N.LOST_EXIT_CODE, err[-4000:]
    assert f"this node's ranks failed after that: rank {survivor} " in err or f"this node's ranks ({survivor})" in err, err[-4000:]
    assert not any("frame #" in line for line in summary), err[-4000:]
    assert results[lost][0] == -signal.SIGKILL


def test_a_taken_rendezvous_port_stops_every_node_before_its_ranks_start(tmp_path):
    """Another program listens on the rendezvous port: node 0 finds the port taken, node 1 finds that what
    answers there is not node 0's store; each prints one line naming the port and exits 2, and no rank starts."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(8)  # accepts connections into its backlog and never answers: as a hung program would
        port = str(holder.getsockname()[1])
        launchers, out = _two_nodes(tmp_path, port)
        results = _finish(launchers, tmp_path, [])
    for node, (code, err, _) in enumerate(results):
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (node, err[-4000:])
        assert lines[0].startswith(f"accel launch: error: port {port} "), lines
        assert "choose another --main_process_port on every node" in lines[0], lines
    assert "is in use on this host" in results[0][1]
    assert "not as node 0's accel launch store" in results[1][1]
    assert not list(out.glob("pid-*"))  # no rank was started


# ---------------------------------------------------------------------------------------------- the channel itself
def _wait_for(condition, what: str) -> None:
    """Poll ``condition`` until it holds (the safety net only ends a run that would hang)."""
    deadline = time.monotonic() + SAFETY_NET_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def _silence(exchange: N.NodeExchange) -> None:
    """Stop a launcher's pulse without a word, as a SIGKILL leaves it (node 0's store goes with it)."""
    exchange._stop.set()
    exchange._thread.join()
    exchange._server = exchange._store = None


def test_the_exchange_finds_a_silent_node_lost_and_a_finished_one_not():
    port = int(free_port())
    host = N.NodeExchange("127.0.0.1", port, node=0, nnodes=3, silence=0.5, nproc_per_node=2)
    host.open()
    one = N.NodeExchange("127.0.0.1", port, node=1, nnodes=3, silence=0.5, nproc_per_node=2)
    two = N.NodeExchange("127.0.0.1", port, node=2, nnodes=3, silence=0.5, nproc_per_node=2)
    try:
        one.open()  # the handshake: node 0's mark is there
        two.open()
        _wait_for(lambda: {1, 2} <= set(host._pulses), "node 0 saw both nodes pulse")
        two.close()  # a node that ended its launch says so: it is never lost
        _wait_for(lambda: 2 in host._done, "node 0 saw node 2 end")
        _silence(one)
        _wait_for(lambda: 1 in host.lost_nodes(), "node 0 found node 1 lost")
        lost = host.lost_nodes()
        assert set(lost) == {1} and lost[1].ranks == [2, 3] and lost[1].host == "127.0.0.1"
        assert lost[1].headline() == "accel launch: node 1 (host 127.0.0.1) stopped answering; its ranks 2\u20133 are lost"
        assert host.end_declared() == "lost"
        assert host.swap([]) == ([], [1, 2])  # no wait for evidence that cannot come
    finally:
        host.close()


def test_node_0s_store_going_away_makes_node_0_lost_at_once():
    port = int(free_port())
    host = N.NodeExchange("127.0.0.1", port, node=0, nnodes=2, silence=5.0)
    host.open()
    one = N.NodeExchange("127.0.0.1", port, node=1, nnodes=2, silence=5.0)
    try:
        one.open()
        _wait_for(lambda: 0 in one._pulses, "node 1 pulsed through the store")
        _silence(host)
        one.declare_end("failure")  # nobody left to tell: no retries until the 30 s wait has passed
        assert one.error is None and set(one.lost) == {0}
        assert one.lost[0].why == f"its rendezvous store at 127.0.0.1:{port} refused the connection"
        assert one.swap([]) == ([], [0])
    finally:
        one.close()


class _LostPeer(_FakeExchange):
    """Another node's launcher that stopped answering, as the watchdog's exchange reports it."""

    def __init__(self):
        super().__init__("lost", [])

    def swap(self, mine):
        return list(mine), [1]

    def lost_nodes(self) -> dict:
        return {1: N.LostNode(1, "10.0.0.2", [2, 3], "its launcher has not pulsed for 10 s", last_seen=100.0)}


def test_the_watchdog_ends_ranks_that_wait_for_a_lost_node(tmp_path, monkeypatch):
    """This node's rank waits without an error (gloo may never notice the other node's death); once it has
    been idle a while and the exchange finds node 1 lost, the watchdog ends it and names the lost node."""
    import accel.launch.watchdog as W

    monkeypatch.setattr(W, "PEER_END_IDLE", 0.2)
    rank = subprocess.Popen([sys.executable, "-c", _STACK_ON_SIGNAL, str(tmp_path / "stack-0.txt"), str(heartbeat.STACK_SIGNAL)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout.readline() == "ready\n"
        (tmp_path / "rank-0.hb").write_bytes(heartbeat._RECORD.pack(rank.pid, 5, 0, 0))
        exchange = _LostPeer()
        watchdog = W.HangWatchdog(str(tmp_path), timeout=3600, poll=0.05, exchange=exchange, node=0, nnodes=2)
        monkeypatch.setattr(watchdog, "_stop_agent", lambda: None)  # the agent is this pytest process
        watchdog.start()
        watchdog._thread.join(timeout=SAFETY_NET_S)
        assert watchdog.report is not None and not watchdog._thread.is_alive()
        assert rank.wait(timeout=SAFETY_NET_S) != 0  # the local rank was ended
    finally:
        if rank.poll() is None:
            rank.kill()
        rank.wait()
        rank.stdout.close()
    lines = watchdog.report.splitlines()
    assert lines[0] == "accel launch: node 1 (host 10.0.0.2) stopped answering; its ranks 2\u20133 are lost", watchdog.report
    assert watchdog.exit_code == N.LOST_EXIT_CODE and exchange.sent == ["hang"]
    assert lines[-1].startswith("accel launch: this node's ranks (0) had made no progress for "), watchdog.report


def test_node_timeout_and_rank_spans(monkeypatch):
    monkeypatch.delenv(N.NODE_TIMEOUT_ENV, raising=False)
    assert N.node_timeout() == N.DEFAULT_NODE_TIMEOUT
    monkeypatch.setenv(N.NODE_TIMEOUT_ENV, "2.5")
    assert N.node_timeout() == 2.5
    for bad in ("soon", "0"):
        monkeypatch.setenv(N.NODE_TIMEOUT_ENV, bad)
        with pytest.raises(N.NodeSetupError, match=N.NODE_TIMEOUT_ENV):
            N.node_timeout()
    assert N.rank_span([3, 2]) == "ranks 2\u20133" and N.rank_span([4]) == "rank 4" and N.rank_span([1, 4]) == "ranks 1, 4"


def test_a_lost_node_is_blamed_unless_a_rank_failed_while_it_still_answered():
    from accel.launch.diagnosis import RankEvidence
    from accel.launch.report import failure_verdict

    lost = {1: N.LostNode(1, "10.0.0.2", [2, 3], "its launcher has not pulsed for 10 s", last_seen=100.0)}
    after = [RankEvidence(rank=0, node=0, exitcode=1, failed_at=101.0), RankEvidence(rank=1, node=0, exitcode=1, failed_at=101.2)]
    text, code = failure_verdict(after, node=0, nnodes=2, missing=[1], lost=lost)
    assert code == N.LOST_EXIT_CODE
    assert text.splitlines()[0] == "accel launch: node 1 (host 10.0.0.2) stopped answering; its ranks 2\u20133 are lost"
    assert "rank 0 (exit code 1), rank 1 (exit code 1)" in text and "no evidence from node(s)" not in text
    before = [RankEvidence(rank=0, node=0, exitcode=3, failed_at=90.0)]
    text, code = failure_verdict(before, node=0, nnodes=2, missing=[1], lost=lost)
    assert code == 3 and text.startswith("accel launch: rank 0 (node 0, ")
    assert "then node 1 (host 10.0.0.2) stopped answering" in text
