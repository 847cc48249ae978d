"""`accel qualify`: the main job — qualify this machine's backend(s) and leave a report behind.

Runs the conformance suites for the detected (or chosen) backend(s) into a fresh results folder,
then the benchmarks (``accel bench``), then renders the report (``accel report``), and prints where
everything is. Each step runs as its own process, so one step's crash cannot hide another's results.

Exit status: 0 when the suites passed, 1 when any suite test failed (or a step crashed), 2 for a
usage error (e.g. the results folder exists and is not empty).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

from accel.commands import UsageError


def suites_dir() -> Path:
    """The conformance suites: ``$ACCEL_SUITES_DIR``, else ``suites/`` beside the accel package."""
    configured = os.environ.get("ACCEL_SUITES_DIR")
    candidates = [Path(configured)] if configured else []
    candidates.append(Path(__file__).resolve().parents[2] / "suites")
    for path in candidates:
        if path.is_dir():
            return path
    raise UsageError(
        "cannot find the conformance suites (looked in: " + ", ".join(str(p) for p in candidates)
        + "); run from an accel checkout or set ACCEL_SUITES_DIR"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Run the conformance suites, the benchmarks and the report for this machine's backend(s)."
    parser.add_argument("--backend", action="append", metavar="NAME",
                        help="backend(s) to qualify (repeatable; default: the detected backend; 'auto': every available one)")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="fresh folder for everything (default: ./qualify-<UTC timestamp>)")
    parser.add_argument("-n", "--workers", type=int, default=0, metavar="N",
                        help="pytest-xdist workers for the suites (default 0: one process)")
    parser.add_argument("-k", metavar="EXPR", help="only run suite tests matching this pytest -k expression")
    parser.add_argument("--known-issues", metavar="YAML", help="known-issues file for the suites and the report")
    parser.add_argument("--dist-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="timeout of one multi-process test (default 120)")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmarks")
    parser.add_argument("--quick", action="store_true", help="quick benchmarks (smoke run)")


def _selected_backends(requested: list[str] | None) -> list[str]:
    from accel.backends import BackendError, get_registry

    registry = get_registry()
    try:
        if not requested:
            return [registry.select().name]
        names: list[str] = []
        for value in requested:
            for name in (v.strip().lower() for v in value.split(",") if v.strip()):
                if name == "auto":
                    names.extend(b.name for b in registry.available())
                else:
                    registry.select(name)  # unknown or unavailable: a clear error
                    names.append(name)
        return list(dict.fromkeys(names))
    except BackendError as exc:
        raise UsageError(str(exc)) from None


def _step(title: str, command: list[str], log: Path) -> int:
    print(f"accel qualify: {title} ...", flush=True)
    start = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as fh:
        proc = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, env=env)
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    print(f"accel qualify: {title}: exit {proc.returncode} in {time.perf_counter() - start:.1f}s — {tail[0]}", flush=True)
    return proc.returncode


def run(args: argparse.Namespace) -> int:
    backends = _selected_backends(args.backend)
    suites = suites_dir()
    out = Path(args.output or f"qualify-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}").resolve()
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} already exists and is not empty: qualify writes into a fresh folder")
    if args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}")
    if args.known_issues and not os.path.isfile(args.known_issues):
        raise UsageError(f"known-issues file not found: {args.known_issues}")
    results, logs = out / "results", out / "logs"
    results.mkdir(parents=True)
    logs.mkdir()
    print(f"accel qualify: backends {', '.join(backends)}; suites {suites}; output {out}", flush=True)

    pytest_cmd = [
        sys.executable, "-m", "pytest", str(suites), "-p", "no:cacheprovider", "-q", "-rfE",
        "--ignore", str(suites / "benchmarks"),
        "-m", " or ".join(backends),
        "--results-dir", str(results), "--junitxml", str(results / "junit.xml"),
        "--dist-timeout", f"{args.dist_timeout:g}",
    ]
    for name in backends:
        pytest_cmd += ["--backend", name]
    if args.workers:
        pytest_cmd += ["-n", str(args.workers)]
    if args.k:
        pytest_cmd += ["-k", args.k]
    if args.known_issues:
        pytest_cmd += ["--known-issues", args.known_issues]
    suite_code = _step("conformance suites", pytest_cmd, logs / "suites.log")
    status = 0 if suite_code == 0 else 1

    artefacts = [("suite results", results), ("suite log", logs / "suites.log")]
    if not args.no_bench and importlib.util.find_spec("accel.commands.bench"):
        bench_dir = out / "bench"
        for name in backends:
            cmd = [sys.executable, "-m", "accel.commands.cli", "bench", "--backend", name, "--results-dir", str(bench_dir)]
            if args.quick:
                cmd.append("--quick")
            if _step(f"benchmarks ({name})", cmd, logs / f"bench-{name}.log") != 0:
                status = 1
        artefacts += [("benchmarks", bench_dir)]
    if importlib.util.find_spec("accel.commands.report"):
        report_dir = out / "report"
        inputs = [str(results)] + ([str(out / "bench")] if (out / "bench").is_dir() else [])
        cmd = [sys.executable, "-m", "accel.commands.cli", "report", *inputs, "-o", str(report_dir)]
        if args.known_issues:
            cmd += ["--known-issues", args.known_issues]
        code = _step("report", cmd, logs / "report.log")
        if code not in (0, 1, 3):  # 1/3 are the report's own gate verdicts, already reflected by the suites
            status = 1
        artefacts += [("report", report_dir)]

    print("accel qualify: done" + ("" if status == 0 else " (with failures)"))
    for label, path in artefacts:
        print(f"  {label:<14} {path}")
    return status
