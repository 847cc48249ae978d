"""The launchers of several nodes keep in touch through the rendezvous store (static rendezvous: a TCPStore at
the main process's address, served by node 0's launcher).

* They swap their ranks' evidence when a job ends (:meth:`NodeExchange.swap`), so every node judges the
  same evidence.
* Each launcher pulses (a key it rewrites every second), so a node whose launcher is gone -- killed, its
  host down, the network cut -- is named as lost after :func:`node_timeout` seconds of silence instead of
  being waited for. Node 0 serves the store from its own process: when node 0's launcher dies, the store
  refuses connections, and the other nodes know at once.
* Before any rank starts, node 0 serves the store (its port must be free) and leaves a key that marks it
  as an accel launch store; a joining node checks that what answers on the port is that store, since a
  foreign program there would keep torch elastic waiting for minutes.

The store's client logs C++ frames for every request that meets a closed connection, so a launcher
other than node 0 first checks with a plain TCP connection that the store still accepts one.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from .diagnosis import EVIDENCE_WAIT, RankEvidence

__all__ = ["DEFAULT_NODE_TIMEOUT", "END_KINDS", "JOIN_WAIT", "LOST_EXIT_CODE", "NODE_TIMEOUT_ENV", "LostNode",
           "NodeExchange", "NodeSetupError", "node_timeout", "rank_span"]


class NodeSetupError(ValueError):
    """The nodes cannot meet as asked (a taken port, a foreign program on it, an unreadable node timeout):
    a mistake in how the launch was invoked, which `accel launch` reports as a usage error."""


#: seconds a node's launcher may stay silent before the other nodes call it lost
DEFAULT_NODE_TIMEOUT = 10.0
NODE_TIMEOUT_ENV = "ACCEL_LAUNCH_NODE_TIMEOUT"
#: exit status of a launch whose verdict is a lost node (as `timeout` exits when it fails itself)
LOST_EXIT_CODE = 125
#: seconds a joining node waits for anything to answer on the rendezvous port (torch's static rendezvous default)
JOIN_WAIT = 600.0
_PREFIX = "accel_launch/"
#: the key node 0 sets as soon as it serves the store: what a joining node expects to find
_MARKER = _PREFIX + "store"
#: how a node's launcher can tell the others that its job ended: its watchdog declared a hang, or a rank failed
END_KINDS = ("hang", "failure")
#: successful polls of the store an observer needs since a node's last pulse before it calls the node lost
#: (an observer that was itself starved of CPU has not watched long enough)
_MIN_POLLS = 3


def node_timeout(environ: dict[str, str] | None = None) -> float:
    """Seconds of silence after which another node counts as lost: ``$ACCEL_LAUNCH_NODE_TIMEOUT``, else the default."""
    text = (os.environ if environ is None else environ).get(NODE_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_NODE_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        raise NodeSetupError(f"{NODE_TIMEOUT_ENV} must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise NodeSetupError(f"{NODE_TIMEOUT_ENV} must be more than 0 seconds, got {text!r}")
    return value


def rank_span(ranks: list[int]) -> str:
    """``ranks 2–3`` for a run of ranks, ``rank 2`` for one, ``ranks 1, 4`` otherwise."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}\u2013{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


@dataclass
class LostNode:
    """A node whose launcher stopped answering: where it ran, its ranks, why it counts as lost, and the
    wall-clock moment of its last pulse (None when it never pulsed)."""

    node: int
    host: str
    ranks: list[int]
    why: str
    last_seen: float | None = None

    def headline(self) -> str:
        """The verdict's first line for this node."""
        lost = "is" if len(self.ranks) == 1 else "are"
        return f"accel launch: node {self.node} (host {self.host}) stopped answering; its {rank_span(self.ranks)} {lost} lost"


def _accepts(host: str, port: int, timeout: float) -> str | None:
    """None when ``host:port`` accepts a TCP connection now; else why not, in words."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return "refused the connection"
    except socket.timeout:
        return f"did not accept a connection within {timeout:g} s"
    except OSError as exc:
        return f"could not be reached ({exc.strerror or exc})"


def _local_address(host: str, port: int) -> str:
    """The address this host uses to reach ``host`` (what the other nodes would call this node)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, port))  # a datagram socket sends nothing: this only picks the route
            return str(sock.getsockname()[0])
    except OSError:
        return socket.gethostname()


