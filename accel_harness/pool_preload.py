"""What a rank pool's fork server imports before it forks ranks, so that no rank imports it again.

A rank forked from a fork server starts with the server's modules already imported. Every rank of
every pool would otherwise import them itself, several ranks at once on the same cores, and a test
that is a fresh rank's first would carry that cost (a pool is started again after a failure, so this
happens more than once a session). None of these modules touches a device: the server must stay fit
to fork ranks of a spawn-only device.
"""

from __future__ import annotations

import sys

__all__ = ["ALWAYS", "FREEZE", "WHEN_IMPORTED", "fork_server_modules", "start_fork_server"]

#: what every rank imports: torch; ``torch._dynamo``, which torch's optimizers import when one is built
#: (about eight hundred modules, sympy's among them); the process group's package; pytest, through which
#: a rank reports skips and expected failures; accel's facade and the harness's rank side
ALWAYS = ("torch", "torch._dynamo", "torch.distributed", "pytest", "accel.accelerator", "accel_harness.distributed")
#: libraries whose import takes seconds and touches no device, imported by the server only when the
#: process that starts it has imported them (the session's tests use them)
WHEN_IMPORTED = ("transformers", "peft")
#: imported last: freezes everything imported before it out of the forked ranks' garbage collections
FREEZE = "accel_harness.pool_freeze"


def fork_server_modules(*extra: str) -> list[str]:
    """The modules a fork server started now imports before it forks its first rank: the lists above,
    then ``extra`` (what one user of the server needs besides), then :data:`FREEZE`."""
    return [*ALWAYS, *(name for name in WHEN_IMPORTED if name in sys.modules), *extra, FREEZE]


def start_fork_server(*extra: str, fork_this_process: bool = False) -> bool:
    """Start this process's fork server now, importing :func:`fork_server_modules` (with ``extra``), without
    waiting for it; True when the server is a fork of this process.

    With ``fork_this_process`` (the caller vouches that no device runtime started here) the server is a
    fork of this process and has what this process imported (:mod:`accel_harness.forked_fork_server`);
    otherwise, or where that cannot be done, it is a fresh interpreter. Either imports what is missing in a
    process of its own while this one goes on; the first rank forked from it waits for what is left of the
    imports. A server already running is kept, with what it imported."""
    import multiprocessing
    import multiprocessing.forkserver

    modules = fork_server_modules(*extra)
    multiprocessing.get_context("forkserver").set_forkserver_preload(modules)
    if fork_this_process:
        from .forked_fork_server import start_forked_fork_server

        if start_forked_fork_server(modules):
            return True
    multiprocessing.forkserver.ensure_running()
    return False
