"""Times how long a pool of emu ranks takes to be ready and to finish its first test, by start method.

A rank's first test pays for what the rank has not imported yet: every torch optimizer imports
``torch._dynamo`` (about eight hundred modules) when it is built. Four ways to start the ranks, each
sample a fresh interpreter that starts the pool twice (the first start includes the fork server's):

- ``spawn``: a fresh interpreter per rank;
- ``forkserver-torch``: forked from a fork server that imported torch only (the harness before it
  preloaded more);
- ``forkserver``: forked from a fork server that imported the harness's list
  (``accel_harness.pool_preload``);
- ``forked-server``: forked from a fork server that is itself a fork of the calling process, which has
  imported the harness's list beforehand, untimed, as a test session's collection has
  (``accel_harness.forked_fork_server``: what a session that has not used the device gets).

The first test builds a model and an AdamW optimizer on the rank's device and takes one step. Samples
alternate between the methods so drift on a shared machine hits all alike; medians are printed.

    python plugins/accel-emu/tools/time_rank_start.py [--world-size 2] [--samples 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = """
import json, pickle, time
from multiprocessing import forkserver
from accel_harness import distributed
from accel_harness.distributed import RankPool, Task

def first_test(rank, device):
    import torch
    model = torch.nn.Linear(64, 64).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 64, device=device)).sum().backward()
    optimizer.step()

def main():
    method = {method!r}
    forked = method == "forked-server"
    if method == "forkserver-torch":
        distributed.fork_server_modules = lambda: ["torch"]
    if method != "spawn":
        method = "forkserver"
    if forked:  # a session has imported these by the end of its collection, untimed here as there
        import importlib
        for name in distributed.fork_server_modules():
            importlib.import_module(name)
    task = Task("_emu_rank_start_child", __file__, "first_test", pickle.dumps({{"rank": None, "device": None}}))
    times = []
    for index in range(2):
        start = time.perf_counter()
        if forked and index == 0:  # as the harness starts it in a session that has not used the device
            from accel_harness.pool_preload import start_fork_server
            assert start_fork_server(fork_this_process=True), "the server was not forked from this process"
        pool = RankPool("emu", {world}, method, timeout=600, start_timeout=600)
        pool.start()
        ready = time.perf_counter() - start
        result = pool.run(task)
        assert result.status == "passed", result.message
        times.append([ready, time.perf_counter() - start])
        pool.close()
    print(json.dumps(times))

if __name__ == "__main__":
    main()
"""

METHODS = ("spawn", "forkserver-torch", "forkserver", "forked-server")


def sample(world: int, method: str) -> list[list[float]]:
    """One fresh interpreter's two pools: [ready, ready + first test] seconds for each."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "_emu_rank_start_child.py")  # the ranks import the test from this file
        with open(script, "w") as handle:
            handle.write(CHILD.format(world=world, method=method))
        done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        raise SystemExit(f"a {method} pool of emu failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args(argv)
    runs: dict[str, list[list[list[float]]]] = {method: [] for method in METHODS}
    sample(args.world_size, "spawn")  # unmeasured: loads the build and warms the file cache for all
    for _ in range(args.samples):
        for method in METHODS:
            runs[method].append(sample(args.world_size, method))
    print(f"emu, {args.world_size} ranks, median of {args.samples}; load average {os.getloadavg()[0]:.1f}")
    for method in METHODS:
        for index, label in ((0, "first pool"), (1, "later pool")):
            ready = statistics.median(times[index][0] for times in runs[method])
            first = statistics.median(times[index][1] for times in runs[method])
            print(f"{method:>17} {label}: ready {ready:.2f} s, ready + first test {first:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
