"""What `accel launch` prints when ranks fail: the evidence on each failed rank of this node, the rank to
blame (:func:`accel.launch.diagnosis.blame_failure`, over every node's evidence when the
nodes swap it) with the end of its traceback, and the exit code of the launch."""

from __future__ import annotations

from typing import Any

from . import diagnosis
from .bootstrap import BOOTSTRAP_FILE, RUNPY_FILE
from accel.launch import heartbeat

__all__ = ["TRACEBACK_LINES", "clean_traceback", "exit_code", "failure_evidence", "failure_report", "failure_verdict",
           "lost_verdict"]

#: traceback lines shown for the failing rank
TRACEBACK_LINES = 15


def exit_code(exitcode: int) -> int:
    """A rank's exit status as the launch's exit code: a death by signal N is 128 + N, as shells report it."""
    if exitcode > 0:
        return exitcode
    if exitcode < 0:
        return 128 + (-exitcode)  # killed by a signal: the shell's convention
    return 1


def _error_details(failure: Any) -> tuple[str | None, str | None]:
    """(one-line message, traceback) from the rank's error file, when it wrote one."""
    data = getattr(failure, "error_file_data", None) or {}
    message = data.get("message")
    if isinstance(message, dict):
        extra = message.get("extraInfo") or {}
        return message.get("message"), extra.get("py_callstack")
    if isinstance(message, str) and message and message != "<NONE>":  # torch's "no error file" marker
        return message, None
    return None, None


def _is_bootstrap_frame(line: str) -> bool:
    text = line.strip()
    return text.startswith("File ") and (
        f'"{BOOTSTRAP_FILE}"' in text or '"<frozen runpy>"' in text or f'"{RUNPY_FILE}"' in text
    )


def clean_traceback(callstack: str) -> list[str]:
    """The lines of a formatted traceback without the bootstrap's and runpy's frames."""
    out: list[str] = []
    lines = callstack.rstrip().splitlines()
    i = 0
    while i < len(lines):
        if _is_bootstrap_frame(lines[i]):
            indent = len(lines[i]) - len(lines[i].lstrip())
            i += 1
            while i < len(lines) and len(lines[i]) - len(lines[i].lstrip()) > indent:  # its source lines
                i += 1
            continue
        out.append(lines[i])
        i += 1
    return out


def failure_evidence(failures: dict[int, Any], run_dir: str | None = None, watch: Any = None, node: int = 0) -> list[Any]:
    """Evidence on each failed rank of this node (see :mod:`accel.launch.diagnosis`): its exit
    status, the moment it recorded its failure (converted to wall-clock time), when the launcher last saw
    it running, and the end of its traceback."""
    import time

    to_wall = time.time() - time.monotonic()  # CLOCK_MONOTONIC is one clock for every process of this machine
    evidence = []
    for rank, f in failures.items():
        recorded = heartbeat.read_failure(run_dir, rank) if run_dir else None
        last_alive, died_at = watch.seen(rank) if watch is not None else (None, None)
        message, callstack = _error_details(f)
        evidence.append(diagnosis.RankEvidence(
            rank=rank, node=node, pid=f.pid, local_rank=f.local_rank, exitcode=f.exitcode,
            signal=diagnosis.signal_name(f.exitcode), failed_at=recorded / 1e9 + to_wall if recorded is not None else None,
            last_alive=last_alive, died_at=died_at, agent_time=float(f.timestamp or 0) or None, message=message,
            traceback=clean_traceback(callstack)[-TRACEBACK_LINES:] if callstack else []))
    return evidence


def failure_report(err: Any, debug: bool = False, run_dir: str | None = None, watch: Any = None, exchange: Any = None,
                   node: int = 0, nnodes: int = 1) -> tuple[str, int]:
    """A short summary of a ChildFailedError: the rank to blame, its exit code and the end of its traceback;
    returns (text, exit code for `accel launch`). ``run_dir``: where ranks recorded when they failed;
    ``watch``: the launcher's own observation of the ranks' processes; ``exchange``: tells the other nodes'
    launchers that this job failed and swaps the evidence with them, so every node names the same rank."""
    failures: dict[int, Any] = dict(err.failures)
    if not failures:
        return f"accel launch: {err}", 1
    evidence = failure_evidence(failures, run_dir, watch, node)
    missing: list[int] = []
    if exchange is not None:
        exchange.declare_end("failure")  # a node whose ranks see no error (a peer's death unnoticed) ends too
        evidence, missing = exchange.swap(evidence)
        # a node that ended as hung sends ranks without an exit status: they are not failures to weigh
        evidence = [e for e in evidence if e.exitcode is not None]
    lost = {n: l for n, l in exchange.lost_nodes().items() if n in missing} if exchange is not None else {}
    text, code = failure_verdict(evidence, node=node, nnodes=nnodes, missing=missing,
                                 unreachable=exchange.error if exchange is not None else None, lost=lost)
    if debug:
        text += "\n" + (err.format_msg() if hasattr(err, "format_msg") else str(err))
    return text, code


