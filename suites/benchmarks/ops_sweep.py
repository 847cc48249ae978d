"""Speed of the operator sweep: cases per second, and its cost over a hand-written loop of the same work.

Runs, alternating, N times each on one backend:

- ``sweep``: ``accel ops --quick --no-census -n 1`` (one worker: like for like with the loop), a
  whole process from start to files written;
- ``loop``: this script as a child that imports torch's OpInfo database, loads the backend and runs
  the same samples (the quick plan's entries and dtypes, three samples each) in a bare loop: each
  sample copied to the host with ``.to("cpu")``, the operator called on both, the results compared
  with ``torch.testing.assert_close``, every exception caught; no isolation, no records;
- with ``--workers N``: ``accel ops --quick -n N`` too (both cores).

Prints each figure's median with its spread, the ratio sweep/loop (the sweep's own overhead), and
the cases per second of each. The load average is printed with the figures: on a shared machine it
moves them more than most changes do.

    python suites/benchmarks/ops_sweep.py --backend emu [--repeats 3] [--workers 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _bare_loop(backend_name: str) -> int:
    """The hand-written baseline: the quick plan's samples, host against device, in one plain loop."""
    import itertools
    import warnings

    import torch

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    from torch.testing._internal.common_methods_invocations import op_db

    from accel.backends import get_registry
    from accel_harness.ops.catalog import claimed_dtypes, make_plan
    from accel_harness.ops.plan import QUICK

    backend = get_registry().select(backend_name)
    device = backend.device(0)
    claimed = [name for name, why in claimed_dtypes(backend, device).items() if not why]
    tasks, _ = make_plan(QUICK, backend.device_type, claimed)
    cases = 0
    for task in tasks:
        entry = op_db[task.index]
        dtype = getattr(torch, task.dtype)
        try:
            samples = list(itertools.islice(entry.sample_inputs(device, dtype), task.limit))
        except Exception:
            continue
        for sample in samples:
            cases += 1
            try:
                host = sample.transform(lambda t: t.to("cpu") if isinstance(t, torch.Tensor) else t)
                expected = entry(host.input, *host.args, **host.kwargs)
                actual = entry(sample.input, *sample.args, **sample.kwargs)
                torch.testing.assert_close(actual, expected, check_device=False, equal_nan=True)
            except Exception:
                pass
    return cases


def _timed(command: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return elapsed, done.stdout


def _cases(out_dir: str) -> int:
    with open(os.path.join(out_dir, "summary.json"), encoding="utf-8") as handle:
        return int(json.load(handle)["cost"]["cases"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="also time the sweep with this many workers")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--bare-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_child:
        print(f"cases {_bare_loop(args.backend)}")
        return 0
    figures: dict[str, list[float]] = {"sweep": [], "loop": []}
    cases: dict[str, int] = {}
    if args.workers:
        figures[f"sweep-{args.workers}w"] = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.repeats):
            for name in figures:
                if name == "loop":
                    elapsed, out = _timed([sys.executable, __file__, "--backend", args.backend, "--bare-child"])
                    cases[name] = int(out.split()[-1])
                else:
                    folder = os.path.join(scratch, f"{name}-{round_}")
                    workers = "1" if name == "sweep" else str(args.workers)
                    elapsed, _ = _timed([sys.executable, "-m", "accel.commands.cli", "ops", "--backend", args.backend,
                                         "--quick", "--no-census", "-n", workers, "-o", folder])
                    cases[name] = _cases(folder)
                figures[name].append(elapsed)
                print(f"round {round_ + 1} {name}: {elapsed:.1f} s, {cases[name]} cases (load {os.getloadavg()[0]:.2f})", flush=True)
    result = {"backend": args.backend, "repeats": args.repeats, "load": os.getloadavg()[0], "figures": {}}
    for name, values in figures.items():
        median = statistics.median(values)
        result["figures"][name] = {"median_s": median, "min_s": min(values), "max_s": max(values), "cases": cases[name],
                                   "cases_per_s": cases[name] / median}
        print(f"{name:>10}: median {median:.1f} s (min {min(values):.1f}, max {max(values):.1f}), "
              f"{cases[name]} cases, {cases[name] / median:.0f} cases/s")
    ratio = statistics.median(figures["sweep"]) / statistics.median(figures["loop"])
    result["ratio_sweep_over_loop"] = ratio
    print(f"sweep / loop (one worker each, whole processes): {ratio:.2f}x; load average {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
