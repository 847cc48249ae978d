"""`accel bench`: run the throughput benchmarks for one backend and keep the pytest-benchmark JSON.

Runs ``pytest <checkout>/suites/benchmarks --backend NAME -m NAME`` in a child process (pytest's
verbose output is the progress display), with ``--benchmark-json`` into the results folder and
``--benchmark-save-data``, so every benchmark's raw per-round times (``stats.data``) are kept. Then
prints where the JSON is and a table of throughputs (with ``--repeat N``: one column per run and
the spread between runs). ``--quick`` sets ``ACCEL_BENCH_QUICK=1``: smaller problems and fewer
rounds, for smoke runs; the JSON records it (``extra_info["quick"]``), the output says QUICK on
every table, and ``accel report`` never compares a quick run with a full one.

A benchmark whose rounds spread too wide to judge (interquartile range of the round times over
their median above :data:`accel_reports.analyse.benchmarks.NOISY_SPREAD`, 25 %) is marked ``!`` in the
table and named in a warning on stderr, with the load average: its median is not a figure to
compare on its own (the history rule in ``accel report`` needs a second run to confirm it). The exit status is pytest's when it failed (a benchmark failed, nothing
matched ``-k``, ...), 1 when no benchmark recorded anything, else 0.

The suites are part of the accel source checkout, found next to the installed ``accel`` package
(an editable install) or given with ``--suites``.
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
from pathlib import Path
from typing import Any

from accel.commands import RESULTS_DIR, UsageError

QUICK_ENV = "ACCEL_BENCH_QUICK"
THREADS_ENV = "ACCEL_BENCH_THREADS"
SUITES_ENV = "ACCEL_BENCH_SUITES"
SET_ENV = "ACCEL_BENCH_SET"
#: --set choices; core selects the suites' ``bench_core`` marker (suites/benchmarks/conftest.py's CORE_SET)
BENCH_SETS = ("all", "core")
CORE_MARKER = "bench_core"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run accel's throughput benchmarks (pytest-benchmark suites in suites/benchmarks) for one backend, "
        "write their JSON into the results folder and print a table of throughputs."
    )
    parser.add_argument("--backend", metavar="NAME", help="backend to benchmark (default: the detected one)")
    parser.add_argument("--quick", action="store_true", help="smoke run: smaller problems, fewer rounds")
    parser.add_argument("--set", dest="bench_set", choices=BENCH_SETS, default="all",
                        help="which benchmarks: all (default), or core: the standard set, one headline figure per "
                             "area at full size (what accel qualify runs unless --thorough)")
    parser.add_argument("--results-dir", metavar="DIR", default=RESULTS_DIR,
                        help=f"folder for bench-<timestamp>.json (default ./{RESULTS_DIR}, where every accel command "
                             "writes when not told otherwise)")
    parser.add_argument("-k", dest="keyword", metavar="EXPR", help="only benchmarks matching this pytest -k expression")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run the suites N times (one JSON each) and show the spread between runs")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="torch threads in the benchmarking process (default: torch's choice); recorded in the results")
    parser.add_argument("--suites", metavar="DIR", help=f"benchmark suites folder (default: ${SUITES_ENV}, else the suites shipped with accel)")


def locate_suites(explicit: str | None = None) -> Path:
    """The benchmark suites folder: ``explicit``, ``$ACCEL_BENCH_SUITES``, else the shipped (or checkout) suites."""
    from accel_harness.suites_location import SuitesNotFound, benchmarks_root

    given = explicit or os.environ.get(SUITES_ENV)
    if given:
        path = Path(given).expanduser().resolve()
        if not path.is_dir():
            raise UsageError(f"benchmark suites folder {path} does not exist")
        return path
    try:
        return benchmarks_root()
    except SuitesNotFound as exc:
        raise UsageError(f"{exc} (or pass --suites DIR, or set {SUITES_ENV})") from None


def _backend_name(requested: str | None) -> str:
    from accel.backends import get_registry

    registry = get_registry()
    if requested is None:
        return registry.select().name
    name = requested.strip().lower()
    if name not in registry.names():
        raise UsageError(f"unknown backend {requested!r}; known backends: {', '.join(registry.names())}")
    from accel.backends import BackendError

    try:
        registry.select(name)  # asked for by name: a plug-in that loads only when requested loads now
    except BackendError as exc:
        raise UsageError(f"backend {name!r} is not available here: {exc}") from None
    return name


def _output_path(results_dir: Path, stamp: str, run: int, repeat: int) -> Path:
    stem = f"bench-{stamp}" + (f"-run{run}" if repeat > 1 else "")
    path, n = results_dir / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = results_dir / f"{stem}-{n}.json"
    return path


def pytest_command(suites: Path, backend: str, json_path: Path, keyword: str | None = None,
                   bench_set: str = "all") -> list[str]:
    """The pytest command line of one benchmark run (``bench_set`` core: only the standard set)."""
    marks = backend if bench_set == "all" else f"{backend} and {CORE_MARKER}"
    cmd = [sys.executable, "-m", "pytest", str(suites), "-p", "no:cacheprovider", "-v", "--no-header",
           "--backend", backend, "-m", marks, "--benchmark-json", str(json_path), "--benchmark-save-data",
           "--benchmark-quiet"]
    if keyword:
        cmd += ["-k", keyword]
    return cmd


def _load(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    if not text.strip():
        return []
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        print(f"accel bench: {path} is not valid JSON ({exc}); ignored", file=sys.stderr)
        return []
    return [b for b in doc.get("benchmarks", []) if isinstance(b, dict)]


def _figure(bench: dict[str, Any]) -> tuple[float | None, str]:
    extra = bench.get("extra_info") or {}
    value = extra.get("throughput")
    if isinstance(value, (int, float)):
        return float(value), str(extra.get("unit") or "")
    median = (bench.get("stats") or {}).get("median")
    return (float(median), "s (median)") if isinstance(median, (int, float)) else (None, "")


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or 0.01 <= abs(value) < 1e6:
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:.3e}"


def _spread(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return None
    middle = statistics.median(present)
    return (max(present) - min(present)) / middle if middle else None


def _pct(value: float | None) -> str:
    return f"{value:.1%}" if value is not None else "-"


def _relative_iqr(bench: dict[str, Any]) -> float | None:
    from accel_reports.analyse.noise import spread_of

    return spread_of(bench)


def _is_quick(benches: list[dict[str, Any]]) -> bool:
    return any((b.get("extra_info") or {}).get("quick") is True for b in benches)


def too_noisy(benches: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """``(name, spread)`` of the benchmarks of one run whose rounds spread too wide to judge, noisiest
    first (:func:`accel_reports.analyse.noise.noisy_benchmarks`, the count the report gives too)."""
    from accel_reports.analyse.noise import noisy_benchmarks

    return noisy_benchmarks(benches)


def noise_warning(runs: list[list[dict[str, Any]]], loadavg: str | None = None) -> str | None:
    """The warning printed when benchmarks of the last run spread too wide to judge (None when none did)."""
    from accel_reports.analyse.noise import NOISY_SPREAD, spread_text

    if not runs:
        return None
    noisy = too_noisy(runs[-1])
    if not noisy:
        return None
    names = ", ".join(f"{name} ({spread_text(spread)})" for name, spread in noisy)
    return (f"accel bench: WARNING: {len(noisy)} of {len(runs[-1])} benchmarks spread too wide to judge "
            f"(IQR of the rounds > {NOISY_SPREAD:.0%} of the median): {names}. Their medians are not reliable "
            f"figures: the machine was busy{f' (load average {loadavg})' if loadavg else ''}. "
            "Rerun on a quieter machine (or with --threads 1); accel report calls a regression only when the "
            "next run confirms it.")


def summary_table(runs: list[list[dict[str, Any]]]) -> str:
    """Throughput per benchmark (one column per run) and, for several runs, their spread.

    With several runs, benchmarks that carry a host probe of their ``host_bound`` kind also show how
    far the probe moved between the runs (``host``) and the spread of their throughput relative to
    the probe (``vs host``): a large raw spread with a small ``vs host`` one is the machine drifting.
    """
    from accel_reports.analyse.benchmarks import host_reference_value
    from accel_reports.analyse.noise import NOISY_SPREAD as noisy_limit, is_too_noisy, spread_text

    names: dict[str, None] = {}
    by_run: list[dict[str, dict[str, Any]]] = []
    for benches in runs:
        table = {str(b.get("name") or b.get("fullname")): b for b in benches}
        by_run.append(table)
        names.update(dict.fromkeys(table))
    if not names:
        return "(no benchmark results)"
    width = max(len("benchmark"), *(len(n) for n in names))
    several = len(runs) > 1
    quick = any(_is_quick(benches) for benches in runs)
    head = f"{'benchmark':<{width}}  " + "  ".join(f"{('run ' + str(i + 1)) if several else 'throughput':>12}" for i in range(len(runs)))
    head += f"  {'unit':<10} {'rounds':>6} {'IQR':>6}" + (f" {'spread':>7} {'host':>7} {'vs host':>7}" if several else "")
    lines = [head, "-" * len(head)]
    if quick:
        lines.insert(0, "QUICK RUN (--quick: smaller problems, fewer rounds): these figures are compared only with "
                        "other quick runs, never with full ones")
    for name in names:
        values, hosts, unit, rounds, iqr = [], [], "", "", ""
        for table in by_run:
            bench = table.get(name)
            value, u = _figure(bench) if bench else (None, "")
            values.append(value)
            # only a throughput follows the host probe by division; a time fallback gets no host columns
            throughput = bench is not None and u != "s (median)"
            hosts.append(host_reference_value(bench.get("extra_info") or {}) if throughput else None)
            unit = unit or u
            if bench:
                stats = bench.get("stats") or {}
                rounds = str(stats.get("rounds", ""))
                spread = _relative_iqr(bench)
                iqr = "" if spread is None else spread_text(spread) + ("!" if is_too_noisy(spread) else "")
        row = f"{name:<{width}}  " + "  ".join(f"{_fmt(v):>12}" for v in values) + f"  {unit:<10} {rounds:>6} {iqr:>6}"
        if several:
            relative = [v / h if v is not None and h else None for v, h in zip(values, hosts)]
            host_known = all(h is not None for h in hosts)
            row += (f" {_pct(_spread(values)):>7} {_pct(_spread(hosts) if host_known else None):>7}"
                    f" {_pct(_spread(relative) if host_known else None):>7}")
        lines.append(row)
    if several:
        lines.append("spread = (max - min) / median of the runs' throughputs; IQR = interquartile range of the last "
                     "run's round times over their median; host = spread of the host probe of the benchmark's kind "
                     "(compute or memory) between the runs; vs host = spread of throughput / host probe")
        lines.extend(_host_lines(by_run))
    else:
        lines.append("throughput from the median round; IQR = interquartile range of the round times over their median")
    lines.append(f"! = rounds spread more than {noisy_limit:.0%} of the median: too noisy to judge on its own")
    return "\n".join(lines)


def _host_lines(by_run: list[dict[str, dict[str, Any]]]) -> list[str]:
    """One line per run: the median host probe over its benchmarks (when they carry one)."""
    out = []
    for i, table in enumerate(by_run, 1):
        probes = [(b.get("extra_info") or {}).get("host_reference") for b in table.values()]
        probes = [p for p in probes if isinstance(p, dict)]
        figures = {}
        for key, label in (("compute_gflops", "compute GFLOP/s"), ("memory_gbs", "memory GB/s")):
            values = [p[key] for p in probes if isinstance(p.get(key), (int, float))]
            if values:
                figures[label] = (statistics.median(values), min(values), max(values))
        if figures:
            out.append(f"host probe, run {i}: " + "; ".join(
                f"{label} {mid:,.1f} (min {lo:,.1f}, max {hi:,.1f})" for label, (mid, lo, hi) in figures.items()))
    return out


def _loadavg() -> str:
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {args.threads}")
    suites = locate_suites(args.suites)
    backend = _backend_name(args.backend)
    results_dir = Path(args.results_dir).expanduser().resolve()
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the results folder {results_dir}: {exc}") from None
    env = dict(os.environ)
    env[QUICK_ENV] = "1" if args.quick else "0"
    bench_set = getattr(args, "bench_set", "all")  # callers that build args themselves may leave it out
    env[SET_ENV] = bench_set
    if args.threads is not None:
        env[THREADS_ENV] = str(args.threads)
    env.pop("PYTEST_ADDOPTS", None)  # an inherited -n would turn every benchmark into a skip
    env["PYTHONSAFEPATH"] = "1"  # a folder named pytest or accel in the working folder cannot shadow the real ones
    repo = suites.parent.parent if (suites.parent.parent / "pyproject.toml").is_file() else suites
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    chosen = " (the core set)" if bench_set == "core" else ""
    print(f"accel bench: backend {backend}{chosen}{' (QUICK run: smaller problems, fewer rounds)' if args.quick else ''}, suites {suites}, "
          f"{args.repeat} run(s); load average {_loadavg()}", flush=True)

    worst = 0
    paths: list[Path] = []
    runs: list[list[dict[str, Any]]] = []
    started = time.perf_counter()
    for i in range(1, args.repeat + 1):
        path = _output_path(results_dir, stamp, i, args.repeat)
        if args.repeat > 1:
            print(f"\naccel bench: run {i} of {args.repeat}", flush=True)
        # pytest-benchmark makes its storage folder (./.benchmarks) at start even though the figures go to
        # --benchmark-json: a temporary one, so nothing is left in the working or the suites' folder
        with tempfile.TemporaryDirectory(prefix="accel-bench-storage-") as storage:
            command = pytest_command(suites, backend, path, args.keyword, bench_set) + [
                "--benchmark-storage", f"file://{storage}"]
            code = subprocess.call(command, cwd=repo, env=env)
        if code == 5:
            print(f"accel bench: no benchmark matched{' -k ' + repr(args.keyword) if args.keyword else ''}", file=sys.stderr)
        elif code not in (0,):
            print(f"accel bench: pytest exited with status {code} (see the failures above)", file=sys.stderr)
        worst = worst or code
        benches = _load(path)
        if benches:
            paths.append(path)
            runs.append(benches)
    print(f"\naccel bench: {time.perf_counter() - started:.0f} s; load average now {_loadavg()}")
    if not runs:
        print("accel bench: no benchmark recorded any result (every selected one failed or was skipped)", file=sys.stderr)
        return worst or 1
    print(summary_table(runs))
    for path in paths:
        print(f"results: {path}" + (" (quick)" if args.quick else ""))
    warning = noise_warning(runs, _loadavg())
    if warning:
        print(warning, file=sys.stderr)
    return worst
