"""`accel report`: many runs' results into a qualification report, with exit codes for a CI gate.

    accel report RESULTS... -o DIR [--baseline RESULTS...] [--known-issues YAML...]
                 [--format html,md] [--fail-on new-failures,regressions] [--threshold 0.10]

Give RESULTS first: --baseline and --known-issues take several values each. RESULTS and the
baseline are files or folders (searched recursively for harness ``*.jsonl``,
pytest ``--junitxml`` ``*.xml`` and pytest-benchmark ``*.json``). Writes ``DIR/report.html``
(self-contained) and ``DIR/report.md`` (GitHub-flavoured: paste it into a pull request or append
it to ``$GITHUB_STEP_SUMMARY``), prints the Markdown path, and lists unreadable lines/files on
stderr (they are also in the report).

Exit codes (the first that applies, in this order):

  0  nothing the gate checks failed
  1  new-failures: failures without a known issue that are new against the baseline
     (with no --baseline: any failure without a known issue)
  3  regressions: a confirmed benchmark regression (see accel_reports.benchmarks for the rule)
  4  collection-drop (only when asked with --fail-on): fewer tests than in the baseline
  2  usage or input error: bad options, no results found, a results file with an unknown schema
     version, an unreadable known-issues file (no report is written)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from accel.commands import UsageError

__all__ = ["EXIT_COLLECTION_DROP", "EXIT_NEW_FAILURES", "EXIT_OK", "EXIT_REGRESSIONS", "EXIT_USAGE",
           "add_arguments", "run"]

EXIT_OK = 0
EXIT_NEW_FAILURES = 1
EXIT_USAGE = 2
EXIT_REGRESSIONS = 3
EXIT_COLLECTION_DROP = 4

GATES = ("new-failures", "regressions", "collection-drop")
FORMATS = ("html", "md")

_EPILOG = """\
exit codes: 0 ok; 1 new untracked failures (vs --baseline; without one, any untracked failure);
3 benchmark regressions; 4 fewer tests collected than the baseline (only with
--fail-on collection-drop); 2 usage or input error. With several, the first in the order 1, 3, 4.
--fail-on none turns the gate off (exit 0 whenever the report was written).
Give RESULTS before --baseline and --known-issues, which take several values each."""


def _csv(choices: tuple[str, ...], allow_none: bool = False):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if allow_none and items == ["none"]:
            return []
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {', '.join(choices)}{' (or none)' if allow_none else ''}, got {text!r}")
        return items
    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.10 or 10%, got {text!r}") from None
    if not 0 < value < 10:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 10 (0.10 = 10 %), got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("results", nargs="+", metavar="RESULTS", help="results files or folders (*.jsonl, *.xml, *.json)")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="folder for report.html and report.md")
    parser.add_argument("--baseline", nargs="+", metavar="RESULTS", default=None,
                        help="results to compare with (new failures, fixed, disappeared tests, benchmark reference)")
    parser.add_argument("--known-issues", nargs="+", metavar="YAML", default=None,
                        help="known-issues files: failures they match are tracked, passing tests they name are reported")
    parser.add_argument("--format", type=_csv(FORMATS), default=list(FORMATS), metavar="html,md",
                        help="what to write (default: html,md)")
    parser.add_argument("--fail-on", type=_csv(GATES, allow_none=True), default=["new-failures", "regressions"],
                        metavar="GATES", help=f"what fails the run: {', '.join(GATES)} or none (default: new-failures,regressions)")
    parser.add_argument("--threshold", type=_fraction, default=None, metavar="FRACTION",
                        help="benchmark regression threshold on the median (default 0.10 = 10%%)")
    parser.add_argument("--title", default="accel qualification report", help="report title")


def run(args: argparse.Namespace) -> int:
    from accel_harness.known_issues import KnownIssuesError, load_known_issues
    from accel_reports.analysis import build_report
    from accel_reports.benchmarks import DEFAULT_THRESHOLD
    from accel_reports.loaders import SchemaVersionError, load_results
    from accel_reports.render import write_report

    for path in [*args.results, *(args.baseline or [])]:
        if not Path(path).exists():
            raise UsageError(f"{path}: no such file or folder")
    known = None
    if args.known_issues:
        try:
            known = load_known_issues(*args.known_issues)
        except KnownIssuesError as exc:
            raise UsageError(str(exc)) from None
    try:
        loaded = load_results(args.results)
        baseline = load_results(args.baseline) if args.baseline else None
    except SchemaVersionError as exc:
        raise UsageError(f"{exc}; upgrade accel to read it") from None
    if loaded.empty and not loaded.runs.shape[0]:
        details = "; ".join(f"{p.path}:{p.line}: {p.message}" for p in loaded.problems[:3])
        raise UsageError("no test results or benchmarks found in " + ", ".join(args.results) + (f" ({details})" if details else ""))
    if baseline is not None and baseline.tests.empty:
        print("accel report: warning: the baseline holds no test records; every untracked failure counts as new"
              + ("" if not baseline.benchmarks.empty else " and benchmarks have no baseline"), file=sys.stderr)
    report = build_report(loaded, baseline, known, title=args.title,
                          threshold=args.threshold if args.threshold is not None else DEFAULT_THRESHOLD)
    written = write_report(report, args.output, args.format)
    for problem in report.problems:
        print(f"accel report: warning: {problem.path}:{problem.line}: {problem.message}", file=sys.stderr)
    untracked = len(report.untracked_failures)
    regressions = len(report.regressions)
    drops = len(report.diff.collection_drops) if report.diff is not None else 0
    def n(count: int, noun: str) -> str:
        return f"{count} {noun}{'' if count == 1 else 's'}"

    print(f"{n(len(loaded.runs), 'run')}, {n(len(report.tests), 'test record')}, {n(report.failures, 'failure')} "
          f"({untracked} {'new ' if report.diff is not None else ''}untracked), {n(regressions, 'benchmark regression')}"
          + (f", {n(drops, 'cell')} collected fewer tests than the baseline" if drops else ""))
    for fmt in ("html", "md"):
        if fmt in written:
            print(f"{'HTML report' if fmt == 'html' else 'Markdown summary'}: {written[fmt]}")
    gates = set(args.fail_on)
    if "new-failures" in gates and untracked:
        return EXIT_NEW_FAILURES
    if "regressions" in gates and regressions:
        return EXIT_REGRESSIONS
    if "collection-drop" in gates and drops:
        return EXIT_COLLECTION_DROP
    return EXIT_OK
