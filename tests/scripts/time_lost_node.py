"""Time `accel launch`'s verdict when a whole node is lost (the lost-node rows of docs/launch.md's fault table).

Starts two simulated nodes (two launchers on 127.0.0.1, static rendezvous) on fault_rank.py, waits for every
rank's ``ready-N`` file, SIGKILLs one node's launcher (its ranks die with it) and times the other launcher
from the signal to its exit; prints, per run, the exit code, the seconds and the verdict's first line.

    python tests/scripts/time_lost_node.py --lost 1 --runs 3 [--ranks 4] [--hang_timeout 6]

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


def one_run(lost: int, ranks: int, hang_timeout: str) -> tuple[int, float, str]:
    """(the survivor's exit code, seconds from the SIGKILL to its exit, its verdict's first line)."""
    tmp = Path(tempfile.mkdtemp(prefix="accel_lost_node_"))
    out = tmp / "out"
    out.mkdir()
    env = dict(os.environ, ACCEL_TEST_OUT=str(out), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    for name in ("ACCEL_DEVICE", "ACCEL_CONFIG_FILE", "ACCEL_HANG_TIMEOUT"):
        env.pop(name, None)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    common = ["--cpu", "--num_processes", str(ranks), "--hang_timeout", hang_timeout, "--num_machines", "2",
              "--main_process_ip", "127.0.0.1", "--main_process_port", port]
    launchers = []
    for node in range(2):
        with open(tmp / f"stderr-{node}", "w") as err:
            launchers.append(subprocess.Popen(
                [sys.executable, "-m", "accel.commands.cli", "launch", *common, "--machine_rank", str(node), str(FAULT)],
                env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=err))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lost", type=int, choices=(0, 1), required=True, help="the node whose launcher is killed")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--hang_timeout", default="6")
    args = parser.parse_args()
    times = []
    for run in range(args.runs):
        code, took, headline = one_run(args.lost, args.ranks, args.hang_timeout)
        times.append(took)
        print(f"run {run + 1}: exit {code} after {took:.1f} s: {headline}", flush=True)
    print(f"median {statistics.median(times):.1f} s (node {args.lost} lost, {args.ranks} ranks)")


if __name__ == "__main__":
    main()
