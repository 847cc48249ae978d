"""`accel report`: many runs' results into a qualification report, with exit codes for a CI gate.

    accel report RESULTS... -o DIR [--baseline RESULTS...] [--known-issues YAML...]
                 [--format html,md] [--fail-on new-failures,regressions] [--threshold 0.10]
                 [--strict | --no-strict]

Give RESULTS first: --baseline and --known-issues take several values each. RESULTS and the
baseline are files or folders (searched recursively for harness ``*.jsonl``,
pytest ``--junitxml`` ``*.xml`` and pytest-benchmark ``*.json``). Writes ``DIR/report.html``
(self-contained) and ``DIR/report.md`` (GitHub-flavoured: paste it into a pull request or append
it to ``$GITHUB_STEP_SUMMARY``), prints the Markdown path, and lists input problems on stderr
(they are also in the report), each as ``PATH:LINE: MESSAGE`` of one of three kinds:

* invalid: a line or field breaks the format (garbage, a field of a wrong type, a missing
  field); the record was left out or the field left empty (see :mod:`accel_reports.load.loaders`);
* unreadable: a file, or its end, could not be read or parsed (empty, cut short, no header);
* note: nothing was lost (a duplicate copy, the empty file pytest-benchmark leaves under xdist,
  a file name that is not valid UTF-8, a known-issue id the known-issues file does not define).

A ``known_issue`` id written in a result file makes a failure tracked only when a known-issues
file in use (--known-issues) defines it; with no known-issues file, every failure is untracked.

Exit codes (the first that applies, in this order):

  2  usage or input error: bad options, -o (or an SQLite history's folder) that cannot be made or
     written, no results found, a results file with an unknown schema version, an unreadable
     known-issues file, a history that cannot be used (see docs/reports.md) (for these no report
     is written); an invalid input (RESULTS or baseline), always; an unreadable input under
     --strict (without it: a warning). For input problems the report is written and lists them.
  1  new-failures: failures without a known issue that are new against the baseline
     (with no --baseline: any failure without a known issue)
  3  regressions: a confirmed benchmark regression (see accel_reports.analyse.benchmarks for the rule), or a model
     that learned in the history's last run and does not now (accel_reports.history.model_trends; needs --history)
  4  collection-drop (only when asked with --fail-on): more than --collection-threshold (default 5 %)
     of the baseline's tests no longer collected
  0  none of the above
  5  internal error: accel report itself failed (a bug; the traceback is printed)

An input error comes first: a gate cannot trust counts built from files it could not read, so a
damaged input never reads as exit 0 or 1. --fail-on chooses among 1, 3 and 4 (``none``: none of
them); it never turns off exit 2. ``--strict`` is the default when the environment variable ``CI``
is true (GitHub Actions, GitLab CI and most CI services set it); ``--no-strict`` turns it off.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from accel.commands import UsageError
from accel.facts.environment import TRUE_WORDS

__all__ = ["EXIT_COLLECTION_DROP", "EXIT_INPUT", "EXIT_INTERNAL", "EXIT_NEW_FAILURES", "EXIT_OK", "EXIT_REGRESSIONS",
           "EXIT_USAGE", "add_arguments", "run", "strict_default"]

EXIT_OK = 0
EXIT_NEW_FAILURES = 1
EXIT_USAGE = 2
#: invalid input (always) and unreadable input (under --strict): the same code as a usage error
EXIT_INPUT = EXIT_USAGE
EXIT_REGRESSIONS = 3
EXIT_COLLECTION_DROP = 4
EXIT_INTERNAL = 5

GATES = ("new-failures", "regressions", "collection-drop")
FORMATS = ("html", "md")
#: input problems printed per kind on stderr (all of them are in the report)
_PRINTED = 20

_EPILOG = """\
exit codes (the first that applies):
  2  usage or input error: bad options, -o or the history's folder not writable, no results,
     unknown schema version, bad known-issues file, a history that cannot be used; an invalid
     input (a wrong type, a missing field, garbage) always;
     an unreadable input (cannot be parsed, cut short) only under --strict
  1  new failures not covered by a known issue (vs --baseline; without one, any such failure)
  3  benchmark or model regressions
  4  more than --collection-threshold (default 5%) of the baseline's tests no longer collected
     (only with --fail-on collection-drop)
  0  none of the above
  5  internal error (a bug in accel report; the traceback is printed)
