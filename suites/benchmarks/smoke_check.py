"""`accel test` against `accelerate test`: wall time of the whole command, in one run.

Each pair runs both commands one after the other, in alternating order (drift on the machine hits
both alike), each as a fresh process from the same working folder and environment. The ratio of
each pair (accel / accelerate) is the figure; the report gives the medians, the median ratio with a
distribution-free 95 % confidence interval, and the host's load. ``--processes N`` gives both
commands one config file for N CPU processes (``accelerate test`` takes nothing else); without it
both use their defaults (no config: one process). ``--floor`` adds torch's own share of any such
command: a process that imports torch (a launcher) and then one that imports torch and builds an
optimizer (a rank: the first optimizer imports ``torch._dynamo``), one after the other.

    python suites/benchmarks/smoke_check.py [--pairs 9] [--processes 2] [--floor] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import median_interval  # noqa: E402  (a script beside this one)

COMMANDS = ("accel", "accelerate")
#: torch's share of a launched smoke check: a launcher's import, then a rank's import and first optimizer
FLOOR = ("import torch", "import torch; torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)")


def config_text(processes: int) -> str:
    """An Accelerate-format config file for ``processes`` CPU processes on this machine."""
    kind = "MULTI_CPU" if processes > 1 else "NO"
    return (f"compute_environment: LOCAL_MACHINE\ndistributed_type: {kind}\nuse_cpu: true\nnum_machines: 1\n"
            f"machine_rank: 0\nnum_processes: {processes}\nmixed_precision: 'no'\n")


def command(name: str, config: str | None) -> list[str]:
    """The command line of one run: the console script beside this interpreter, ``test``, the config."""
    script = Path(sys.executable).with_name(name)
    base = [str(script)] if script.exists() else [shutil.which(name) or name]
    return base + ["test"] + (["--config_file", config] if config else [])


def timed(argv: list[str], cwd: str) -> float:
    """Wall seconds of one run; raises RuntimeError with its output's tail when it fails."""
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-2000:]}")
    return seconds


def floor_seconds(cwd: str) -> float:
    """Wall seconds of :data:`FLOOR`'s two processes, one after the other."""
    return sum(timed([sys.executable, "-c", code], cwd) for code in FLOOR)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=9, help="pairs of runs (default 9)")
    parser.add_argument("--processes", type=int, default=0, help="processes for both (a config file); 0: defaults")
    parser.add_argument("--floor", action="store_true", help="also time torch's own share (see the module docstring)")
    parser.add_argument("--json", metavar="FILE", help="also write the samples and the summary here")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.processes < 0:
        parser.error("--pairs must be at least 1 and --processes 0 or more")
    with tempfile.TemporaryDirectory(prefix="smoke-check-") as folder:
        config = None
        if args.processes:
            config = os.path.join(folder, "config.yaml")
            Path(config).write_text(config_text(args.processes), encoding="utf-8")
        names = COMMANDS + (("floor",) if args.floor else ())
        samples: dict[str, list[float]] = {name: [] for name in names}
        ratios = []
        for pair in range(args.pairs):
            order = names if pair % 2 == 0 else names[::-1]
            got = {name: floor_seconds(folder) if name == "floor" else timed(command(name, config), folder) for name in order}
            for name in names:
                samples[name].append(got[name])
            ratios.append(got["accel"] / got["accelerate"])
    low, high = median_interval(ratios)
    summary = {
        "pairs": args.pairs, "processes": args.processes or "default",
        "median_s": {name: statistics.median(values) for name, values in samples.items()},
        "ratio": statistics.median(ratios), "ratio_ci95": [low, high], "loadavg": os.getloadavg(),
    }
    print(f"accel test vs accelerate test, {args.pairs} pairs, processes {summary['processes']}: "
          f"accel {summary['median_s']['accel']:.2f} s, accelerate {summary['median_s']['accelerate']:.2f} s (medians); "
          f"ratio {summary['ratio']:.2f} (95 % CI {low:.2f}-{high:.2f}); "
          + (f"torch's floor {summary['median_s']['floor']:.2f} s; " if args.floor else "")
          + f"load average {', '.join(f'{v:.2f}' for v in summary['loadavg'])}")
    if args.json:
        Path(args.json).write_text(json.dumps({"samples": samples, "ratios": ratios, **summary}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
