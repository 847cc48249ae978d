"""Time `accel report` at scale: 50 runs × 2,000 tests (100,000 records) plus benchmark files.

Generates the results once with ``tests/support/_synthetic_results.py`` (not timed), then times the whole report
(load every file, apply the known issues, analyse, render HTML and Markdown) ``--repeats`` times
and prints the median with its parts and the sizes of the files written. Targets: under 5 s and an
HTML file under 5 MB (pytest-html needs about 40 s to open 4,000 tests).

``--history N`` (default 10) makes the runs a nightly history: N consecutive runs of each cell
(50 runs = 5 cells × 10 nights, across backends and torch versions); ``--history 1`` is the flat
layout: 50 distinct cells, one run each. The runs are also stored in a run history (SQLite,
:mod:`accel_reports.history.store`; the import is timed once), and each repeat times both paths of
``accel report``: from the files, and from the history store (``--history DB`` without RESULTS:
load every stored run, judge the benchmarks by the history rule, flakiness, first failures,
trend lines).

    python suites/benchmarks/report_render.py [--runs 50] [--tests 2000] [--history 10] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

TARGET_SECONDS = 5.0
TARGET_HTML_BYTES = 5 * 1024 * 1024
#: the cells of a history layout, in order (backends and torch versions mixed, as a vendor's matrix)
HISTORY_CELLS = [("cuda", "2.8.0", "0.2.0"), ("xpu", "2.9.0", "0.2.0"), ("cpu", "2.9.0", "0.2.0"), ("hpu", "2.8.0", "0.2.0"),
                 ("cuda", "2.9.0", "0.2.0"), ("xpu", "2.8.0", "0.2.0"), ("mps", "2.9.0", "0.2.0"), ("cpu", "2.8.0", "0.2.0")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--tests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--history", type=int, default=10, help="consecutive runs per cell (1: every run its own cell)")
    parser.add_argument("--keep", help="also copy the last report.html/report.md into this folder")
    parser.add_argument("--json", dest="json_path", help="write the figures here")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))  # the generator lives with the tests
    from _synthetic_results import generate

    with tempfile.TemporaryDirectory(prefix="accel-report-bench-") as tmp:
        results = Path(tmp) / "results"
        start = time.perf_counter()
        layout = {}
        if args.history > 1:
            cells = -(-args.runs // args.history)
            layout = {"history": args.history, "cells": HISTORY_CELLS[:cells] if cells <= len(HISTORY_CELLS) else None}
        generated = generate(results, runs=args.runs, tests=args.tests, seed=args.seed, **layout)
        print(f"generated {len(generated.runs)} runs × {args.tests} tests ({len(set(generated.cells))} cells"
              f"{f', {args.history} runs each' if args.history > 1 else ''}) and {len(generated.benchmarks)} benchmark files "
              f"in {time.perf_counter() - start:.1f} s ({sum(p.stat().st_size for p in results.iterdir()) / 2**20:.1f} MiB)")

        from accel_harness.known_issues import load_known_issues
        from accel_reports.analyse.analysis import build_report
        from accel_reports.load.loaders import load_results
        from accel_reports.render.report import write_report

        from accel_reports.history.store import open_history

        db = Path(tmp) / "history.db"
        t0 = time.perf_counter()
        with open_history(db) as history:
            history.ingest(load_results([results]))
        ingest = time.perf_counter() - t0
        print(f"  history: {len(generated.runs)} runs loaded from the files and stored in {ingest:.2f} s "
              f"({db.stat().st_size / 2**20:.1f} MiB SQLite)")

        known = load_known_issues(generated.known_issues)
        timings = []
        for repeat in range(args.repeats):
            for source in ("files", "history"):
                out = Path(tmp) / f"out-{source}{repeat}"
                c0 = time.process_time()
                t0 = time.perf_counter()
                history = open_history(db) if source == "history" else None
                loaded = history.load() if history is not None else load_results([results])
                t1 = time.perf_counter()
                report = build_report(loaded, known=known, history=history)
                t2 = time.perf_counter()
                written = write_report(report, out)
                t3 = time.perf_counter()
                if history is not None:
                    history.close()
                cpu = time.process_time() - c0
                timings.append({"source": source, "load": t1 - t0, "analyse": t2 - t1, "render": t3 - t2,
                                "total": t3 - t0, "cpu": cpu, "html_bytes": written["html"].stat().st_size,
                                "md_bytes": written["md"].stat().st_size})
                print(f"  run {repeat + 1} from {source}: load {t1 - t0:.2f} s, analyse {t2 - t1:.2f} s, render {t3 - t2:.2f} s, "
                      f"total {t3 - t0:.2f} s (CPU time {cpu:.2f} s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
        if args.keep:
            import shutil

            Path(args.keep).mkdir(parents=True, exist_ok=True)
            for path in written.values():
                shutil.copyfile(path, Path(args.keep) / path.name)
        records = len(loaded.tests)
        print(f"{records:,} records, {len(report.grid):,} device-neutral test ids, {len(loaded.benchmarks)} benchmark rows, "
              f"{int((report.bench_table['history_runs'] > 0).sum()) if not report.bench_table.empty else 0} benchmarks with a history band")
        ok = True
        medians = {}
        for source in ("files", "history"):
            mine = [t for t in timings if t["source"] == source]
            median = {key: statistics.median(t[key] for t in mine) for key in ("load", "analyse", "render", "total", "cpu")}
            html_bytes, md_bytes = mine[-1]["html_bytes"], mine[-1]["md_bytes"]
            medians[source] = {**median, "html_bytes": html_bytes, "md_bytes": md_bytes}
            print(f"from {source}, median of {args.repeats}: total {median['total']:.2f} s (load {median['load']:.2f}, "
                  f"analyse {median['analyse']:.2f}, render {median['render']:.2f}; CPU time {median['cpu']:.2f} s); "
                  f"report.html {html_bytes / 2**20:.2f} MiB, report.md {md_bytes / 1024:.1f} KiB")
            ok = ok and median["total"] < TARGET_SECONDS and html_bytes < TARGET_HTML_BYTES
        print(f"targets (< {TARGET_SECONDS:.0f} s, HTML < {TARGET_HTML_BYTES / 2**20:.0f} MiB): {'met' if ok else 'MISSED'}")
        if args.json_path:
            Path(args.json_path).write_text(json.dumps({
                "runs": args.runs, "tests": args.tests, "history": args.history, "records": records,
                "repeats": args.repeats, "ingest_seconds": ingest, "timings": timings, "median": medians,
                "python": sys.version.split()[0],
            }, indent=2))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