--fail-on picks among 1, 3 and 4 (none: no gate); it never turns off exit 2.
--strict is the default when $CI is true (GitHub Actions and most CI services set it).
A known_issue id in a result file counts only when a --known-issues file defines it.
Give RESULTS before --baseline and --known-issues, which take several values each."""


def strict_default(environ: "os._Environ[str] | dict[str, str] | None" = None) -> bool:
    """``--strict`` unless asked: on when ``$CI`` holds a true word (``true``, ``1``, ``yes``: the words
    :data:`accel.facts.environment.TRUE_WORDS`); any other value, or none, leaves it off without an error."""
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() in TRUE_WORDS


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


def parse_share(text: str) -> float:
    """A share given as ``0.05`` or ``5%``, from 0 to 1 (an argparse type; ``accel qualify`` uses it too)."""
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share such as 0.05 or 5%, got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a share from 0 to 1 (0.05 = 5 %), got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("results", nargs="*", metavar="RESULTS",
                        help="results files or folders (*.jsonl, *.xml, *.json); none with --history: render the history")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="folder for report.html and report.md")
    parser.add_argument("--baseline", nargs="+", metavar="RESULTS", default=None,
                        help="results to compare with (new failures, fixed, disappeared tests, benchmark reference)")
    parser.add_argument("--known-issues", nargs="+", metavar="YAML", default=None,
                        help="known-issues files: failures they match, or that carry an id they define, are tracked; "
                             "passing tests they name are reported")
    parser.add_argument("--format", type=_csv(FORMATS), default=list(FORMATS), metavar="html,md",
                        help="what to write (default: html,md)")
    parser.add_argument("--fail-on", type=_csv(GATES, allow_none=True), default=["new-failures", "regressions"],
                        metavar="GATES", help=f"what fails the run: {', '.join(GATES)} or none (default: new-failures,regressions)")
    parser.add_argument("--collection-threshold", type=parse_share, default=None, metavar="FRACTION",
                        help="share of the baseline's tests that may go missing before collection-drop applies "
                             "(default 0.05 = 5%%; 0: any drop)")
    parser.add_argument("--threshold", type=_fraction, default=None, metavar="FRACTION",
                        help="benchmark regression threshold on the median (default 0.10 = 10%%)")
    parser.add_argument("--strict", action=argparse.BooleanOptionalAction, default=None,
                        help="unreadable inputs (cut short, unparseable) exit 2 instead of a warning "
                             "(default: on when $CI is true)")
    parser.add_argument("--history", metavar="DB",
                        help="run history, an SQLite file or a postgresql:// URL (pip install 'accel[postgres]'): "
                             "RESULTS' runs are appended (runs already there are skipped), benchmarks "
                             "are judged against the noise band of their own last runs, and the report shows trends, "
                             "flaky tests and where each failure began; without RESULTS, render from the history")
    parser.add_argument("--last", type=int, metavar="N", help="with --history and no RESULTS: only the last N runs of each cell")
    parser.add_argument("--title", default="accel qualification report", help="report title")
    parser.add_argument("--support-matrix", "--support_matrix", dest="support_matrix", action="store_true",
                        help="also write the support matrix (support-matrix.md, .html, .csv): software, features, "
                             "operators and models per backend, each from the run's records")


def _shown(path: object) -> str:
    from accel_reports.load.loaders import display_path

    return display_path(path)  # type: ignore[arg-type]


def _check_output(output: str) -> Path:
    """``-o``: a folder, made if absent, in which files can be written; else exit 2 in one line."""
    from accel_reports.history.outputs import OutputPathError, writable_folder

    try:
        return writable_folder(output, label="-o", purpose="report.html and report.md go into it")
    except OutputPathError as exc:
        raise UsageError(str(exc)) from None


def _history_shown(target: str) -> str:
    """The --history argument as printed: a file path, or a database URL without its password."""
    from accel_reports.history.store import is_database_url, shown_location

    return shown_location(target) if is_database_url(target) else _shown(target)


def run(args: argparse.Namespace) -> int:
    """Load, analyse, write the report and return the gate's exit code (see the module doc). A run that
    stops before writing anything leaves no empty output folder behind."""
    output = Path(args.output)
    made_here = not output.exists()
    try:
        return _run(args)
    except (UsageError, KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception:
        import traceback

        traceback.print_exc()
        print("accel report: internal error: the report could not be made (this is a bug in accel; please report it "
              f"with the traceback above); exit {EXIT_INTERNAL}", file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        if made_here and output.is_dir() and not any(output.iterdir()):
            output.rmdir()


def _print_problems(problems: list) -> dict[str, int]:
    counts: dict[str, int] = {}
    label = {"invalid": "invalid input", "unreadable": "unreadable input", "note": "note"}
    for problem in problems:
        kind = getattr(problem, "kind", "invalid")
        counts[kind] = counts.get(kind, 0) + 1
        if counts[kind] <= _PRINTED:
            print(f"accel report: {label.get(kind, kind)}: {problem.path}:{problem.line}: {problem.message}", file=sys.stderr)
    for kind, count in counts.items():
        if count > _PRINTED:
            print(f"accel report: ... and {count - _PRINTED} more {label.get(kind, kind)} problems (all listed in the report)",
                  file=sys.stderr)
    return counts


def _run(args: argparse.Namespace) -> int:
    from accel_harness.known_issues import KnownIssuesError, load_known_issues
    from accel_reports.analyse.analysis import build_report
    from accel_reports.analyse.benchmarks import DEFAULT_THRESHOLD
    from accel_reports.load.loaders import SchemaVersionError, load_results
    from accel_reports.render.report import write_report

    strict = strict_default() if args.strict is None else bool(args.strict)
    for path in [*args.results, *(args.baseline or [])]:
        if not Path(path).exists():
            raise UsageError(f"{_shown(path)}: no such file or folder")
    if Path(args.output).is_file():  # before anything else: the commonest slip
        _check_output(args.output)
    known = None
    if args.known_issues:
        try:
            known = load_known_issues(*args.known_issues)
        except KnownIssuesError as exc:
            raise UsageError(str(exc)) from None
    if not args.results and not args.history:
        raise UsageError("give RESULTS files or folders, or --history DB to render from a run history")
    if args.last is not None and (args.last < 1 or args.results):
        raise UsageError("--last N needs N >= 1 and goes with --history without RESULTS")
    out = _check_output(args.output)  # made and proven writable before the history is changed
    try:
        loaded = load_results(args.results) if args.results else None
        baseline = load_results(args.baseline) if args.baseline else None
    except SchemaVersionError as exc:
        raise UsageError(f"{_shown(str(exc))}; upgrade accel to read it") from None
    history = None
    if args.history:
        from accel_reports.history.store import HistoryError, open_history

        try:
            history = open_history(args.history, read_only=loaded is None)  # a render alone writes nothing
            if loaded is not None:
                print(f"accel report: history {history.location}: {history.ingest(loaded).summary()}", file=sys.stderr)
            else:
                loaded = history.load(last=args.last)
        except HistoryError as exc:
            shown = _history_shown(args.history)
            message = str(exc).removeprefix(f"{shown}: ")  # a database's errors start with its location already
            raise UsageError(f"--history {shown}: {message}") from None
    if loaded.empty and not loaded.runs.shape[0]:
        details = "; ".join(f"{p.path}:{p.line}: {p.message}" for p in loaded.problems[:3])
        raise UsageError("no test results or benchmarks found in " + (", ".join(map(_shown, args.results)) or _history_shown(args.history))
                         + (f" ({details})" if details else ""))
    if baseline is not None and baseline.tests.empty:
        print("accel report: warning: the baseline holds no test records; every untracked failure counts as new"
              + ("" if not baseline.benchmarks.empty else " and benchmarks have no baseline"), file=sys.stderr)
    try:
        report = build_report(loaded, baseline, known, title=args.title, history=history,
                              threshold=args.threshold if args.threshold is not None else DEFAULT_THRESHOLD,
                              collection_threshold=getattr(args, "collection_threshold", None))
    except Exception as exc:
        if history is None or not isinstance(exc, HistoryError):  # HistoryError: imported with the history
            raise
        raise UsageError(f"--history {_history_shown(args.history)}: {exc}") from None  # e.g. a lock not obtained in time
    finally:
        if history is not None:
            history.close()
    try:
        written = write_report(report, out, args.format, support_matrix=getattr(args, "support_matrix", False))
    except OSError as exc:
        raise UsageError(f"-o {_shown(out)}: cannot write the report: {exc.strerror or exc}") from None
    counts = _print_problems(report.problems)
    untracked = len(report.untracked_failures)
    model_regressions = len(report.model_regressions)
    regressions = len(report.regressions) + model_regressions
    drops = len(report.diff.collection_drops) if report.diff is not None else 0

    def n(count: int, noun: str) -> str:
        return f"{count} {noun}{'' if count == 1 else 's'}"

    print(f"{n(len(loaded.runs), 'run')}, {n(len(report.tests), 'test record')}, {n(report.failures, 'failure')} "
          f"({untracked} {'new ' if report.diff is not None else ''}not covered by a known issue), {n(regressions - model_regressions, 'benchmark regression')}"
          + (f", {n(model_regressions, 'model regression')}" if model_regressions else "")
          + (f", {n(drops, 'cell')} collected fewer tests than the baseline" if drops else ""))
    for note in report.comparison:
        print(f"accel report: baseline: {'' if note['fair'] else 'not like for like: '}{note['text']}", file=sys.stderr)
    if drops:
        for row in report.diff.collection_drops.to_dict("records"):
            print(f"accel report: baseline: {row['backend']} · torch {row['torch_version']}: {row['current']} tests "
                  f"collected, {row['baseline']} in the baseline ({row['drop_share']:.1%} fewer)", file=sys.stderr)
    if model_regressions:
        from accel_reports.history.model_trends import regression_text

        for row in report.model_regressions.to_dict("records"):
            print(f"accel report: model regression: {regression_text(row)}", file=sys.stderr)
    if not report.flaky.empty:
        print(f"accel report: {n(len(report.flaky), 'flaky failure')} (passed in some re-runs): shown as flaky, not "
              "counted as new failures", file=sys.stderr)
    for fmt in ("html", "md"):
        if fmt in written:
            print(f"{'HTML report' if fmt == 'html' else 'Markdown summary'}: {_shown(written[fmt])}")
    from accel_reports.render.support_matrix import FILES as MATRIX_FILES

    for name, path in written.items():  # an operator sweep's support list and the support matrix, beside the report
        if name not in FORMATS:
            print(f"{'Support matrix' if name in MATRIX_FILES.values() else 'Operator support list'}: {_shown(path)}")
    invalid, unreadable = counts.get("invalid", 0), counts.get("unreadable", 0)
    if invalid or (strict and unreadable):
        parts = [n(invalid, "invalid input") if invalid else "", n(unreadable, "unreadable input") if strict and unreadable else ""]
        print(f"accel report: error: {' and '.join(p for p in parts if p)} (listed above and in the report): the results "
              f"cannot be trusted for the gate; exit {EXIT_INPUT}", file=sys.stderr)
        return EXIT_INPUT
    if unreadable:
        print(f"accel report: warning: {n(unreadable, 'unreadable input')} (listed above); with --strict (the default "
              "under CI) this exits 2", file=sys.stderr)
    gates = set(args.fail_on)
    if "new-failures" in gates and untracked:
        return EXIT_NEW_FAILURES
    if "regressions" in gates and regressions:
        return EXIT_REGRESSIONS
    if "collection-drop" in gates and drops:
        return EXIT_COLLECTION_DROP
    return EXIT_OK
