"""How long the harness takes to start a pool of ranks: spawned ranks against ranks forked from a fork server.

A spawn-only device pays a fresh interpreter and a torch import per rank; a backend that allows it
(``fork_server_ranks``) forks its ranks from a server that imported torch once. Each sample is a fresh
interpreter that starts the same pool twice (ranks joined in a process group, then closed): the first
start includes the fork server's own start, the second is what every later pool of the session costs.
Samples alternate between the two start methods so drift on a shared machine hits both alike; the
median and the minimum are reported.

    python suites/benchmarks/rank_start.py --backend emu [--world-size 2] [--samples 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = """
import json, sys, time
from accel_harness.distributed import RankPool

def main():
    times = []
    for _ in range(2):
        start = time.perf_counter()
        pool = RankPool({backend!r}, {world}, {method!r}, timeout=600, start_timeout=600)
        pool.start()
        times.append(time.perf_counter() - start)
        pool.close()
    print(json.dumps(times))

if __name__ == "__main__":
    main()
"""


def sample(backend: str, world: int, method: str) -> list[float]:
    """One fresh interpreter's two pool starts (seconds) with ``method``."""
    code = CHILD.format(backend=backend, world=world, method=method)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"a {method} pool of {backend} failed to start:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="emu")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--json", help="write the samples and summary here")
    args = parser.parse_args(argv)
    methods = ("spawn", "forkserver")
    runs: dict[str, list[list[float]]] = {method: [] for method in methods}
    sample(args.backend, args.world_size, "spawn")  # unmeasured: builds or loads caches both methods share
    for _ in range(args.samples):
        for method in methods:
            runs[method].append(sample(args.backend, args.world_size, method))
    summary = {}
    for method in methods:
        first = [times[0] for times in runs[method]]
        later = [times[1] for times in runs[method]]
        summary[method] = {"first_median_s": statistics.median(first), "first_min_s": min(first),
                           "later_median_s": statistics.median(later), "later_min_s": min(later)}
        print(f"{method:>10}: first pool {summary[method]['first_median_s']:.2f} s (min {min(first):.2f}), "
              f"later pools {summary[method]['later_median_s']:.2f} s (min {min(later):.2f})")
    ratio = summary["forkserver"]["later_median_s"] / summary["spawn"]["later_median_s"]
    print(f"later pools, forkserver / spawn: {ratio:.2f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"backend": args.backend, "world_size": args.world_size, "runs": runs, "summary": summary}, handle,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
