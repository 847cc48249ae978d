"""`accel ops`: operator conformance of a backend, from torch's own test databases.

Runs every OpInfo entry (and, in the full sweep, every ModuleInfo and OptimInfo entry) of the
installed torch on the device and on the host, compares them, and writes the op x dtype table, the
dispatcher census, result records and a Markdown page into one folder (see
:mod:`accel_harness.ops`). ``--quick`` is the sweep ``accel qualify`` runs: every operator, float32
and bfloat16, forward, three samples.

Exit status: 0 when no row failed outside the known issues and no claimed dtype was contradicted,
1 otherwise, 2 for a usage error or a sweep that could not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from pathlib import Path

from accel.commands import UsageError, default_output

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Sweep torch's operator database (OpInfo, ModuleInfo, OptimInfo) on a backend against the host."
    parser.add_argument("--backend", metavar="NAME", help="backend to sweep (default: the detected one)")
    parser.add_argument("--quick", action="store_true",
                        help="every operator, float32 and bfloat16, forward, 3 samples (what accel qualify runs)")
    parser.add_argument("--dtypes", metavar="D,...", help="only these dtypes (default: every dtype the device claims)")
    parser.add_argument("--databases", metavar="K,...", help="op, module, optim (default: all three; --quick: op)")
    parser.add_argument("--directions", metavar="D,...", help="forward, backward, step (default: all; --quick: forward)")
    parser.add_argument("--variants", metavar="V,...",
                        help="function, method, inplace, out, noncontiguous, train, eval, step (default: all)")
    parser.add_argument("-k", dest="pattern", metavar="PATTERN",
                        help="only entries whose name matches: glob patterns, comma-separated ('fft.*,*norm*,add')")
    parser.add_argument("--extra-opinfos", "--extra_opinfos", dest="extra_opinfos", action="append", metavar="MODULE:ATTR",
                        help="also sweep the OpInfo entries in this list (a vendor's own operators; repeatable)")
    parser.add_argument("--samples", type=int, default=None, metavar="N", help="samples per entry and dtype (0: all; default 4, --quick 3)")
    parser.add_argument("-n", "--workers", type=int, default=0, metavar="N", help="worker processes (default: the number of CPUs, at most 8)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="per-sample limit before the case counts as a hang (default 60)")
    parser.add_argument("--known-issues", "--known_issues", dest="known_issues", action="append", metavar="YAML",
                        help="known issues; entries with 'ops' patterns cover operator rows (repeatable)")
    parser.add_argument("--profile", metavar="FILE", help="device profile: its tolerances, op_tolerances, claimed dtypes and known issues")
    parser.add_argument("--no-census", "--no_census", dest="no_census", action="store_true", help="skip the dispatcher census and the training-step trace")
    parser.add_argument("-o", "--output", metavar="DIR", help="fresh folder for the results (default: ./accel-results/ops-<backend>-<UTC time>)")


def _split(value: str | None, allowed: tuple[str, ...], flag: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [v for v in items if v not in allowed]
    if unknown or not items:
        raise UsageError(f"{flag}: unknown value(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(allowed)}")
    return items


def selection_from(args: argparse.Namespace) -> object:
    """The sweep's :class:`~accel_harness.ops.plan.Selection` from the command line."""
    from accel_harness.ops.plan import ALL_DTYPES, DIRECTIONS, KINDS, QUICK, VARIANTS, Selection

    base = QUICK if args.quick else Selection()
    changes: dict[str, object] = {}
    for flag, field, allowed in (("--dtypes", "dtypes", ALL_DTYPES), ("--databases", "kinds", KINDS),
                                 ("--directions", "directions", DIRECTIONS), ("--variants", "variants", VARIANTS)):
        value = _split(getattr(args, field if field != "kinds" else "databases"), allowed, flag)
        if value is not None:
            changes[field] = value
    if args.samples is not None:
        if args.samples < 0:
            raise UsageError(f"--samples must be >= 0, got {args.samples}")
        changes["limit"] = args.samples
    if args.pattern:
        changes["pattern"] = args.pattern
    for spec in args.extra_opinfos or []:
        module, _, attribute = spec.partition(":")
        if not module or not attribute:
            raise UsageError(f"--extra-opinfos {spec!r}: write MODULE:ATTRIBUTE naming a list of OpInfo entries")
    if args.extra_opinfos:
        changes["extra_opinfos"] = tuple(args.extra_opinfos)
    return dataclasses.replace(base, **changes)


