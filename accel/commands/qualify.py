"""`accel qualify`: the main job — qualify this machine's backend(s) and leave a report behind.

Runs the conformance suites for the detected (or chosen) backend(s) into a fresh results folder,
then the benchmarks (``accel bench``), then renders the report (``accel report``), and prints where
everything is. Each step runs as its own process, so one step's crash cannot hide another's results.

Exit status: 0 when the suites passed, 1 when any suite test failed (or a step crashed), 2 for a
usage error (e.g. the results folder exists and is not empty).

``--upstream accelerate==1.15.0`` (or ``--upstream PATH``: a test folder or an sdist file) qualifies with an upstream project's own
test suite instead (see :mod:`accel_harness.upstream`): fetch its sdist, install its test dependencies
with the installed torch pinned, run it on each selected backend with the harness's records
(``--against accel``: with its imports pointed at accel, to measure accel's compatibility;
``--against accelerate,accel``: both, side by side) and render the vendor table.

``--baseline RESULTS`` compares the run with an earlier one: besides new failures, a drop in the
number of collected tests by more than ``--collection-threshold`` (default 5 %) of the baseline's
fails the run, and the report says when the two runs' fingerprints (device profile, selected test
ids) make the comparison not like for like. ``--rerun-known`` runs only the tests that the known
issues (``--known-issues`` and the profile's ``known_issues``) cover and names each entry whose
tests now pass.

Every child process (pytest, ``accel bench``, ``accel report``) runs with ``PYTHONSAFEPATH=1``: a
folder named ``accel`` or ``pytest`` in the caller's working folder cannot shadow the real ones.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

from accel.commands import UsageError, default_output
from accel.commands.qualify_summary import closing_line as _closing_line
from accel.commands.qualify_summary import ops_results as _ops_results
from accel.commands.qualify_summary import print_comparison as _print_comparison
from accel.commands.qualify_summary import stage_costs
from accel.commands.qualify_summary import tally as _tally
from accel.commands.report import parse_share


def suites_dir() -> Path:
    """The conformance suites (see :mod:`accel_harness.suites_location`), or a usage error naming where it looked."""
    from accel_harness.suites_location import SuitesNotFound, suites_root

    try:
        return suites_root()
    except SuitesNotFound as exc:
        raise UsageError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Run the conformance suites, the benchmarks and the report for this machine's backend(s)."
    parser.add_argument("--backend", action="append", metavar="NAME",
                        help="backend(s) to qualify (repeatable; default: the detected backend; 'auto': every available one)")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="fresh folder for everything (default: ./accel-results/qualify-<UTC time>)")
    parser.add_argument("-n", "--workers", type=int, default=None, metavar="N",
                        help="pytest-xdist workers for the suites (default: 2 where the machine has two usable cores or "
                             "more, else 0: one process)")
    parser.add_argument("--flake-runs", type=int, default=0, metavar="N",
                        help="re-run each failing suite test N more times and record its flake rate (the outcome stays "
                             "failed; the report shows it as flaky when a re-run passes)")
    parser.add_argument("-k", metavar="EXPR", help="only run suite tests matching this pytest -k expression")
    parser.add_argument("--known-issues", metavar="YAML", help="known-issues file for the suites and the report")
    parser.add_argument("--profile", metavar="FILE",
                        help="device profile (YAML, TOML or a transformers-style spec.py) for the suites: its backend "
                             "is the one qualified (unless --backend says otherwise) and its claims are checked")
    parser.add_argument("--dist-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="timeout of one multi-process test (default 120)")
    parser.add_argument("--ops", choices=("quick", "full", "none"), default="quick",
                        help="the operator sweep (accel ops) per backend: quick (default: every operator, float32 and "
                             "bfloat16, forward), full (every dtype, backward, variants, modules, optimizers) or none")
    parser.add_argument("--ops-k", "--ops_k", dest="ops_k", metavar="PATTERN",
                        help="only the operators matching this accel ops -k pattern")
    parser.add_argument("--models", choices=("quick", "full", "none"), default="quick",
                        help="the validated-model suite within the suites: quick (default: its quick rows at 1 and 2 "
                             "ranks), full (every model; RUN_SLOW=1 for the suites) or none")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmarks")
    parser.add_argument("--history", metavar="DB", help="also append this run's results and benchmarks to a run history (an SQLite file, or a postgresql:// URL)")
    parser.add_argument("--quick", action="store_true", help="quick benchmarks (smoke run)")
    parser.add_argument("--thorough", action="store_true",
                        help="every benchmark (accel bench's full set) instead of the standard set, one headline figure per area")
    parser.add_argument("--baseline", action="append", metavar="RESULTS",
                        help="earlier results (files or folders, repeatable) to compare with: a drop in collected tests "
                             "fails the run; the report lists the new failures and says whether the runs compare like for like")
    parser.add_argument("--collection-threshold", type=parse_share, default=None, metavar="FRACTION",
                        help="with --baseline: the share of the baseline's tests that may go missing before the run fails "
                             "(default 0.05 = 5%%; 0: any drop)")
    parser.add_argument("--rerun-known", action="store_true",
                        help="run only the tests the known issues (--known-issues, the profile's known_issues) cover, "
                             "and name each known issue whose tests now pass (no benchmarks)")
    parser.add_argument("--json", dest="json_summary", action="store_true",
                        help="also write summary.json (stages, counts, failing tests, paths) and print its path")
    up = parser.add_argument_group("upstream suites")
    up.add_argument("--upstream", metavar="NAME==VERSION|PATH",
                    help="run an upstream project's own tests instead of accel's suites: a release on the package index "
                         "(its sdist's tests/), an sdist file, or a test folder at hand")
    up.add_argument("--against", action="append", metavar="NAME",
                    help="what the upstream tests import (repeatable or comma-separated; default: the project itself); "
                         "'accel' rewrites their imports to accel")
    up.add_argument("--upstream-project", metavar="NAME", help="import name of the upstream project (default: from its metadata)")
    up.add_argument("--upstream-extras", metavar="EXTRA,...", help="extras holding its test dependencies (default: testing/test)")
    up.add_argument("--no-install", action="store_true", help="do not install the suite's test dependencies")
    up.add_argument("--pip-args", default="", metavar="ARGS",
                    help="extra arguments for pip download/install, e.g. '--index-url URL' or '--no-index --find-links DIR'")
    up.add_argument("--test-timeout", type=float, default=600.0, metavar="SECONDS",
                    help="per-test timeout when pytest-timeout is installed (default 600; 0: none)")
    up.add_argument("--session-timeout", type=float, default=0.0, metavar="SECONDS",
                    help="stop one suite run after this long (default 0: no limit); what finished is kept")
    up.add_argument("--online", action="store_true", help="let the suite reach the Hugging Face hub (default: HF_HUB_OFFLINE=1 ...)")


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of qualify's child processes: this one's, unbuffered, with ``PYTHONSAFEPATH=1``
    so that ``python -m pytest`` / ``python -m accel.commands.cli`` import the installed packages even
    when the caller's working folder holds a folder named ``accel`` or ``pytest``; and the command line
    this process was started with (``ACCEL_COMMAND_LINE``), which the runs' headers record."""
    from accel_harness.fingerprint import COMMAND_LINE_ENV, command_line

    # the command a person typed, for the headers of the runs the children write
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1", COMMAND_LINE_ENV: command_line(), **(extra or {})}


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


