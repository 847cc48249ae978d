"""multiprocessing's fork server, started as a fork of this process instead of a fresh interpreter.

A fresh server imports torch, the harness and the libraries the tests use before it forks its first rank:
seconds of work, on a core the tests need, that the first multi-process test waits for. A server forked
from the pytest process once it has collected starts with all of that imported, as the ranks a host
backend forks straight from the pytest process do. The fork must come before this process starts a
device's runtime (a child of such a process cannot use the device), which the caller checks.

The server then runs multiprocessing's own serving loop (``multiprocessing.forkserver.main``), and this
process records it where ``ensure_running`` records the server it spawns, so every later rank start finds
it. That record is private to multiprocessing; for a Python whose fork server has another shape (Python
3.14 adds an authentication key), :func:`why_not_forkable` names the difference and the caller keeps the
fresh server.
"""

from __future__ import annotations

import inspect
import os
import socket
import sys
from collections.abc import Sequence
from typing import NoReturn

from accel.launch.forking import garbage_frozen_for_fork

__all__ = ["start_forked_fork_server", "why_not_forkable"]

#: the parameters of ``multiprocessing.forkserver.main`` this module calls it with (Python 3.10 to 3.13)
_MAIN_PARAMETERS = ("listener_fd", "alive_r", "preload", "main_path", "sys_path")
#: what ``ensure_running`` records about the server it started, and nothing else
_SERVER_RECORD = ("_lock", "_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid")


def why_not_forkable() -> str | None:
    """Why this interpreter's fork server cannot be started as a fork of this process (None: it can)."""
    if not hasattr(os, "fork"):
        return "this platform cannot fork"
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    missing = [name for name in _SERVER_RECORD if not hasattr(server, name)]
    if missing:
        return f"multiprocessing.forkserver of Python {sys.version.split()[0]} keeps no {', '.join(missing)}"
    if hasattr(server, "_forkserver_authkey"):
        return f"the fork server of Python {sys.version.split()[0]} authenticates its clients"
    parameters = tuple(inspect.signature(forkserver.main).parameters)
    if parameters != _MAIN_PARAMETERS:
        return f"multiprocessing.forkserver.main of Python {sys.version.split()[0]} takes {', '.join(parameters)}"
    return None


def start_forked_fork_server(preload: Sequence[str]) -> bool:
    """Fork this process into multiprocessing's fork server, which imports ``preload`` (what is missing of
    it) before it serves. Returns False, starting nothing, when :func:`why_not_forkable` names a reason or a
    server is already running; the caller then goes on with the usual fresh server."""
    if why_not_forkable() is not None:
        return False
    from multiprocessing import connection, forkserver, resource_tracker, util

    server = forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is not None:
            pid, _ = os.waitpid(server._forkserver_pid, os.WNOHANG)
            if not pid:
                return False
            os.close(server._forkserver_alive_fd)
            server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
        resource_tracker.ensure_running()  # before the fork: the server and its ranks share this tracker
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            # every client holds the write end; the server leaves once it reads end-of-file
            alive_r, alive_w = os.pipe()
            try:
                with garbage_frozen_for_fork():
                    pid = os.fork()
                if pid == 0:
                    _serve(listener.fileno(), alive_r, alive_w, list(preload))
            except BaseException:
                os.close(alive_w)
                raise
            finally:
                os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
    return True


def _serve(listener_fd: int, alive_r: int, alive_w: int, preload: list[str]) -> NoReturn:
    """The forked server: multiprocessing's loop until its clients are gone. It never returns into the
    caller's code (pytest's, here): it leaves with ``os._exit``, running no handler of the process it copies."""
    code = 0
    try:
        os.close(alive_w)
        from multiprocessing import forkserver

        forkserver.main(listener_fd, alive_r, preload)
    except SystemExit as exc:  # how the loop ends once every client has closed its end of the pipe
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)
