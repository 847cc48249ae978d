"""The hang watchdog of `accel launch`: a thread in the launcher that ends the job when no rank has made
progress for ``--hang_timeout`` seconds, with every rank's state and Python stack and the rank to blame
(:func:`accel.launch.diagnosis.blame_hang`, over every node's evidence when the nodes swap it)."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from . import diagnosis
from .report import failure_verdict, lost_verdict
from accel.launch import heartbeat

__all__ = ["HANG_EXIT_CODE", "HangWatchdog", "hang_report"]

#: exit status of a launch ended by the hang watchdog (as `timeout` exits)
HANG_EXIT_CODE = 124
#: seconds without progress after which the watchdog asks whether another node's launcher ended the job
#: (a rank there failed, or its watchdog declared a hang): a job whose steps take less never asks
PEER_END_IDLE = 5.0


class HangWatchdog:
    """A thread in the launcher that ends the job when no rank has made progress for ``timeout`` seconds.

    Progress is each rank's heartbeat (:mod:`accel.launch.heartbeat`); the watch starts once a rank has
    passed its first progress point, so a script that never steps or calls an accel collective is never
    ended. On a hang: every rank is asked for its Python stack (``faulthandler`` on the heartbeat's
    signal), each rank's state is read from the OS, the evidence is swapped with the other nodes'
    launchers (``exchange``, which also tells them to end), the rank to blame is chosen by
    :func:`accel.launch.diagnosis.blame_hang`, every local rank is killed, and ``report`` holds
    the text ``accel launch`` prints before exiting with ``exit_code`` (:data:`HANG_EXIT_CODE`).

    Another node's launcher may end the job first: its watchdog declared a hang, or one of its ranks failed
    while this node's ranks wait in a collective without noticing (gloo can miss a peer's death). This node
    then ends too; when the swapped evidence holds failed ranks, the report names the one to blame and the
    exit code is that rank's, as on the failing node. A node whose launcher stopped answering (``exchange``
    finds it lost) ends the job the same way, and the report names that node.
    """

    def __init__(self, run_dir: str, timeout: float, poll: float | None = None, exchange: Any = None,
                 node: int = 0, nnodes: int = 1):
        self.run_dir = run_dir
        self.timeout = float(timeout)
        self.poll = poll if poll is not None else min(1.0, max(self.timeout / 20, 0.05))
        self.exchange = exchange
        self.node, self.nnodes = node, nnodes
        self.report: str | None = None
        self.exit_code = HANG_EXIT_CODE
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="accel-hang-watchdog", daemon=True)

    def start(self) -> None:
        """Start watching (nothing with a timeout of 0)."""
        if self.timeout > 0:
            self._thread.start()

    def stop(self) -> None:
        """Stop watching; waits for the thread unless called from it."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _watch(self) -> None:
        import time

        seen: dict[int, tuple[int, int, int, float]] = {}  # rank -> (pid, count, busy, when first seen)
        next_ask = 0.0
        while not self._stop.wait(self.poll):
            now = time.monotonic()
            beats = heartbeat.read(self.run_dir)
            for rank, b in beats.items():
                old = seen.get(rank)
                if old is None or old[:3] != (b.pid, b.count, b.busy):
                    seen[rank] = (b.pid, b.count, b.busy, now)
                b.last = seen[rank][3]
            if not any(b.count > 0 for b in beats.values()) or any(heartbeat.read_failure(self.run_dir, r) for r in beats):
                continue  # not armed yet, or a rank failed: the agent's failure report takes over
            idle = now - max(b.last for b in beats.values())
            declared = None
            # another node's launcher may have ended its job; this node's ranks then wait for its ranks in a
            # collective, so the store is asked only once they have been idle a while
            if self.exchange is not None and idle >= min(self.timeout / 2, PEER_END_IDLE) and now >= next_ask:
                next_ask = now + 1.0
                declared = self.exchange.end_declared()
            if idle >= self.timeout or declared:
                self.report, self.exit_code = self._end(beats, idle, declared)
                self._stop_agent()
                return

    def _end(self, beats: dict[int, heartbeat.Beat], idle: float, declared: str | None) -> tuple[str, int]:
        """Collect the evidence, swap it, kill the local ranks; returns (report, exit code)."""
        import signal
        import time

        if self.exchange is not None and declared in (None, "lost"):
            self.exchange.declare_end("hang")
        alive = {rank: b for rank, b in beats.items() if _is_our_rank(b.pid)}
        for b in alive.values():
            with contextlib.suppress(OSError):
                os.kill(b.pid, heartbeat.STACK_SIGNAL)
        stacks = _collect_stacks(self.run_dir, list(alive), deadline=time.monotonic() + 3.0)
        now = time.monotonic()
        evidence = []
        for rank, b in sorted(beats.items()):
            state = diagnosis.proc_state(b.pid) if rank in alive else None
            stack = (stacks.get(rank) or "")[:diagnosis.STACK_CHARS] or None
            evidence.append(diagnosis.RankEvidence(
                rank=rank, node=self.node, pid=b.pid, count=b.count, idle=now - b.last, state=state,
                answered=stack is not None, stack=stack))
        missing: list[int] = []
        if self.exchange is not None:
            evidence, missing = self.exchange.swap(evidence)
        unreachable = self.exchange.error if self.exchange is not None else None
        lost = {n: l for n, l in self.exchange.lost_nodes().items() if n in missing} if self.exchange is not None else {}
        # ranks that failed on another node (exit status known) outweigh a hang: they are why this node waited;
        # a lost node outweighs both, unless a rank failed while it still answered
        failed = [e for e in evidence if e.exitcode is not None]
        if lost and not failed:
            report, code = lost_verdict(lost, evidence, self.node, idle=idle)
        elif failed:
            report, code = failure_verdict(failed, node=self.node, nnodes=self.nnodes, missing=missing,
                                           unreachable=unreachable, lost=lost)
            report += (f"\naccel launch: this node's ranks ({', '.join(str(r) for r in sorted(beats))}) had made no progress "
                       f"for {idle:.0f} s and were ended after that failure")
        else:
            report, code = hang_report(evidence, idle, self.timeout, nnodes=self.nnodes, missing=missing), HANG_EXIT_CODE
            if unreachable:
                report += f"\naccel launch: the other nodes' launchers could not be reached: {unreachable}"
        for b in alive.values():
            with contextlib.suppress(OSError):
                os.kill(b.pid, signal.SIGKILL)
        return report, code

    def _stop_agent(self) -> None:
        """Stop the elastic agent as SIGTERM does, so it restarts nothing (--max_restarts) and returns."""
        import signal

        with contextlib.suppress(OSError):
            os.kill(os.getpid(), signal.SIGTERM)