def _use_profile(path: str) -> None:
    """Put the profile's backend into this process's registry (and the children's, through the environment)."""
    from accel.backends import BackendError, reset_registry
    from accel.backends.registry import PROFILE_ENV, get_registry

    os.environ[PROFILE_ENV] = os.path.abspath(path)
    reset_registry()
    try:
        get_registry()
    except BackendError as exc:
        raise UsageError(f"--profile: {exc}") from None


def _step(title: str, command: list[str], log: Path, record: list[dict] | None = None,
          env: dict[str, str] | None = None) -> int | None:
    """Run one stage's child command with live progress; its output goes to ``log``.

    Returns the exit status (None if it was stopped). A stage that runs pytest shows tests done of
    total, failures so far and the current test; its failing tests are printed by name at the end.
    ``record`` (a list) gets the stage's summary for ``--json``; ``env`` replaces :func:`child_environment`.
    Ctrl-C ends the child (it keeps what it finished) and propagates as KeyboardInterrupt.
    """
    from accel_harness.progress import ProgressDisplay, PytestProgress, run_streamed

    print(f"accel qualify: {title} ...", flush=True)
    progress = PytestProgress(title)
    env = env if env is not None else child_environment()
    code: int | None = None
    try:
        with ProgressDisplay(progress) as display:
            code = run_streamed(command, log, on_line=display.feed, env=env)
    finally:
        if record is not None:
            record.append({"stage": title, "exit_code": code, "seconds": round(progress.elapsed, 1),
                           "tests_done": progress.done, "tests_total": progress.total, "failed": progress.failed,
                           "failing_tests": list(progress.failures), "log": str(log)})
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    print(f"accel qualify: {title}: exit {code} in {progress.elapsed:.1f}s — {tail[0]}", flush=True)
    if progress.failures:
        shown = progress.failures[:FAILURES_SHOWN]
        print(f"accel qualify: {title}: {len(progress.failures)} failing test(s):", flush=True)
        for nodeid in shown:
            print(f"    {nodeid}")
        if len(progress.failures) > len(shown):
            print(f"    ... and {len(progress.failures) - len(shown)} more (see {log})")
    return code


