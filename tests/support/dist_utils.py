"""Run a function in N real CPU ranks (gloo) for the project's own tests.

Each call forks fresh ranks with a file-based rendezvous unique to the call, so parallel pytest
workers never share a store. Ranks see the environment a launcher would set (RANK, WORLD_SIZE,
LOCAL_RANK, ...), build ``PartialState()`` themselves, and return picklable results. The first
failing rank fails the call with its traceback; a hang ends at ``timeout``.
(The harness's pooled runner for the suites is a separate, faster mechanism.)
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import tempfile
import time
import traceback
from typing import Any, Callable

from _waits import SAFETY_NET_S
from accel.launch.forking import garbage_frozen_for_fork


#: where test ports are drawn from: below Linux's ephemeral range (32768-60999), so a port checked free
#: is not handed to another process's connection or to gloo's listeners (ephemeral ports) before the
#: test's store binds it; a client that reached such a listener instead would wait forever
TEST_PORTS = range(20000, 32000)


def free_port() -> str:
    """A TCP port on 127.0.0.1 that was free a moment ago, outside the ephemeral range: a rendezvous of the
    test's own, never the default 29500 that everything else on the host takes."""
    import random
    import socket

    for port in random.sample(TEST_PORTS, 50):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return str(port)
    raise RuntimeError(f"no free port in {TEST_PORTS.start}-{TEST_PORTS.stop - 1} after 50 tries")


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, store: str, args: tuple, queue: Any) -> None:
    import faulthandler
    import signal

    # on a timeout the parent asks each rank still alive for every thread's stack (into a file beside the store)
    stacks = open(f"{store}.stacks.{rank}", "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    try:
        os.environ.update(
            RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1",
        )
        os.environ.pop("ACCEL_DEVICE", None)
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        from accel.backends import reset_registry
        from accel.state import AcceleratorState, GradientState, PartialState

        reset_registry()
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
        try:
            result = fn(*args)
        finally:
            if dist.is_initialized():  # ``fn`` may have taken it down itself
                dist.destroy_process_group()
        queue.put((rank, "ok", pickle.dumps(result)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def _stacks(procs: list[Any], alive: list[int], store: str) -> str:
    """Every thread's stack of each rank in ``alive`` (faulthandler, asked with SIGUSR1), for a timeout's message."""
    import signal

    for rank in alive:
        try:
            os.kill(procs[rank].pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    texts = []
    for rank in alive:
        path = f"{store}.stacks.{rank}"
        text = ""
        for _ in range(50):  # the rank writes them from its signal handler; give it up to 5 s
            text = open(path).read() if os.path.exists(path) else ""
            if text.strip():
                break
            time.sleep(0.1)
        texts.append(f"--- rank {rank} ---\n{text.strip() or '(no stack written)'}")
    return "\n".join(texts)


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float | None = None) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` forked ranks; return the per-rank results in rank order.

    ``timeout`` (default: the tests' one safety net) bounds the whole call, all ranks together.
    """
    timeout = SAFETY_NET_S if timeout is None else timeout
    deadline = time.monotonic() + timeout
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, store, args, queue), daemon=True) for r in range(world_size)]
        # a rank that collected an inherited process group (garbage of an earlier test of this worker) waited in
        # its destructor for threads a forked child does not have, and hung
        with garbage_frozen_for_fork():
            for p in procs:
                p.start()
        results: dict[int, Any] = {}
        try:
            for _ in range(world_size):
                try:
                    rank, status, payload = queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except Exception:
                    alive = [r for r, p in enumerate(procs) if p.is_alive()]
                    raise TimeoutError(f"ranks {alive} did not finish within {timeout:g}s\n"
                                       + _stacks(procs, alive, store)) from None
                if status == "error":
                    raise AssertionError(f"rank {rank} failed:\n{payload}")
                results[rank] = pickle.loads(payload)
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
    return [results[r] for r in range(world_size)]