class NodeExchange:
    """The launchers' channel through the rendezvous store (keys under ``accel_launch/``): ``store`` (node 0's
    mark), ``node/<n>`` (where node n runs), ``pulse/<n>``, ``hang`` and ``failure`` (a launcher's job
    ended: the others end theirs too and send evidence), ``evidence/<n>``, ``read/<n>`` and ``done/<n>``.

    Node 0's launcher hosts the store's server itself (torch elastic's agent shares it), so the store
    outlives the agent until every node has read the evidence. Every wait is bounded: ``wait`` for the
    evidence of a node that still answers, ``silence`` for a node that does not (:func:`node_timeout`).
    """

    def __init__(self, host: str, port: int, node: int, nnodes: int, wait: float = EVIDENCE_WAIT,
                 silence: float | None = None, nproc_per_node: int = 1):
        self.host, self.port, self.node, self.nnodes, self.wait = host, int(port), int(node), int(nnodes), float(wait)
        self.silence = float(silence) if silence is not None else node_timeout()
        self.nproc_per_node = int(nproc_per_node)
        self._store: Any = None
        self._server: Any = None
        self._published = False
        self.error: str | None = None
        self.lost: dict[int, LostNode] = {}
        self._lock = threading.Lock()
        self._pulses: dict[int, tuple[str, float, int]] = {}  # node -> (last pulse, monotonic when it changed, polls since)
        self._contact: float | None = None  # monotonic moment node 0's store last answered
        self._refused: str | None = None  # why node 0's store stopped accepting connections, after it had answered
        self._hosts: dict[int, str] = {0: self.host}
        self._done: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the store
    def open(self) -> None:
        """Before the agent starts: node 0 serves the store (a taken port is a usage error) and marks it as
        accel's; another node waits for the store and checks that mark (anything else answering on the port
        is a usage error). Then every node says where it runs and starts pulsing."""
        if self.node == 0:
            try:
                self._server = self._make(is_master=True, timeout=self.wait)
            except Exception as exc:
                if "EADDRINUSE" in str(exc) or "already in use" in str(exc):
                    raise NodeSetupError(f"port {self.port} is in use on this host (node 0 serves the rendezvous store on it); "
                                     "choose another --main_process_port on every node") from None
                raise
            self._store = self._server
            self._server.set(_MARKER, json.dumps({"nnodes": self.nnodes}))
        else:
            self._store = self._join()
            if self._store is None:
                return  # nothing answered for JOIN_WAIT: torch elastic's rendezvous says so in its own words
        self._store.set(f"{_PREFIX}node/{self.node}", json.dumps({"host": _local_address(self.host, self.port),
                                                                  "pid": os.getpid()}))
        self._contact = time.monotonic()
        self._thread = threading.Thread(target=self._pulse, name="accel-node-pulse", daemon=True)
        self._thread.start()

    def _join(self) -> Any:
        """Wait until something answers on the port, then check in a thread (a foreign listener can keep the
        store's client waiting forever) that it is node 0's store; a usage error when it is not."""
        from datetime import timedelta

        deadline = time.monotonic() + JOIN_WAIT
        while _accepts(self.host, self.port, min(self.silence, 5.0)) is not None:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.5)
        result: dict[str, Any] = {}

        def handshake() -> None:
            try:
                store = self._make(is_master=False, timeout=self.silence)
                store.wait([_MARKER], timedelta(seconds=self.silence))
                result["store"] = store
            except Exception as exc:
                result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

        thread = threading.Thread(target=handshake, name="accel-store-handshake", daemon=True)
        thread.start()
        thread.join(self.silence + 2.0)
        if "store" in result:
            return result["store"]
        raise NodeSetupError(f"port {self.port} on {self.host} answers, but not as node 0's accel launch store (no handshake "
                         f"within {self.silence:g} s): another program holds the port; choose another --main_process_port "
                         "on every node")

    def _make(self, is_master: bool, timeout: float) -> Any:
        from datetime import timedelta

        from torch.distributed import TCPStore

        return TCPStore(self.host, self.port, None, is_master, timedelta(seconds=timeout),
                        wait_for_workers=False, multi_tenant=True)

    def _reachable(self) -> bool:
        """Whether node 0's store accepts a connection now (always, on node 0); a refusal after the store had
        answered means node 0's launcher is gone."""
        if self._server is not None:
            return True
        why = _accepts(self.host, self.port, min(self.silence, 5.0))
        if why is not None:
            with self._lock:
                if self._contact is not None and why == "refused the connection":
                    self._refused = why
            return False
        return True

    def _client(self, timeout: float) -> Any:
        """The store, after a check that it still accepts a connection (a request on a closed connection
        makes torch log C++ frames)."""
        if not self._reachable():
            self._store = self._server
            raise ConnectionError(f"the store at {self.host}:{self.port} {self._refused or 'does not answer'}")
        if self._store is None:
            self._store = self._make(is_master=False, timeout=timeout)
        return self._store

    # ------------------------------------------------------------------ pulses and lost nodes
    def _pulse(self) -> None:
        """Every second (or a quarter of ``silence``, if less): rewrite this node's pulse and note the others'."""
        interval = min(1.0, self.silence / 4)
        store = self._server
        beat = 0
        others = [n for n in range(self.nnodes) if n != self.node]
        while not self._stop.is_set():
            beat += 1
            try:
                if self._server is None:
                    if not self._reachable():
                        raise ConnectionError("no store")
                    if store is None:
                        store = self._make(is_master=False, timeout=self.silence)
                store.set(f"{_PREFIX}pulse/{self.node}", f"{beat} {time.time():.3f}")
                seen = {n: store.get(f"{_PREFIX}pulse/{n}").decode() for n in others if store.check([f"{_PREFIX}pulse/{n}"])}
                done = {n for n in others if store.check([f"{_PREFIX}done/{n}"])}
                hosts = {n: json.loads(store.get(f"{_PREFIX}node/{n}"))["host"] for n in others
                         if n not in self._hosts and store.check([f"{_PREFIX}node/{n}"])}
            except Exception:
                store = self._server
            else:
                now = time.monotonic()
                with self._lock:
                    self._contact = now
                    self._done |= done
                    self._hosts.update(hosts)
                    for n in others:
                        last = self._pulses.get(n)
                        if n in seen and (last is None or last[0] != seen[n]):
                            self._pulses[n] = (seen[n], now, 0)
                        elif last is not None:
                            self._pulses[n] = (last[0], last[1], last[2] + 1)
            self._stop.wait(interval)

    def lost_nodes(self) -> dict[int, LostNode]:
        """The other nodes judged lost so far (judged once, kept): node 0's store refused this node's connection
        or has not answered for ``silence`` seconds, or a node's pulse has not changed for that long while
        this node kept reading the store. A node that ended its launch, or never pulsed, is never lost."""
        now = time.monotonic()
        with self._lock:
            for n in range(self.nnodes):
                if n == self.node or n in self.lost or n in self._done:
                    continue
                pulse = self._pulses.get(n)
                why = None
                if n == 0 and self._server is None and self._contact is not None:
                    if self._refused:
                        why = f"its rendezvous store at {self.host}:{self.port} {self._refused}"
                    elif now - self._contact >= self.silence:
                        why = f"its rendezvous store at {self.host}:{self.port} has not answered for {now - self._contact:.0f} s"
                if why is None and pulse is not None and now - pulse[1] >= self.silence and pulse[2] >= _MIN_POLLS:
                    why = f"its launcher has not pulsed for {now - pulse[1]:.0f} s"
                if why is not None:
                    last_seen = float(pulse[0].split()[1]) if pulse is not None else None
                    ranks = list(range(n * self.nproc_per_node, (n + 1) * self.nproc_per_node))
                    self.lost[n] = LostNode(n, self._hosts.get(n, "unknown"), ranks, why, last_seen)
            return dict(self.lost)

    def _store_lost(self) -> bool:
        """Whether the store went with node 0 (nothing can be sent or read through it any more)."""
        return self.node != 0 and 0 in self.lost_nodes()

    def _serve_until(self, key: str, limit: float, nodes: list[int]) -> None:
        """On node 0: wait at most ``limit`` seconds until each of ``nodes`` has set ``accel_launch/<key>/<n>``
        or is lost."""
        deadline = time.monotonic() + limit
        while nodes and time.monotonic() < deadline:
            lost = self.lost_nodes()
            nodes = [n for n in nodes if n not in lost and not self._server.check([f"{_PREFIX}{key}/{n}"])]
            if nodes:
                time.sleep(0.1)

    # ------------------------------------------------------------------ the end of a job
    def end_declared(self) -> str | None:
        """The kind of end another launcher declared (one of :data:`END_KINDS`), ``"lost"`` when another node
        is lost, or None (also when the store cannot be reached now: the watchdog asks again at its next poll).
        A loaded host can take seconds to answer: up to 10 s are allowed."""
        if self.lost_nodes():
            return "lost"
        try:
            store = self._client(min(self.wait, 10.0))
            return next((kind for kind in END_KINDS if store.check([_PREFIX + kind])), None)
        except Exception:
            self._store = self._server
            return None

    def declare_end(self, kind: str) -> None:
        """Tell the other launchers that this node's job ended (``kind``: ``"hang"``, this launcher's
        watchdog ended it; ``"failure"``, a rank of this node failed): they end theirs too and send their
        evidence. Tried again until ``wait`` has passed, or node 0 is lost; a store that never answers is
        kept in ``error``."""
        if kind not in END_KINDS:
            raise ValueError(f"unknown kind of end {kind!r}: expected one of {', '.join(END_KINDS)}")
        deadline = time.monotonic() + self.wait
        while not self._store_lost():
            try:
                self._client(max(deadline - time.monotonic(), 1.0)).set(_PREFIX + kind, str(self.node))
                return
            except Exception as exc:
                self._store = self._server
                if time.monotonic() >= deadline:
                    self.error = f"{type(exc).__name__}: {exc}"
                    return
                time.sleep(0.2)

    def swap(self, mine: list[RankEvidence]) -> tuple[list[RankEvidence], list[int]]:
        """Publish this node's evidence, read every other node's (waiting at most ``wait`` seconds in all, and
        no longer for a node found lost, see :meth:`lost_nodes`); returns (all evidence, nodes that sent none).
        After a declaration that could not reach the store (``error`` is set), nothing is tried again: the
        launcher has waited once already."""
        merged = list(mine)
        missing = [n for n in range(self.nnodes) if n != self.node]
        if self.error is not None:
            return merged, missing
        deadline = time.monotonic() + self.wait
        failure: str | None = None
        while missing and not self._store_lost():
            try:
                store = self._client(max(deadline - time.monotonic(), 1.0))
                if not self._published:
                    store.set(f"{_PREFIX}evidence/{self.node}", json.dumps([e.to_json() for e in mine]))
                    self._published = True
                for n in list(missing):
                    key = f"{_PREFIX}evidence/{n}"
                    if store.check([key]):
                        merged += [RankEvidence.from_json(d) for d in json.loads(store.get(key))]
                        missing.remove(n)
                failure = None
            except Exception as exc:
                self._store = self._server
                failure = f"{type(exc).__name__}: {exc}"
            lost = self.lost_nodes()
            with self._lock:
                gone = set(lost) | self._done  # no evidence will come from these
            if not missing or all(n in gone for n in missing) or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if self._published and not self._store_lost():
            with contextlib.suppress(Exception):
                self._client(1.0).set(f"{_PREFIX}read/{self.node}", "1")
        if failure is not None and not self._store_lost():
            self.error = failure
        return merged, missing

    def close(self) -> None:
        """Say this node is done and stop pulsing. On node 0, first wait (bounded) until every node that sent
        evidence has read all of it, and every node that joined has said it is done (it then stops using the
        store: a request on a closed connection would make torch log C++ frames there), unless it is lost;
        then stop serving."""
        if self._server is not None and self._published:
            self._serve_until("read", self.wait, [n for n in range(1, self.nnodes) if self._server.check([f"{_PREFIX}evidence/{n}"])])
        if self._server is not None and self._thread is not None:
            self._serve_until("done", self.silence, [n for n in range(1, self.nnodes) if self._server.check([f"{_PREFIX}node/{n}"])])
        if self._thread is not None:
            self._stop.set()  # the pulse stops before "done" is said: node 0 may stop serving right after it
            self._thread.join(timeout=self.silence + 1.0)
            with contextlib.suppress(Exception):
                if self._server is not None or (self._store is not None and not self._store_lost() and self._reachable()):
                    self._store.set(f"{_PREFIX}done/{self.node}", "1")
        self._store = self._server = None
