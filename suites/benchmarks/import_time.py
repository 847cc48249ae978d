"""How much CPU time importing accel adds on top of ``import torch``.

Each sample is a fresh interpreter that imports torch first, then times the statement under test
with ``time.process_time`` (CPU time of that process, so a busy machine inflates it less than wall
time). Samples alternate between statements so drift hits all of them alike; the median is reported.

Bytecode: by default the children inherit this environment. Where ``PYTHONDONTWRITEBYTECODE`` is set
and no ``.pyc`` files exist, every import compiles its module's source first, so the figures include
compilation. ``--cached-bytecode`` measures what an installed package costs instead: the children
write and read bytecode under a private cache folder (``PYTHONPYCACHEPREFIX``), filled by one
unmeasured run of each statement first. The report says which mode ran.

    python suites/benchmarks/import_time.py [--runs 21] [--only accel] [--cached-bytecode] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

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


def child_env(pycache: str | None) -> dict[str, str]:
    """The children's environment: this one, or with bytecode written to and read from ``pycache``."""
    env = dict(os.environ)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def sample(stmt: str, env: dict[str, str]) -> float | None:
    """CPU seconds ``stmt`` takes in a fresh interpreter after ``import torch``; None when it fails."""
    proc = subprocess.run([sys.executable, "-c", CHILD.format(stmt=stmt)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return None
    return float(proc.stdout.strip().splitlines()[-1])


def bytecode_mode(cached: bool) -> str:
    """A line saying whether the samples include compiling source to bytecode."""
    if cached:
        return "bytecode cached (as installed)"
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return "PYTHONDONTWRITEBYTECODE set: modules without a .pyc are compiled on every import"
    return "bytecode as this environment writes it"


def main(argv: list[str] | None = None) -> int:
    """Sample every statement whose package is importable, alternating, and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--only", choices=sorted({pkg for pkg, _ in STATEMENTS.values()}),
                        help="time only the statements of this package")
    parser.add_argument("--cached-bytecode", action="store_true",
                        help="children read bytecode from a private cache filled before sampling")
    parser.add_argument("--json", help="write the samples and medians here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")

    cases = {name: stmt for name, (pkg, stmt) in STATEMENTS.items()
             if (args.only is None or pkg == args.only) and importlib.util.find_spec(pkg)}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    failed: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="accel-import-pycache-") as pycache:
        env = child_env(pycache if args.cached_bytecode else None)
        if args.cached_bytecode:
            for stmt in cases.values():
                sample(stmt, env)  # fills the cache; not measured
        for _ in range(args.runs):
            for name, stmt in cases.items():
                if name in failed:
                    continue
                value = sample(stmt, env)
                if value is None:
                    failed.add(name)
                else:
                    samples[name].append(value)

    result = {}
    print(f"CPU time added on top of `import torch` (median of {args.runs} fresh interpreters; "
          f"{bytecode_mode(args.cached_bytecode)}):")
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
