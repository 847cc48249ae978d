"""Time `accel launch`'s verdict when a whole node is lost, or when another program holds the rendezvous port
(the lost-node rows and the taken-port figures of docs/launch.md).

Starts two simulated nodes (two launchers on 127.0.0.1, static rendezvous) on fault_rank.py.

* ``--lost N``: waits for every rank's ``ready-N`` file, SIGKILLs node N's launcher (its ranks die with it)
  and times the other launcher from the signal to its exit; prints, per run, the exit code, the seconds
  and the verdict's first line.
* ``--port_taken``: first holds the port with a plain listening socket that never answers (connections
  wait in its backlog), then starts both launchers together and times each from its start to its exit;
  prints, per run and node, the exit code, the seconds and the first line of its stderr, and whether any
  rank started.

    python tests/scripts/time_lost_node.py --lost 1 --runs 3 [--ranks 4] [--hang_timeout 6]
    python tests/scripts/time_lost_node.py --port_taken --runs 3

``ACCEL_LAUNCH_NODE_TIMEOUT`` in the environment is passed on (the launchers' default is 10 s).
"""

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAULT = Path(__file__).with_name("fault_rank.py")


def start_nodes(tmp: Path, port: str, ranks: int, hang_timeout: str) -> tuple[list[subprocess.Popen], Path]:
    """Both nodes' launchers of fault_rank.py (``ranks`` in all) meeting at 127.0.0.1:``port``, their stderr in
    ``tmp/stderr-<node>``; returns them and the folder where the ranks leave their ``ready-N`` and ``pid-N`` files."""
    out = tmp / "out"
    out.mkdir()
    env = dict(os.environ, ACCEL_TEST_OUT=str(out), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    for name in ("ACCEL_DEVICE", "ACCEL_CONFIG_FILE", "ACCEL_HANG_TIMEOUT"):
        env.pop(name, None)
    common = ["--cpu", "--num_processes", str(ranks), "--hang_timeout", hang_timeout, "--num_machines", "2",
              "--main_process_ip", "127.0.0.1", "--main_process_port", port]
    launchers = []
    for node in range(2):
        with open(tmp / f"stderr-{node}", "w") as err:
            launchers.append(subprocess.Popen(
                [sys.executable, "-m", "accel.commands.cli", "launch", *common, "--machine_rank", str(node), str(FAULT)],
                env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=err))
    return launchers, out


def one_run(lost: int, ranks: int, hang_timeout: str) -> tuple[int, float, str]:
    """(the survivor's exit code, seconds from the SIGKILL to its exit, its verdict's first line)."""
    tmp = Path(tempfile.mkdtemp(prefix="accel_lost_node_"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    launchers, out = start_nodes(tmp, port, ranks, hang_timeout)
    try:
        while len(list(out.glob("ready-*"))) < ranks:
            if any(p.poll() is not None for p in launchers):
                raise SystemExit(f"a launcher ended before its ranks were ready; see {tmp}")
            time.sleep(0.1)
        killed = time.monotonic()
        launchers[lost].send_signal(signal.SIGKILL)
        code = launchers[1 - lost].wait(timeout=600)
        took = time.monotonic() - killed
    finally:
        for p in launchers:
            if p.poll() is None:
                p.kill()
    err = (tmp / f"stderr-{1 - lost}").read_text()
    headline = next((line for line in err.splitlines() if line.startswith("accel launch: ")), "(no verdict)")
    frames = sum("frame #" in line for line in err.splitlines())
    return code, took, headline + (f" [{frames} C++ frame lines in its stderr]" if frames else "")


def port_taken_run(ranks: int, hang_timeout: str) -> tuple[list[tuple[int, float, str]], int]:
    """Both launchers started while a listener that never answers holds the port: per node (its exit code,
    seconds from its start to its exit, the first line of its stderr), and how many ranks started."""
    tmp = Path(tempfile.mkdtemp(prefix="accel_port_taken_"))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(8)  # connections wait in the backlog and are never answered: as a hung program's would
        launchers, out = start_nodes(tmp, str(holder.getsockname()[1]), ranks, hang_timeout)
        started = time.monotonic()
        ended: dict[int, float] = {}
        try:
            while len(ended) < 2:
                for node, p in enumerate(launchers):
                    if node not in ended and p.poll() is not None:
                        ended[node] = time.monotonic() - started
                if time.monotonic() - started > 600:
                    raise SystemExit(f"a launcher was still running after 600 s; see {tmp}")
                time.sleep(0.05)
        finally:
            for p in launchers:
                if p.poll() is None:
                    p.kill()
    results = []
    for node, p in enumerate(launchers):
        lines = (tmp / f"stderr-{node}").read_text().splitlines()
        first = (lines[0] if lines else "(nothing)") + (f" [+{len(lines) - 1} more lines]" if len(lines) > 1 else "")
        results.append((p.returncode, ended[node], first))
    return results, len(list(out.glob("pid-*")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fault = parser.add_mutually_exclusive_group(required=True)
    fault.add_argument("--lost", type=int, choices=(0, 1), help="the node whose launcher is killed")
    fault.add_argument("--port_taken", action="store_true", help="a listener that never answers holds the port")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--hang_timeout", default="6")
    args = parser.parse_args()
    if args.port_taken:
        taken(args)
        return
    times = []
    for run in range(args.runs):
        code, took, headline = one_run(args.lost, args.ranks, args.hang_timeout)
        times.append(took)
        print(f"run {run + 1}: exit {code} after {took:.1f} s: {headline}", flush=True)
    print(f"median {statistics.median(times):.1f} s (node {args.lost} lost, {args.ranks} ranks)")


def taken(args: argparse.Namespace) -> None:
    """The ``--port_taken`` runs and each node's range of seconds to its exit."""
    times: dict[int, list[float]] = {0: [], 1: []}
    for run in range(args.runs):
        results, ranks_started = port_taken_run(args.ranks, args.hang_timeout)
        for node, (code, took, first) in enumerate(results):
            times[node].append(took)
            print(f"run {run + 1}, node {node}: exit {code} after {took:.1f} s: {first}", flush=True)
        print(f"run {run + 1}: {ranks_started} rank(s) started", flush=True)
    for node, spent in times.items():
        print(f"node {node}: median {statistics.median(spent):.1f} s ({min(spent):.1f}\u2013{max(spent):.1f}) from its start to its exit")


if __name__ == "__main__":
    main()