def failure_verdict(evidence: list[Any], node: int = 0, nnodes: int = 1, missing: list[int] | None = None,
                    unreachable: str | None = None, lost: dict[int, Any] | None = None) -> tuple[str, int]:
    """The rank to blame among failed ranks' ``evidence`` (every node's, when swapped), how it ended, the
    end of its traceback and the other failed ranks; returns (text, exit code for `accel launch`).
    ``missing``: nodes that sent no evidence; ``unreachable``: why the other launchers could not be reached;
    ``lost``: nodes whose launchers stopped answering (:class:`accel.launch.nodes.LostNode`), blamed
    unless a rank failed while they still answered."""
    root = diagnosis.blame_failure(evidence)
    if lost and not _failed_before(root, lost):
        return lost_verdict(lost, evidence, node)
    missing = [n for n in missing or [] if n not in (lost or {})]
    exitcode = root.exitcode if root.exitcode is not None else 1
    how = f"exit code {exitcode}"
    cause = None
    if exitcode < 0 and root.failed_at is not None:  # it failed first, then was stopped while exiting (e.g. slow atexit work)
        how = f"an error (then stopped by {root.signal} while exiting, after a peer's failure)"
        exitcode = 1
    elif exitcode < 0:
        how = f"signal {-exitcode} ({root.signal})"
        others = [e for e in evidence if e is not root]
        if others and root.signal != diagnosis.STOP_SIGNAL:
            cause = (f"accel launch: rank {root.rank} was killed by {root.signal} before any other rank reported an error: "
                     f"it is the root cause (the out-of-memory killer, a crash, or a kill from outside)")
    where = f"node {root.node}, " if nnodes > 1 else ""
    lines = [f"accel launch: rank {root.rank} ({where}local rank {root.local_rank}, pid {root.pid}) failed with {how}"]
    if cause:
        lines.append(cause)
    if missing:
        lines.append(f"accel launch: no evidence from node(s) {', '.join(map(str, missing))} within "
                     f"{diagnosis.EVIDENCE_WAIT:g} s: the verdict weighs this node's ranks only")
    if unreachable:
        lines.append(f"accel launch: the other nodes' launchers could not be reached: {unreachable}")
    if root.traceback:
        lines.append(f"accel launch: end of rank {root.rank}'s traceback:")
        lines += [f"  {line}" for line in root.traceback]
    elif root.message:
        lines.append(f"accel launch: rank {root.rank}: {root.message}")
    elif root.node != node:
        lines.append(f"accel launch: rank {root.rank} recorded no traceback; its output is in node {root.node}'s launcher output")
    else:
        lines.append(f"accel launch: rank {root.rank} recorded no traceback (it exited without raising, or was killed); its own output is above")
    others = [f"rank {e.rank} ({_how_it_ended(e)})" for e in diagnosis.failure_order(evidence) if e is not root]
    if others:
        lines.append(f"accel launch: also stopped: {', '.join(others)}")
    lines += [f"accel launch: then {l.headline()[len('accel launch: '):]}" for l in sorted((lost or {}).values(), key=lambda l: l.node)]
    return "\n".join(lines), exit_code(exitcode)


def _failed_before(root: Any, lost: dict[int, Any]) -> bool:
    """Whether rank ``root`` failed before every lost node was last heard from (that node was still there:
    the rank's failure is the root cause); a rank that failed after a node went silent failed because of it."""
    when = next((t for t in (root.failed_at, root.last_alive, root.agent_time) if t is not None), None)
    heard = [l.last_seen for l in lost.values() if l.last_seen is not None]
    return when is not None and bool(heard) and when < min(heard) - diagnosis.CLOCK_SKEW_MARGIN


def lost_verdict(lost: dict[int, Any], evidence: list[Any], node: int, idle: float | None = None) -> tuple[str, int]:
    """What `accel launch` prints when other nodes' launchers stopped answering: each lost node with its ranks
    and why it counts as lost, then this node's ranks in one line (their own output holds the details);
    returns (text, :data:`accel.launch.nodes.LOST_EXIT_CODE`). ``idle``: seconds this node's ranks
    had made no progress, when the watchdog ended them."""
    from .nodes import LOST_EXIT_CODE

    lines = []
    for l in sorted(lost.values(), key=lambda l: l.node):
        lines.append(l.headline())
        lines.append(f"accel launch: node {l.node}: {l.why}; its launcher was killed, its host went down, or the "
                     f"network between the nodes failed (its own output is on node {l.node})")
    own = sorted((e for e in evidence if e.node == node), key=lambda e: e.rank)
    failed = [e for e in own if e.exitcode is not None]
    if failed:
        lines.append(f"accel launch: this node's ranks failed after that: "
                     f"{', '.join(f'rank {e.rank} ({_how_it_ended(e)})' for e in failed)}; their own output is above")
    elif own and idle is not None:
        lines.append(f"accel launch: this node's ranks ({', '.join(str(e.rank) for e in own)}) had made no progress for "
                     f"{idle:.0f} s and were ended")
    return "\n".join(lines), LOST_EXIT_CODE


def _how_it_ended(e: Any) -> str:
    if e.signal and e.failed_at is not None:
        return f"an error, then signal {e.signal}"
    return f"signal {e.signal}" if e.signal else f"exit code {e.exitcode}"