#: failing test names printed per stage (the rest are in the stage's log and the report)
FAILURES_SHOWN = 25


def _fresh_output(args: argparse.Namespace) -> Path:
    out = Path(args.output or default_output("qualify")).resolve()
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} already exists and is not empty: qualify writes into a fresh folder")
    from accel_reports.history.outputs import OutputPathError, writable_folder

    try:
        writable_folder(out, label="--output", purpose="qualify writes its results and report into it")
    except OutputPathError as exc:
        raise UsageError(str(exc)) from None
    return out


def _split(values: list[str] | None) -> list[str]:
    return list(dict.fromkeys(v.strip() for value in values or [] for v in value.split(",") if v.strip()))


def run_upstream(args: argparse.Namespace, backends: list[str], out: Path) -> int:
    """``accel qualify --upstream``: an upstream project's own suite on each backend, then the vendor report."""
    import shlex

    from accel_harness import upstream as up
    from accel_harness.progress import ProgressDisplay, PytestProgress

    if args.known_issues and not os.path.isfile(args.known_issues):
        raise UsageError(f"known-issues file not found: {args.known_issues}")
    try:
        spec = up.parse_spec(args.upstream)
    except up.UpstreamError as exc:
        raise UsageError(str(exc)) from None
    pip_args = shlex.split(args.pip_args or "")
    extras = _split([args.upstream_extras]) if args.upstream_extras else None
    for folder in (out / "results", out / "logs"):  # a report (possibly partial) always has a place to come from
        folder.mkdir(parents=True, exist_ok=True)
    print(f"accel qualify: upstream {spec.label}; backends {', '.join(backends)}; output {out}", flush=True)
    try:
        suite = up.prepare_suite(spec, out / "upstream", pip_args=pip_args, extras=extras, project=args.upstream_project)
    except up.UpstreamError as exc:
        print(f"accel qualify: {exc}", file=sys.stderr)
        return 1
    print(f"accel qualify: suite {suite.label}: {suite.tests_dir} ({len(suite.requirements)} test requirements"
          + (f" from extra {', '.join(suite.extras)}" if suite.extras else "") + ")", flush=True)
    install = None
    python = None  # the suite's own interpreter; None: this one (--no-install: what is here is used as it is)
    if not args.no_install:
        from accel_harness.upstream_env import prepare_environment

        wanted = list(suite.requirements)
        if spec.kind == "index":
            wanted.insert(0, f"{spec.name}=={spec.version}")  # the release the reference side runs against
        print(f"accel qualify: preparing the suite's own environment (the active one is not changed), "
              f"{', '.join(up.pinned_constraints()) or 'nothing'} pinned ...", flush=True)
        isolated = prepare_environment(suite.label, wanted, log_dir=out / "logs", pip_args=pip_args)
        python = str(isolated.python)
        install = up.InstallResult(**isolated.install)
        print(f"accel qualify: environment {isolated.root}" + (" (reused)" if isolated.reused else "")
              + f"; dependencies: {len(install.already)} present, {len(install.installed)} installed, "
              f"{len(install.failed)} could not be installed (pip log: {out / 'logs' / 'pip-install.log'})", flush=True)
        for requirement, reason in install.failed.items():
            print(f"accel qualify:   not installed: {requirement}: {reason}", flush=True)
    else:
        install = up.InstallResult(constraints=up.pinned_constraints(), skipped=True)
    sides = _split(args.against) or [suite.project]
    runs = []
    status = 0
    try:
        for backend in backends:
            for side in sides:
                title = f"{suite.label} against {side} on {backend}"
                print(f"accel qualify: {title} ...", flush=True)
                with ProgressDisplay(PytestProgress(title)) as display:
                    result = up.run_suite(
                        suite, backend, out, against=side, workers=args.workers, test_timeout=args.test_timeout or None,
                        session_timeout=args.session_timeout or None, offline=not args.online, keyword=args.k,
                        known_issues=args.known_issues, install=install, on_line=display.feed, python=python)
                runs.append(result)
                print(f"accel qualify: {up.summary_line(suite, result)} in {result.seconds:.0f}s", flush=True)
                if result.status != "completed" or result.counts.get("failed") or result.counts.get("error"):
                    status = 1
    except KeyboardInterrupt:
        print("accel qualify: interrupted; rendering a partial report", flush=True)
        status = 130
    report_dir = out / "report"
    cmd = [sys.executable, "-m", "accel.commands.cli", "report", str(out / "results"), "-o", str(report_dir),
           "--fail-on", "none", "--title", f"accel qualify: {suite.label} upstream tests"
           + (" — PARTIAL: interrupted" if status == 130 else "")]
    if args.known_issues:
        cmd += ["--known-issues", args.known_issues]
    if _step("report", cmd, out / "logs" / "report.log") != 0:
        status = status or 1
    if getattr(args, "json_summary", False):
        up.write_summary(out / "summary.json", suite, runs, install)
    _print_vendor_lines(out / "results", args.known_issues)
    print(_closing_line(status, "the upstream suites" if status == 130 else None))
    print(f"accel qualify: {_tally(out / 'results', None)}")
    for label, path in [("results", out / "results"), ("logs", out / "logs"), ("report", report_dir / "report.html"),
                        ("markdown", report_dir / "report.md")] + ([("summary", out / "summary.json")] if getattr(args, "json_summary", False) else []):
        print(f"  {label:<9} {path}")
    return status


