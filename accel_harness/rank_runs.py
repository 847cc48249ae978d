"""Running a ``world_size`` test's body in its ranks and turning the ranks' result into the test's.

The test's arguments are pickled to the ranks of a pool (:mod:`accel_harness.distributed`); each
pytest-xdist worker may get its own slice of the devices.
"""

from __future__ import annotations

import os
import pickle
import warnings
from typing import Any

import pytest

from .harness_context import HarnessContext
from .marker_checks import rank_timeout_scale


class LeftoverProcessWarning(pytest.PytestWarning):
    """A multi-process test left processes running in a rank; the harness killed them after the test."""


def run_in_ranks(ctx: HarnessContext, item: pytest.Function, backend_name: str, world: int) -> None:
    """Run a ``world_size`` test's body in ``world`` ranks of a pool; their result becomes the test's outcome."""
    from .distributed import RANK_LOCAL_ARGS, Task

    argnames = item._fixtureinfo.argnames
    kwargs = {arg: item.funcargs[arg] for arg in argnames}
    sendable = {k: (None if k in RANK_LOCAL_ARGS else v) for k, v in kwargs.items()}
    try:
        payload = pickle.dumps(sendable)
    except Exception as exc:
        bad = [k for k, v in sendable.items() if not _picklable(v)]
        pytest.fail(f"multi-process test arguments must be picklable to reach the ranks; not picklable: {bad} ({exc})",
                    pytrace=False)
    function = item.obj
    module = function.__module__
    task = Task(module, getattr(item.module, "__file__", None), function.__qualname__, payload)
    backend = ctx.backend(backend_name)
    env = visible_devices_env(backend, world)
    pool = ctx.pool_manager().get(backend_name, world, pool_start_method(ctx, backend), env=env)
    timeout = ctx.timeout * rank_timeout_scale(item)
    result = pool.run(task, timeout=timeout)
    for rank, leftovers in sorted(result.leftovers.items()):
        warnings.warn(LeftoverProcessWarning(
            f"rank {rank} of {world}: the test left {len(leftovers)} process(es) running; killed: " + "; ".join(leftovers)))
    if result.status == "passed":
        return
    if result.status == "skipped":
        pytest.skip(result.message)
    if result.status == "xfailed":
        pytest.xfail(result.message)
    if result.status == "failed":
        failing = next(o for o in result.outcomes if o.rank == result.rank)
        pytest.fail(f"rank {result.rank} of {world} failed: {result.message}\n\n{failing.traceback}", pytrace=False)
    if result.status == "crashed":
        stacks = "\n".join(f"--- rank {r} ---\n{text}" for r, text in sorted(result.stacks.items()))
        pytest.fail(f"{result.message} (world size {world}, backend {backend_name})" + (f"\n{stacks}" if stacks else ""),
                    pytrace=False)
    stacks = "\n".join(f"--- rank {r} ---\n{text}" for r, text in sorted(result.stacks.items()))
    limit = f"--dist-timeout={ctx.timeout:g}" + (f" x rank_timeout {timeout / ctx.timeout:g} = {timeout:g} s" if timeout != ctx.timeout else "")
    pytest.fail(f"timeout: {result.message} ({limit})\n{stacks}", pytrace=False)


def pool_start_method(ctx: HarnessContext, backend: Any) -> str:
    """How ``backend``'s rank pools start: its own ``start_method``, with two changes. A spawn-only backend
    that allows it (``fork_server_ranks``) forks its ranks from a fork server that imported torch once,
    instead of paying a fresh interpreter and torch import per rank. A forking backend forks from a fork
    server when the session also runs a device backend: a backward pass on a device starts torch's autograd
    device threads in the pytest process, and a rank forked from it after that fails its first backward
    ("Unable to handle autograd's threading in combination with fork-based multiprocessing")."""
    import multiprocessing

    method = backend.start_method
    if method == "spawn":
        allowed = getattr(backend, "fork_server_ranks", False)
        return "forkserver" if allowed and "forkserver" in multiprocessing.get_all_start_methods() else method
    if method != "fork":
        return method
    for name in ctx.selected:
        try:
            other = ctx.backend(name)
        except Exception:  # an unknown name: the session reports it elsewhere
            continue
        if not other.is_host:
            return "forkserver"
    return method


def prestart_fork_server(ctx: HarnessContext, items: list[pytest.Item]) -> tuple[str, ...] | None:
    """Start the fork server as the session's tests begin, when one of them forks its ranks from it or names
    what the server should import (``fork_server_imports``); returns the modules it imports besides the
    pools' list (None: it was not started).

    A rank pool would start it at its first multi-process test, which would wait for the server's imports
    (seconds); started here, the server imports on another core while the single-process tests run. While
    no selected backend has started its device runtime in this process, the server is a fork of it
    and starts with everything the collection imported."""
    from . import pool_preload

    extra = tuple(dict.fromkeys(module for item in items for mark in item.iter_markers("fork_server_imports")
                                for module in mark.args))
    if not extra and not any(_forks_ranks_from_server(ctx, item) for item in items):
        return None
    pool_preload.start_fork_server(*extra, fork_this_process=not _device_runtime_started(ctx))
    return extra


def _device_runtime_started(ctx: HarnessContext) -> bool:
    """Whether a selected backend's device runtime runs in this process (or might: a backend that cannot
    tell, or cannot be looked up, counts as started)."""
    for name in ctx.selected:
        try:
            if ctx.backend(name).runtime_initialized():
                return True
        except Exception:
            return True
    return False


def _forks_ranks_from_server(ctx: HarnessContext, item: pytest.Item) -> bool:
    """Whether ``item`` starts ranks of a selected, available backend whose pools fork from a fork server."""
    from .params import item_backend

    name, world = item_backend(item)
    if name is None or not world or world < 2 or item.get_closest_marker("world_size") is None:
        return False
    if name not in ctx.selected:
        return False
    backend = ctx.backend(name)
    return backend.is_available() and pool_start_method(ctx, backend) == "forkserver"


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
        return True
    except Exception:
        return False


def visible_devices_env(backend: Any, world: int) -> dict[str, str]:
    """Give each pytest-xdist worker its own slice of the devices (device backends only), when the slice
    holds a device for each of the test's ``world`` ranks; otherwise the worker sees every device (its
    ranks then share them with the other workers' rather than several ranks asking for one device)."""
    var = backend.visible_devices_env
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not var or not worker or workers < 2 or var in os.environ:
        return {}
    count = backend.device_count()
    per_worker = count // workers
    if per_worker < max(world, 1):
        return {}
    index = int(worker.removeprefix("gw") or 0)
    first = index * per_worker
    return {var: ",".join(str(i) for i in range(first, first + per_worker))}
