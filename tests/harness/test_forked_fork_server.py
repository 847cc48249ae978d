"""multiprocessing's fork server started as a fork of the calling process (accel_harness.forked_fork_server)."""

import subprocess
import sys
import textwrap

from _waits import SAFETY_NET_S

from accel_harness.forked_fork_server import start_forked_fork_server, why_not_forkable

SCRIPT = textwrap.dedent("""
    import atexit, multiprocessing, os, sys
    from multiprocessing import forkserver

    STATE = {}

    def report(queue):
        queue.put((STATE.get("value"), os.getppid(), "colorsys" in sys.modules))

    if __name__ == "__main__":
        atexit.register(lambda: print("atexit ran", flush=True))
        STATE["value"] = "set at run time"
        from accel_harness.forked_fork_server import start_forked_fork_server
        assert "colorsys" not in sys.modules
        assert start_forked_fork_server(["colorsys"])
        assert not start_forked_fork_server([]), "a second call keeps the running server"
        assert "colorsys" not in sys.modules, "the server imports its list, not the caller"
        server = forkserver._forkserver._forkserver_pid
        ctx = multiprocessing.get_context("forkserver")
        queue = ctx.Queue()
        proc = ctx.Process(target=report, args=(queue,))
        proc.start()
        value, parent, preloaded = queue.get(timeout=300)
        proc.join()
        print("child:", value, parent == server, preloaded, proc.exitcode)
        os.close(forkserver._forkserver._forkserver_alive_fd)  # the last client leaves
        print("server exit:", os.waitstatus_to_exitcode(os.waitpid(server, 0)[1]))
""")


def test_this_python_can_fork_its_fork_server():
    """The release this project's environment uses has the fork server's known shape; a later one with an
    authenticated server names the reason instead."""
    reason = why_not_forkable()
    if sys.version_info < (3, 14):
        assert reason is None
    else:
        assert reason and "authenticates" in reason


def test_a_process_forked_from_the_server_has_the_callers_state_and_the_servers_imports(tmp_path):
    """The child sees what the caller set at run time (a fresh server would have imported the main module
    again, without it), the module the server was asked to import, and the server as its parent; the server
    runs none of the caller's exit handlers and leaves cleanly once its last client closes the pipe."""
    script = tmp_path / "caller.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert proc.returncode == 0, proc.stderr
    assert "child: set at run time True True 0" in proc.stdout, proc.stdout + proc.stderr
    assert "server exit: 0" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stdout.count("atexit ran") == 1, "only the caller runs its exit handlers"


def test_an_unknown_fork_server_shape_starts_nothing(monkeypatch):
    """A fork server that authenticates its clients (Python 3.14) would refuse a forked server's clients:
    nothing is forked and the caller keeps the fresh server."""
    from multiprocessing import forkserver

    monkeypatch.setattr(forkserver._forkserver, "_forkserver_authkey", b"key", raising=False)
    assert "authenticates" in why_not_forkable()
    before = forkserver._forkserver._forkserver_pid
    assert start_forked_fork_server([]) is False
    assert forkserver._forkserver._forkserver_pid == before
