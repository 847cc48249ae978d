"""Which host probe does each benchmark follow? Correlate throughput with the host probe over runs.

Usage: ``python suites/benchmarks/host_correlation.py results/bench-*.json``

Each benchmark of ``accel bench`` carries ``extra_info["host_reference"]`` (see
``host_reference.py``). Over several runs, taken at different times on a shared host, this prints
per benchmark the Pearson correlation of its throughput with the compute probe and with the
bracket's memory probe, next to the ``host_bound`` it declares. A benchmark whose figure follows a
probe closely (r near 1) moves with the machine; that is the evidence for its ``host_bound``.
Needs at least 3 runs with probes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def collect(paths: list[Path]) -> dict[str, list[tuple[float, float, float, str | None]]]:
    """name -> [(throughput, compute probe, memory probe (bracket), declared host_bound)] per run."""
    rows: dict[str, list[tuple[float, float, float, str | None]]] = {}
    for path in paths:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise SystemExit(f"host_correlation: cannot read {path}: {exc}") from None
        for bench in doc.get("benchmarks", []):
            extra = bench.get("extra_info") or {}
            probe = extra.get("host_reference")
            if not isinstance(probe, dict) or not isinstance(extra.get("throughput"), (int, float)):
                continue
            memory = probe.get("memory_gbs_bracket", probe.get("memory_gbs"))
            rows.setdefault(bench["name"], []).append(
                (float(extra["throughput"]), float(probe["compute_gflops"]), float(memory), extra.get("host_bound")))
    return rows


def correlations(values: list[tuple[float, float, float, str | None]]) -> tuple[float, float]:
    data = np.array([v[:3] for v in values], dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (float(np.corrcoef(data[:, 0], data[:, 1])[0, 1]), float(np.corrcoef(data[:, 0], data[:, 2])[0, 1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="accel bench JSON files (one per run)")
    args = parser.parse_args(argv)
    rows = collect(args.results)
    usable = {name: v for name, v in rows.items() if len(v) >= 3}
    if not usable:
        print("host_correlation: need at least 3 runs whose benchmarks carry a host probe", file=sys.stderr)
        return 2
    width = max(len(n) for n in usable)
    print(f"{'benchmark':<{width}}  runs  r(compute)  r(memory)  declared")
    for name, values in sorted(usable.items()):
        compute, memory = correlations(values)
        print(f"{name:<{width}}  {len(values):>4}  {compute:>+10.2f}  {memory:>+9.2f}  {values[-1][3] or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
