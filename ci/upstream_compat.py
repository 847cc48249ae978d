"""Nightly compatibility measure: an upstream release's own tests against itself and against accel.

    python -m ci.upstream_compat --upstream accelerate==1.15.0 --out compat [-n 2] [--min-share 0.95]

Runs ``accel qualify --upstream SPEC --against PROJECT,accel --no-bench --json --known-issues
ci/upstream_known_issues.yaml`` into ``OUT/qualify``
(fetching the sdist from the package index, installing its test dependencies with torch pinned),
then writes ``OUT/compat.md``: the share of the tests passing against the project that also pass
against accel, per comparison, followed by the report's Markdown (vendor table, what still differs
by cause, per file side by side). The nightly workflow appends it to the job summary.

Exit status: 0 when a report was produced (and, with ``--min-share``, every comparison reached it),
1 when a comparison is below ``--min-share``, 2 when no report could be produced.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["build_command", "main", "summarise"]


#: environment-caused failures of the measure (both sides), clustered under their own ids in the report
KNOWN_ISSUES = Path(__file__).with_name("upstream_known_issues.yaml")


def build_command(upstream: str, out: Path, *, project: str | None, workers: int, extra: Sequence[str] = (),
                  known_issues: Path | None = None, test_timeout: float = 180.0) -> list[str]:
    """The ``accel qualify`` command line for both sides of the measure."""
    sides = f"{project},accel" if project else "accel"
    cmd = [sys.executable, "-m", "accel.commands.cli", "qualify", "--upstream", upstream, "--against", sides,
           "--no-bench", "--json", "-o", str(out), "-n", str(workers), "--test-timeout", f"{test_timeout:g}"]
    if known_issues is not None:
        cmd += ["--known-issues", str(known_issues)]
    return cmd + list(extra)


def summarise(results: Path, report_md: Path | None = None) -> tuple[list[str], list[float | None]]:
    """The compatibility sentences for ``results`` (a qualify results folder) and each comparison's share."""
    from accel_reports.analyse.analysis import build_report
    from accel_reports.load.loaders import load_results
    from accel_reports.analyse.vendor import vendor_lines

    report = build_report(load_results([results]))
    lines = vendor_lines(report.vendor, report.compat)
    shares = [None if s is None or s != s else float(s) for s in report.compat["share"]] if not report.compat.empty else []
    return lines, shares


def _project_of(spec: str) -> str | None:
    return spec.split("==", 1)[0].replace("-", "_").lower() if "==" in spec else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.upstream_compat", description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", default="accelerate==1.15.0", help="NAME==VERSION or a test folder (default accelerate==1.15.0)")
    parser.add_argument("--project", help="the project's import name, the reference side (default: NAME of --upstream)")
    parser.add_argument("--out", default="compat", help="output folder (default ./compat; must not exist or be empty)")
    parser.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers (default 2)")
    parser.add_argument("--known-issues", default=str(KNOWN_ISSUES),
                        help="known-issues file for the environment's own failures (default ci/upstream_known_issues.yaml; '' for none)")
    parser.add_argument("--test-timeout", type=float, default=180.0, help="per-test timeout in seconds (default 180)")
    parser.add_argument("--min-share", type=float, default=None, help="fail (exit 1) below this share, e.g. 0.95")
    parser.add_argument("--qualify-args", default="", help="more arguments for accel qualify (e.g. '--pip-args \"--index-url URL\"')")
    args = parser.parse_args(argv)
    out = Path(args.out)
    project = args.project or _project_of(args.upstream)
    cmd = build_command(args.upstream, out / "qualify", project=project, workers=args.workers, extra=shlex.split(args.qualify_args),
                        known_issues=Path(args.known_issues) if args.known_issues else None, test_timeout=args.test_timeout)
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=False)  # its exit status says "failures"; the share below is the verdict
    results = out / "qualify" / "results"
    report_md = out / "qualify" / "report" / "report.md"
    if not results.is_dir() or not report_md.is_file():
        print(f"ci.upstream_compat: no report was produced (looked for {report_md})", file=sys.stderr)
        return 2
    lines, shares = summarise(results)
    text = ["# Upstream compatibility: " + args.upstream, ""] + [f"- {line}" for line in lines] + ["", report_md.read_text(encoding="utf-8")]
    (out / "compat.md").write_text("\n".join(text), encoding="utf-8")
    for line in lines:
        print(line)
    print(f"ci.upstream_compat: {out / 'compat.md'}")
    if not shares:
        print("ci.upstream_compat: no comparison (did the reference side run?)", file=sys.stderr)
        return 2
    if args.min_share is not None and any(s is None or s < args.min_share for s in shares):
        print(f"ci.upstream_compat: below the required share {args.min_share:.0%}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