def _print_vendor_lines(results: Path, known_issues: str | None) -> None:
    """Print the report's upstream headline sentences (the vendor table in words)."""
    try:
        from accel_reports.analyse.analysis import build_report
        from accel_reports.load.loaders import load_results

        known = None
        if known_issues:
            from accel_harness.known_issues import load_known_issues

            known = load_known_issues(known_issues)
        report = build_report(load_results([results]), known=known)
        from accel_reports.analyse.vendor import vendor_lines

        for line in vendor_lines(report.vendor, report.compat):
            print(f"  {line}")
    except Exception as exc:  # the report itself was written (or its log says why); this is a courtesy
        print(f"accel qualify: (no summary lines: {type(exc).__name__}: {exc})")


def run(args: argparse.Namespace) -> int:
    if (getattr(args, "flake_runs", 0) or 0) < 0 or (args.workers is not None and args.workers < 0):
        raise UsageError("--flake-runs and -n take a number of 0 or more")
    if getattr(args, "upstream", None):  # a bad spec is reported before torch is imported
        from accel_harness.upstream import UpstreamError, parse_spec

        try:
            parse_spec(args.upstream)
        except UpstreamError as exc:
            raise UsageError(str(exc)) from None
    if getattr(args, "profile", None):
        _use_profile(args.profile)
    backends = _selected_backends(args.backend)
    out = _fresh_output(args)
    rerun = bool(getattr(args, "rerun_known", False))
    baselines = list(getattr(args, "baseline", None) or [])
    if getattr(args, "upstream", None):
        if rerun or baselines:
            raise UsageError("--rerun-known and --baseline go with accel's own suites, not --upstream")
        return run_upstream(args, backends, out)
    if args.against:
        raise UsageError("--against only goes with --upstream")
    if getattr(args, "collection_threshold", None) is not None and not baselines:
        raise UsageError("--collection-threshold goes with --baseline (the drop is measured against it)")
    suites = suites_dir()
    if args.known_issues and not os.path.isfile(args.known_issues):
        raise UsageError(f"known-issues file not found: {args.known_issues}")
    for path in baselines:
        if not os.path.exists(path):
            raise UsageError(f"--baseline {path}: no such file or folder")
    known = _known_issues(args)
    if rerun and (known is None or not any(issue.tests for issue in known)):
        raise UsageError("--rerun-known needs known issues that name tests: give --known-issues YAML or a --profile "
                         "whose known_issues have 'tests' patterns")
    results, logs = out / "results", out / "logs"
    results.mkdir(parents=True)
    logs.mkdir()
    known_file = None
    if known is not None and len(known):  # the files' and the profile's entries in one file, for the report
        from accel_harness.known_issues import dump_known_issues

        known_file = dump_known_issues(known, out / "known-issues.yaml")
    print(f"accel qualify: backends {', '.join(backends)}; suites {suites}; output {out}"
          + (f"; re-running the tests of {sum(1 for i in known if i.tests)} known issue(s)" if rerun else ""), flush=True)

    pytest_cmd = [
        sys.executable, "-m", "pytest", str(suites), "-p", "no:cacheprovider", "-v", "--no-header", "-rfE",
        "--ignore", str(suites / "benchmarks"),
        "-m", " or ".join(backends) if getattr(args, "models", "quick") != "none" else f"({' or '.join(backends)}) and not models",
        "--results-dir", str(results), "--dist-timeout", f"{args.dist_timeout:g}",
    ]
    for name in backends:
        pytest_cmd += ["--backend", name]
    workers = default_workers() if args.workers is None else args.workers
    if workers:
        pytest_cmd += ["-n", str(workers)]
    if getattr(args, "flake_runs", 0):
        pytest_cmd += ["--flake-runs", str(args.flake_runs)]
    sweep_stage = args.ops != "none" and not rerun
    if args.k or sweep_stage:  # the operator stage's sweep is the suites' quick-sweep test, run once, not twice
        pytest_cmd += ["-k", " and ".join(
            ([f"({args.k})"] if args.k else []) + ([f"not {SUITE_SWEEP_TEST}"] if sweep_stage else []))]
    if args.known_issues:
        pytest_cmd += ["--known-issues", args.known_issues]
    if getattr(args, "profile", None):
        pytest_cmd += ["--profile", os.path.abspath(args.profile)]
    if rerun:
        pytest_cmd += ["-p", "accel_harness.known_issues", "--accel-rerun-known", str(known_file)]
    stages: list[dict] = []
    artefacts = [("suite results", results), ("suite log", logs / "suites.log")]
    status, interrupted = 0, None
    stage = "conformance suites"
    try:
        full_models = {"RUN_SLOW": "1"} if getattr(args, "models", "quick") == "full" else None
        if _step(stage, pytest_cmd, logs / "suites.log", stages, env=child_environment(full_models)) != 0:
            status = 1
        if sweep_stage:
            for name in backends:
                stage = f"operators ({name})"
                artefacts += [(f"operators ({name})", out / "ops" / name)]
                code = _step(stage, _ops_command(args, name, out / "ops" / name, known_file), logs / f"ops-{name}.log", stages)
                if code != 0:
                    status = 1
        if not args.no_bench and not rerun and importlib.util.find_spec("accel.commands.bench"):
            bench_dir = out / "bench"
            artefacts += [("benchmarks", bench_dir)]
            for name in backends:
                stage = f"benchmarks ({name})"
                cmd = [sys.executable, "-m", "accel.commands.cli", "bench", "--backend", name, "--results-dir", str(bench_dir),
                       "--set", "all" if getattr(args, "thorough", False) else "core"]
                if args.quick:
                    cmd.append("--quick")
                if _step(stage, cmd, logs / f"bench-{name}.log", stages) != 0:
                    status = 1
    except KeyboardInterrupt:
        interrupted = stage
        status = 130
        print(f"\naccel qualify: interrupted during {stage}; rendering a partial report", flush=True)
    if importlib.util.find_spec("accel.commands.report"):
        report_dir = out / "report"
        inputs = [str(results)] + [str(p) for p in _ops_results(out)] + ([str(out / "bench")] if (out / "bench").is_dir() else [])
        title = ("accel qualify --rerun-known" if rerun else "accel qualify") + (
            f" — PARTIAL: interrupted during {interrupted}" if interrupted else "")
        cmd = [sys.executable, "-m", "accel.commands.cli", "report", *inputs, "-o", str(report_dir), "--title", title,
               "--support-matrix"]
        if known_file is not None:
            cmd += ["--known-issues", str(known_file)]
        if baselines:
            cmd += ["--baseline", *[os.path.abspath(b) for b in baselines], "--fail-on", "new-failures,regressions,collection-drop"]
            if args.collection_threshold is not None:
                cmd += ["--collection-threshold", f"{args.collection_threshold:g}"]
        code = _step("report", cmd, logs / "report.log", stages)
        if baselines:
            _print_comparison(logs / "report.log")
        if code == COLLECTION_DROP and not interrupted:
            print("accel qualify: FAILED: fewer tests were collected than in the baseline (see the report's baseline "
                  "section; --collection-threshold sets how many may go missing)", flush=True)
            status = status or 1
        elif code not in (0, 1, 3) and not interrupted:  # 1/3 are the report's own gate verdicts, already reflected by the suites
            status = 1
        artefacts += [("report", report_dir)]
    verdicts = _rerun_verdicts(known, results) if rerun else []
    if getattr(args, "json_summary", False):
        summary = {"backends": backends, "suites": str(suites), "output": str(out), "status": status,
                   "partial": interrupted is not None, "interrupted_during": interrupted, "stages": stages,
                   "artefacts": {label: str(path) for label, path in artefacts}}
        if rerun:
            summary["rerun_known"] = [{"id": v.issue.id, "status": v.status, "passed": list(v.passed),
                                       "failed": list(v.failed), "skipped": len(v.skipped)} for v in verdicts]
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        artefacts.append(("summary", out / "summary.json"))
    if getattr(args, "history", None):  # --history DB: this run appended to the run history
        status = _append_history(args.history, [results, *_ops_results(out), out / "bench"]) or status
    print(_closing_line(status, interrupted))
    print(f"accel qualify: {_tally(results, out / 'bench' if not args.no_bench else None, _ops_results(out))}")
    print(f"accel qualify: {stage_costs(stages)}")
    for verdict in verdicts:
        print(f"accel qualify: {verdict.line()}")
    for label, path in artefacts:
        print(f"  {label:<14} {path}")
    return status


