"""How much CPU time importing accel adds on top of ``import torch``.

Each sample is a fresh interpreter that imports torch first, then times the statement under test
with ``time.process_time`` (CPU time of that process, so a busy machine inflates it less than wall
time). Samples alternate between statements so drift hits all of them alike; the median is reported.

    python suites/benchmarks/import_time.py [--runs 21] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys

CHILD = """
import time, torch
t0 = time.process_time()
{stmt}
print(time.process_time() - t0)
"""

STATEMENTS = {
    "import accel": ("accel", "import accel"),
    "import accel.backends + select": ("accel", "import accel.backends as b; b.get_backend()"),
    "from accel import Accelerator": ("accel", "from accel import Accelerator"),
    "import accelerate": ("accelerate", "import accelerate"),
    "from accelerate import Accelerator": ("accelerate", "from accelerate import Accelerator"),
}


def sample(stmt: str) -> float | None:
    proc = subprocess.run([sys.executable, "-c", CHILD.format(stmt=stmt)], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    return float(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--json", help="write the samples and medians here")
    args = parser.parse_args(argv)

    cases = {name: stmt for name, (pkg, stmt) in STATEMENTS.items() if importlib.util.find_spec(pkg)}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    failed: set[str] = set()
    for _ in range(args.runs):
        for name, stmt in cases.items():
            if name in failed:
                continue
            value = sample(stmt)
            if value is None:
                failed.add(name)
            else:
                samples[name].append(value)

    result = {}
    print(f"CPU time added on top of `import torch` (median of {args.runs} fresh interpreters):")
    for name in cases:
        if name in failed:
            print(f"  {name:<36} (not importable yet)")
            continue
        med = statistics.median(samples[name]) * 1000
        lo, hi = min(samples[name]) * 1000, max(samples[name]) * 1000
        result[name] = {"median_ms": med, "min_ms": lo, "max_ms": hi, "samples_s": samples[name]}
        print(f"  {name:<36} {med:7.1f} ms   (min {lo:.1f}, max {hi:.1f})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