def _output(args: argparse.Namespace, backend: str) -> Path:
    out = Path(args.output or default_output(f"ops-{backend}"))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} already exists and is not empty: accel ops writes into a fresh folder")
    return out.resolve()


def _load_known(args: argparse.Namespace, profile: object) -> object:
    from accel_harness.known_issues import KnownIssuesError, load_known_issues

    known = None
    try:
        for path in args.known_issues or []:
            if not os.path.isfile(path):
                raise UsageError(f"--known-issues {path}: no such file")
        if args.known_issues:
            known = load_known_issues(*args.known_issues)
        if profile is not None and getattr(profile, "known_issues", None):
            from accel_harness.profile import load_profile_known_issues

            known = load_profile_known_issues(profile, known)
    except KnownIssuesError as exc:
        raise UsageError(str(exc)) from None
    return known


def run(args: argparse.Namespace) -> int:
    from accel_harness.ops.runner import SweepError, check_requirements

    try:
        check_requirements()
    except SweepError as exc:
        raise UsageError(str(exc)) from None
    if args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0, got {args.timeout:g}")
    profile = None
    if args.profile:
        from accel.backends.profile import ProfileError, load_profile

        try:
            profile = load_profile(args.profile)
        except ProfileError as exc:
            raise UsageError(f"--profile: {exc}") from None
    backend = (args.backend or (profile.name if profile is not None else None) or _detected()).lower()
    selection = selection_from(args)
    known = _load_known(args, profile)
    out = _output(args, backend)
    from accel_harness.ops.profile_rules import check_claims, tolerance_rules

    selection = dataclasses.replace(selection, tolerance_rules=tolerance_rules(profile))
    workers = args.workers or max(1, min(os.cpu_count() or 1, 8))
    out.mkdir(parents=True, exist_ok=True)
    command = "accel ops " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["ops"] else None
    print(f"accel ops: {backend}; {'quick' if args.quick else 'full'} sweep of {', '.join(selection.kinds)}; "
          f"{workers} workers; output {out}", flush=True)
    return _sweep(backend, selection, workers, args, out, known, profile, command, check_claims)


def _detected() -> str:
    from accel.backends import BackendError, get_registry

    try:
        return get_registry().select().name
    except BackendError as exc:
        raise UsageError(str(exc)) from None


def _sweep(backend: str, selection: object, workers: int, args: argparse.Namespace, out: Path, known: object,
           profile: object, command: str | None, check_claims: object) -> int:
    from accel_harness.ops.output import apply_known_issues, headline_lines, write_outputs
    from accel_harness.ops.runner import SweepError, run_sweep

    last = [0.0]

    def progress(done: int, total: int, failed: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 5 or done == total:
            last[0] = now
            print(f"accel ops: {done}/{total} tasks, {failed} failed rows", flush=True)

    try:
        result = run_sweep(backend, selection, workers=workers, timeout=args.timeout, census=not args.no_census,
                           log_path=str(out / "workers.log"), on_progress=progress)
    except SweepError as exc:
        print(f"accel ops: {exc}", file=sys.stderr)
        return 2
    apply_known_issues(result.rows, known, backend, result.torch.split("+")[0])
    claims = check_claims(result.rows, profile)
    paths = write_outputs(result, out, command, claims=claims)
    import json

    summary = json.loads(paths["summary"].read_text(encoding="utf-8"))
    for line in headline_lines(summary):
        print(f"accel ops: {line}")
    failed = [r for r in result.rows if r.outcome == "failed"]
    contradicted = [d for d, v in claims.items() if v["verdict"] == "claim-contradicted"]
    for dtype in contradicted:
        print(f"accel ops: claim-contradicted: the profile claims {dtype}, but only {claims[dtype]['passed']} of "
              f"{claims[dtype]['compared']} operators passed in it")
    for row in failed[:20]:
        print(f"    FAILED {row.op} {row.variant} {row.dtype} {row.direction}: {row.reason_code}: {(row.message or '')[:160]}")
    if len(failed) > 20:
        print(f"    ... and {len(failed) - 20} more (op_support.csv)")
    print(f"accel ops: {result.cases} cases in {result.seconds:.1f} s; {len(failed)} failed rows outside the known issues")
    for label in ("op_support", "census", "support", "markdown", "records"):
        if label in paths:
            print(f"  {label:<12} {paths[label]}")
    return 1 if failed or contradicted else 0
