"""One report over many cells: find each cell's results, run ``accel report``, add a table of cells.

    python -m ci.collect ROOT... -o DIR [--baseline PATH...] [--expect "ID ID ..."]
                         [--known-issues YAML] [--fail-on GATES] [--title TEXT] [--history DB]

ROOT folders are searched for ``cell.json`` files (written by ``python -m ci.run_cell``; in CI, the
downloaded ``cell-*`` artifacts). Every cell's ``results/``, ``ops/results/`` (the operator
sweep's rows, test records like the suites') and ``bench/`` go to ``accel report ... -o DIR``,
with ``--baseline`` when the baseline paths exist and hold files (a missing baseline, e.g. the
first nightly or an expired artifact, is a note, not an error).
Besides the report's ``report.html`` and ``report.md`` it writes ``DIR/cells.md`` (one row per
cell: runner, torch asked and installed, python, environment status, outcome counts, the operator
sweep's rows, wall time;
cells named in ``--expect`` that left nothing are listed as missing) and ``DIR/summary.md``
(``cells.md`` followed by ``report.md``: what CI appends to ``$GITHUB_STEP_SUMMARY``).

Exit status: ``accel report --strict``'s (0 ok, 1 new untracked failures, 3 confirmed benchmark
regressions, 4 collection drop when asked for, 2 usage/input error: invalid or unreadable results
included, 5 internal error), and 2 when no cell left any
results (``summary.md`` is still written, saying so). Benchmark regressions count only for cells
that ran ``bench: full``: a ``quick`` run is a smoke run on few rounds (on shared hosted runners
its numbers swing by tens of percent from night to night), so its regressions are shown in the
report but never fail the gate. The full-mode benchmarks are judged by a second ``accel report``
over them alone (``DIR/bench-gate/report.md``).

``--history DB`` appends every cell's test runs and benchmark runs to the run history (SQLite file or PostgreSQL URL)
(:mod:`accel_reports.history.store`; a run already stored is skipped, so re-running the collection is
harmless) before the reports, and passes ``--history DB`` on to ``accel report``: the benchmarks are then judged against their own last runs (the noise band of
:mod:`accel_reports.analyse.benchmarks`) instead of one baseline run. Keep the file between nightlies (a
CI cache or artifact). A history that cannot be used (another schema version, a run id stored
with other content) is reported and the collection exits 2 when nothing else failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from ci.matrix import DEFAULT_MATRIX, REPO, MatrixError, load_matrix

EXIT_NO_RESULTS = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ci.collect", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="+", metavar="ROOT", help="folders holding cells (searched for cell.json)")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="report folder")
    parser.add_argument("--baseline", nargs="*", default=[], metavar="PATH",
                        help="previous results (files or folders); absent or empty paths are skipped with a note")
    parser.add_argument("--expect", default="", metavar="IDS", help="cell ids that should be there (space or comma separated)")
    parser.add_argument("--known-issues", metavar="YAML", help="known-issues file (default: the matrix's known_issues)")
    parser.add_argument("--matrix", default=str(DEFAULT_MATRIX), metavar="YAML", help="matrix file (for known_issues)")
    parser.add_argument("--fail-on", metavar="GATES", help="passed to accel report (default: its own)")
    parser.add_argument("--title", default="accel nightly", help="report title")
    parser.add_argument("--history", metavar="DB",
                        help="run history (SQLite file or postgresql:// URL) to append every cell's results and benchmarks to (created if absent)")
    return parser


def append_history(db: str, inputs: Sequence[str]) -> str:
    """Append the runs under ``inputs`` to the history ``db``; the line to print. Raises
    :class:`accel_reports.history.store.HistoryError` when the history cannot take them."""
    from accel_reports.history.store import open_history
    from accel_reports.load.loaders import load_results

    loaded = load_results(inputs)
    with open_history(db) as history:
        result = history.ingest(loaded)
    return f"ci.collect: history {db}: {result.summary()}"


def find_cells(roots: Sequence[str | os.PathLike[str]]) -> list[tuple[Path, dict[str, Any]]]:
    """``(cell folder, cell.json content)`` for every cell under ``roots``, sorted by cell id."""
    found: dict[Path, dict[str, Any]] = {}
    for root in roots:
        root = Path(root)
        paths = [root / "cell.json"] if (root / "cell.json").is_file() else sorted(root.rglob("cell.json"))
        for path in paths:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                data = {"id": path.parent.name, "status": "unreadable", "error": f"{path}: {exc}"}
            if not isinstance(data, dict):
                data = {"id": path.parent.name, "status": "unreadable", "error": f"{path}: not a JSON object"}
            found[path.parent.resolve()] = data
    return sorted(found.items(), key=lambda item: str(item[1].get("id") or item[0].name))


def _has_files(path: Path, pattern: str) -> bool:
    return path.is_dir() and any(p.is_file() and p.stat().st_size > 0 for p in path.rglob(pattern))


def report_inputs(cells: Sequence[tuple[Path, dict[str, Any]]]) -> list[str]:
    inputs: list[str] = []
    for folder, _ in cells:
        if _has_files(folder / "results", "*"):
            inputs.append(str(folder / "results"))
        if _has_files(folder / "ops" / "results", "*"):
            inputs.append(str(folder / "ops" / "results"))
        if _has_files(folder / "bench", "*.json"):
            inputs.append(str(folder / "bench"))
    return inputs


def baseline_inputs(paths: Sequence[str]) -> list[str]:
    """The baseline paths for ``accel report``: a folder of cells (a previous nightly's artifact)
    becomes its cells' results and bench folders; missing or empty paths are left out."""
    inputs: list[str] = []
    for given in paths:
        path = Path(given)
        if path.is_file():
            inputs.append(str(path))
        elif path.is_dir():
            cells = find_cells([path])
            if cells:
                inputs += report_inputs(cells)
            elif _has_files(path, "*"):
                inputs.append(str(path))
    return inputs


def _md(text: Any) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def cells_table(cells: Sequence[tuple[Path, dict[str, Any]]], expected: Sequence[str] = ()) -> str:
    lines = ["## Cells", "",
             "| cell | runner | torch (installed) | python | environment | passed | failed | error | skipped | suites | ops | bench | wall time |",
             "|---|---|---|---|---|---:|---:|---:|---:|---|---|---|---:|"]
    seen = set()
    problems = []
    for _, data in cells:
        cid = str(data.get("id"))
        seen.add(cid)
        torch = data.get("torch") or {}
        python = data.get("python") or {}
        suites = data.get("suites") or {}
        counts = suites.get("counts") or {}
        bench = data.get("bench") or {}
        status = str(data.get("status", "?"))
        if status != "ok":
            problems.append(f"- **{_md(cid)}**: {_md(status)}: {_md(data.get('error') or 'no details')}")
        if bench.get("mode") in (None, "off"):
            bench_text = "off" if bench.get("mode") == "off" else "-"
        else:
            bench_text = f"{bench.get('mode')}: {bench.get('benchmarks', 0)} (exit {bench.get('exit_code')})"
        suites_text = f"exit {suites.get('exit_code')} ({suites.get('verdict')})" if suites else "-"
        ops = data.get("ops") or {}
        if ops.get("mode") in (None, "off"):
            ops_text = "off" if ops.get("mode") == "off" else "-"
        else:
            ops_text = (f"{ops.get('mode')}: {ops.get('rows', 0)} rows, {(ops.get('counts') or {}).get('failed', 0)} failed "
                        f"(exit {ops.get('exit_code')})")
        lines.append("| " + " | ".join(_md(v) for v in (
            cid, ",".join(data.get("runner") or []), torch.get("installed") or f"{torch.get('requested', '?')} (not installed)",
            python.get("version") or python.get("requested") or "-", status,
            counts.get("passed", 0), counts.get("failed", 0), counts.get("error", 0), counts.get("skipped", 0),
            suites_text, ops_text, bench_text, _duration(data.get("duration_s")))) + " |")
    for cid in expected:
        if cid not in seen:
            lines.append(f"| {_md(cid)} | | | | missing | | | | | | | | |")
            problems.append(f"- **{_md(cid)}**: missing: the job left no cell.json (it did not start, was cancelled, or its upload failed)")
    if problems:
        lines += ["", "Cells without results:", "", *problems]
    return "\n".join(lines) + "\n"


GATES = ("new-failures", "regressions", "collection-drop")


def _gates(text: str | None) -> list[str]:
    items = [t.strip() for t in (text or "new-failures,regressions").split(",") if t.strip()]
    if items == ["none"]:
        return []
    bad = [t for t in items if t not in GATES]
    if bad or not items:
        raise SystemExit(f"ci.collect: error: --fail-on takes a comma-separated list of {', '.join(GATES)} or none, got {text!r}")
    return items


def gating_bench(cells: Sequence[tuple[Path, dict[str, Any]]]) -> tuple[list[str], list[str]]:
    """``(bench folders whose regressions gate, ids of cells whose benchmarks only inform)``.

    Benchmarks of a cell run with ``bench: quick`` are a smoke run (few rounds, small problems, often
    on shared hosted runners): their regressions are reported but do not fail the nightly.
    """
    gating, informing = [], []
    for folder, data in cells:
        if not _has_files(folder / "bench", "*.json"):
            continue
        mode = (data.get("bench") or {}).get("mode")
        if mode == "quick":
            informing.append(str(data.get("id") or folder.name))
        else:
            gating.append(str(folder / "bench"))
    return gating, informing


def _report(inputs: Sequence[str], out: Path, title: str, baseline: Sequence[str], known: str | None,
            gates: Sequence[str], formats: str = "html,md", history: str | None = None) -> int:
    command = [sys.executable, "-m", "accel.commands.cli", "report", *inputs, "-o", str(out), "--title", title,
               "--format", formats, "--fail-on", ",".join(gates) or "none", "--strict"]  # an unreadable input fails CI
    if history:
        command += ["--history", history]
    if baseline:
        command += ["--baseline", *baseline]
    if known:
        command += ["--known-issues", known]
    print("ci.collect: " + " ".join(command), flush=True)
    return subprocess.call(command)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    gates = _gates(args.fail_on)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    cells = find_cells(args.roots)
    expected = [c for c in args.expect.replace(",", " ").split() if c]
    table = cells_table(cells, expected)
    (out / "cells.md").write_text(table, encoding="utf-8")
    inputs = report_inputs(cells)
    print(f"ci.collect: {len(cells)} cell(s) under {', '.join(args.roots)}; {len(inputs)} results folder(s)")
    if not inputs:
        (out / "summary.md").write_text(f"# {args.title}\n\nNo cell left any results.\n\n{table}", encoding="utf-8")
        print("ci.collect: error: no cell left any results; see " + str(out / "cells.md"), file=sys.stderr)
        return EXIT_NO_RESULTS

    baseline = baseline_inputs(args.baseline)
    if args.baseline and not baseline:
        print(f"ci.collect: note: no baseline in {', '.join(args.baseline)} (first run, or the previous one expired): "
              "reporting without it")
    known = args.known_issues
    if known is None:
        try:
            matrix_known = load_matrix(args.matrix).known_issues
        except MatrixError:
            matrix_known = None
        known = str(REPO / matrix_known) if matrix_known else None

    notes = []
    history_failed = False
    history = None
    if args.history:
        from accel_reports.history.store import HistoryError

        try:
            print(append_history(args.history, inputs))
            history = args.history
        except HistoryError as exc:
            history_failed = True
            print(f"ci.collect: error: history {args.history}: {exc}", file=sys.stderr)
            notes.append(f"_The run history {_md(args.history)} could not be used: {_md(exc)}_")

    # the report over everything gates on everything but benchmark regressions; those are judged
    # on the benchmarks of full-mode cells only (a second, Markdown-only report of them)
    code = _report(inputs, out, args.title, baseline, known, [g for g in gates if g != "regressions"], history=history)
    gating, informing = gating_bench(cells)
    if "regressions" in gates and informing:
        notes.append(f"_Benchmark regressions of the quick (smoke) benchmark cells {', '.join(informing)} are "
                     "reported but do not fail the nightly._")
    if code in (0, 4) and "regressions" in gates and gating:
        bench_code = _report(gating, out / "bench-gate", args.title, baseline, known, ["regressions"], "md", history=history)
        if bench_code == 3:
            code = 3
        elif bench_code != 0:
            code = bench_code
    if not baseline:
        notes.append("_No baseline: this report does not say what changed since the previous nightly._")
    report_md = out / "report.md"
    body = report_md.read_text(encoding="utf-8") if report_md.is_file() else "(accel report wrote no report.md)\n"
    note_text = "".join(f"\n{n}\n" for n in notes)
    (out / "summary.md").write_text(f"{table}{note_text}\n{body}", encoding="utf-8")
    if history_failed and code == 0:
        code = EXIT_NO_RESULTS  # 2: an input the collection was asked to use could not be used
    print(f"ci.collect: exit {code}; summary {out / 'summary.md'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
