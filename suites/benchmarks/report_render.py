"""Time `accel report` at scale: 50 runs × 2,000 tests (100,000 records) plus benchmark files.

Generates the results once with ``accel_reports.synthetic`` (not timed), then times the whole report
(load every file, apply the known issues, analyse, render HTML and Markdown) ``--repeats`` times
and prints the median with its parts and the sizes of the files written. Targets: under 5 s and an
HTML file under 5 MB (pytest-html needs about 40 s to open 4,000 tests).

    python suites/benchmarks/report_render.py [--runs 50] [--tests 2000] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

TARGET_SECONDS = 5.0
TARGET_HTML_BYTES = 5 * 1024 * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--tests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_path", help="write the figures here")
    args = parser.parse_args(argv)

    from accel_reports.synthetic import generate

    with tempfile.TemporaryDirectory(prefix="accel-report-bench-") as tmp:
        results = Path(tmp) / "results"
        start = time.perf_counter()
        generated = generate(results, runs=args.runs, tests=args.tests, seed=args.seed)
        print(f"generated {len(generated.runs)} runs × {args.tests} tests and {len(generated.benchmarks)} benchmark files "
              f"in {time.perf_counter() - start:.1f} s ({sum(p.stat().st_size for p in results.iterdir()) / 2**20:.1f} MiB)")

        from accel_harness.known_issues import load_known_issues
        from accel_reports.analysis import build_report
        from accel_reports.loaders import load_results
        from accel_reports.render import write_report

        timings = []
        for repeat in range(args.repeats):
            out = Path(tmp) / f"out{repeat}"
            t0 = time.perf_counter()
            loaded = load_results([results])
            t1 = time.perf_counter()
            report = build_report(loaded, known=load_known_issues(generated.known_issues))
            t2 = time.perf_counter()
            written = write_report(report, out)
            t3 = time.perf_counter()
            timings.append({"load": t1 - t0, "analyse": t2 - t1, "render": t3 - t2, "total": t3 - t0})
            print(f"  run {repeat + 1}: load {t1 - t0:.2f} s, analyse {t2 - t1:.2f} s, render {t3 - t2:.2f} s, total {t3 - t0:.2f} s")
        html_bytes = written["html"].stat().st_size
        md_bytes = written["md"].stat().st_size
        median = {key: statistics.median(t[key] for t in timings) for key in timings[0]}
        records = len(loaded.tests)
        print(f"{records:,} records, {len(report.grid):,} device-neutral test ids, {len(loaded.benchmarks)} benchmark rows")
        print(f"median of {args.repeats}: total {median['total']:.2f} s (load {median['load']:.2f}, analyse {median['analyse']:.2f}, "
              f"render {median['render']:.2f}); report.html {html_bytes / 2**20:.2f} MiB, report.md {md_bytes / 1024:.1f} KiB")
        ok = median["total"] < TARGET_SECONDS and html_bytes < TARGET_HTML_BYTES
        print(f"targets (< {TARGET_SECONDS:.0f} s, HTML < {TARGET_HTML_BYTES / 2**20:.0f} MiB): {'met' if ok else 'MISSED'}")
        if args.json_path:
            Path(args.json_path).write_text(json.dumps({
                "runs": args.runs, "tests": args.tests, "records": records, "repeats": args.repeats, "timings": timings,
                "median": median, "html_bytes": html_bytes, "md_bytes": md_bytes, "python": sys.version.split()[0],
            }, indent=2))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