def _is_our_rank(pid: int) -> bool:
    """Whether ``pid`` is alive and a child of this launcher (a stale heartbeat's pid may be reused)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return fields[0] != "Z" and int(fields[1]) == os.getpid()
    except (OSError, IndexError, ValueError):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _collect_stacks(run_dir: str, ranks: list[int], deadline: float) -> dict[int, str]:
    """Each rank's stack file once it has stopped growing (faulthandler writes it from a signal handler);
    a rank that wrote nothing by ``deadline`` (stopped, stuck in the kernel) has no entry."""
    import time

    from pathlib import Path

    sizes: dict[int, int] = {}
    while True:
        now = {r: (Path(run_dir) / f"stack-{r}.txt").stat().st_size if (Path(run_dir) / f"stack-{r}.txt").exists() else 0
               for r in ranks}
        if all(now[r] > 0 and now[r] == sizes.get(r) for r in ranks) or time.monotonic() > deadline:
            break
        sizes = now
        time.sleep(0.1)
    stacks = {}
    for r in ranks:
        with contextlib.suppress(OSError):
            text = (Path(run_dir) / f"stack-{r}.txt").read_text(errors="replace")
            if text.strip():
                stacks[r] = text
    return stacks


def hang_report(evidence: list[Any], idle: float, timeout: float, nnodes: int = 1, missing: list[int] | None = None) -> str:
    """What `accel launch` prints for a hang: the blamed rank and why, then every rank's state and Python stack
    (the same text on every node when the evidence was swapped)."""
    culprit, why = diagnosis.blame_hang(evidence)
    where = f"node {culprit.node}, " if nnodes > 1 else ""
    lines = [f"accel launch: rank {culprit.rank} ({where}pid {culprit.pid}) hung: {why}; no rank made progress for "
             f"{idle:.0f} s (--hang_timeout {timeout:g}); the job was ended"]
    if missing:
        lines.append(f"accel launch: no evidence from node(s) {', '.join(map(str, missing))} within "
                     f"{diagnosis.EVIDENCE_WAIT:g} s: the verdict weighs this node's ranks only")
    if culprit.in_collective and (missing or nnodes > 1 and len({e.node for e in evidence}) < nnodes):
        lines.append(f"accel launch: rank {culprit.rank} is itself blocked in a collective: a peer on another machine may be the cause")
    for e in sorted(evidence, key=lambda e: e.rank):
        if e.answered:
            state = "waiting in a collective" if e.in_collective else "not in a collective"
        elif e.alive:
            state = diagnosis.describe_state(e.state)
        else:
            state = "exited"
        node = f"node {e.node}, " if nnodes > 1 else ""
        lines.append(f"accel launch: --- rank {e.rank} ({node}pid {e.pid}, {e.count} progress points, {state}) Python stack:")
        if e.stack:
            lines += [f"  {line}" for line in e.stack.rstrip().splitlines()]
        elif e.alive:
            lines.append(f"  (no stack: the rank is {diagnosis.describe_state(e.state)} and did not answer)")
        else:
            lines.append("  (no stack: the rank had already exited)")
    return "\n".join(lines)