#: ``accel report``'s exit status for a drop in collected tests (accel.commands.report.EXIT_COLLECTION_DROP)
COLLECTION_DROP = 4
#: the suites' test that runs the quick operator sweep (suites/test_ops.py): the operator stage does its work
SUITE_SWEEP_TEST = "test_quick_operator_sweep"


def _known_issues(args: argparse.Namespace) -> object | None:
    """The run's known issues: ``--known-issues`` merged with the profile's ``known_issues`` (None: neither)."""
    from accel_harness.known_issues import KnownIssuesError, load_known_issues

    known = None
    try:
        if args.known_issues:
            known = load_known_issues(args.known_issues)
        if getattr(args, "profile", None):
            from accel.backends.profile import ProfileError, load_profile
            from accel_harness.profile import load_profile_known_issues

            try:
                profile = load_profile(args.profile)
            except ProfileError as exc:
                raise UsageError(f"--profile: {exc}") from None
            if profile.known_issues:
                known = load_profile_known_issues(profile, known)
    except KnownIssuesError as exc:
        raise UsageError(str(exc)) from None
    return known


def _rerun_verdicts(known: object, results: Path) -> list:
    """Per known issue, what re-running its tests found (from the run's results files)."""
    from accel_harness.known_issues import rerun_verdicts
    from accel_harness.records import read_records

    records: list[dict] = []
    torch_version = None
    for path in sorted(results.glob("*.jsonl")) if results.is_dir() else []:
        header, found, _ = read_records(path)
        torch_version = torch_version or (header or {}).get("torch_version")
        records.extend(found)
    return rerun_verdicts(known, records, torch_version)


