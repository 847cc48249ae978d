"""Time `accel report --history` against a PostgreSQL host that never answers (the connection timeout of
docs/reports.md).

Holds a port on 127.0.0.1 where a connection is never answered and never refused, then runs
``accel report --history postgresql://...@127.0.0.1:PORT/accel -o DIR`` on it and prints, per run, the exit
code, the seconds and what the command wrote on stderr. ``--kind accepted``: a listening socket nobody
accepts on (the TCP handshake completes; the server never says a word); ``--kind full``: its accept queue
is filled first, so the handshake itself hangs, as with a host that drops the connection attempt.
``ACCEL_HISTORY_CONNECT_TIMEOUT`` in the environment is passed on (10 s by default).

    python tests/scripts/time_history_unanswered.py --kind accepted --runs 3
    python tests/scripts/time_history_unanswered.py --kind full --runs 3
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time


def hold_port(full: bool) -> list[socket.socket]:
    """A listening socket nobody accepts on (first), and the connections that fill its queue when ``full``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0 if full else 8)
    held = [server]
    for _ in range(6 if full else 0):  # the queue's one place and the handshakes in flight beyond it
        waiting = socket.socket()
        waiting.setblocking(False)
        waiting.connect_ex(server.getsockname())
        held.append(waiting)
        time.sleep(0.05)
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("accepted", "full"), default="accepted")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    env = dict(os.environ, CI="")
    for run in range(args.runs):
        held = hold_port(args.kind == "full")
        try:
            url = f"postgresql://someone@127.0.0.1:{held[0].getsockname()[1]}/accel"
            with tempfile.TemporaryDirectory(prefix="accel_history_unanswered_") as out:
                start = time.monotonic()
                proc = subprocess.run([sys.executable, "-m", "accel.commands.cli", "report", "--history", url, "-o", out],
                                      capture_output=True, text=True, env=env, timeout=600)
                took = time.monotonic() - start
        finally:
            for sock in held:
                sock.close()
        lines = proc.stderr.strip().splitlines()
        print(f"run {run + 1}: exit {proc.returncode} after {took:.1f} s, {len(lines)} line(s) on stderr: "
              f"{' | '.join(lines)}", flush=True)


if __name__ == "__main__":
    main()