def _ops_command(args: argparse.Namespace, backend: str, folder: Path, known_file: Path | None) -> list[str]:
    """The ``accel ops`` child command of one backend's operator stage."""
    cmd = [sys.executable, "-m", "accel.commands.cli", "ops", "--backend", backend, "-o", str(folder)]
    if args.ops == "quick":
        cmd.append("--quick")
    if getattr(args, "ops_k", None):
        cmd += ["-k", args.ops_k]
    if args.workers:
        cmd += ["-n", str(args.workers)]
    if known_file is not None:
        cmd += ["--known-issues", str(known_file)]
    if getattr(args, "profile", None):
        cmd += ["--profile", os.path.abspath(args.profile)]
    return cmd


def default_workers() -> int:
    """The suites' xdist workers when ``-n`` is not given: 2 on a machine with two usable cores or more (the
    suites' multi-rank tests start their own processes, so more workers mostly add contention), else 0."""
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return 2 if cores >= 2 else 0


def _append_history(db: str, paths: list[Path]) -> int:
    """``--history DB``: append the run's suite results and benchmarks to the run history; 2 (bad input, as
    ``accel report --history`` exits) when it cannot."""
    from accel_reports.history.store import HistoryError, append_results

    try:
        result = append_results(db, paths)
    except HistoryError as exc:
        print(f"accel qualify: history {db}: {exc}", file=sys.stderr)
        return 2
    print(f"accel qualify: history {db}: {result.summary()}", flush=True)
    return 0
