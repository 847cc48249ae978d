"""The end of an ``accel qualify`` run in words: the tally of every result, where the time went, how it
ended, and what the report said about the baseline (apart from the stages that produce them)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["closing_line", "ops_results", "print_comparison", "stage_costs", "tally"]


def print_comparison(log: Path) -> None:
    """Echo what the report said about the baseline: collection drops and comparisons that are not like for like."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    for line in lines:
        if line.startswith("accel report: baseline:"):
            print("accel qualify: " + line.removeprefix("accel report: "), flush=True)


def stage_costs(stages: list[dict]) -> str:
    """Where the run's time went, in one line: each stage's seconds in the order they ran, then the sum
    (the first place to look when a qualification grows slow)."""
    if not stages:
        return "stage costs: no stage ran"
    parts = [f"{stage['stage']} {stage['seconds']:.1f}s" for stage in stages]
    return f"stage costs: {', '.join(parts)}; {sum(stage['seconds'] for stage in stages):.1f}s in all"


def closing_line(status: int, interrupted: str | None) -> str:
    """One line that says how the run ended: done, done with failures, or interrupted (never confused)."""
    if interrupted:
        return f"accel qualify: interrupted during {interrupted}; what finished is kept and the report is partial"
    return "accel qualify: done" + ("" if status == 0 else " (with failures)")


def ops_results(out: Path) -> list[Path]:
    """The results folders the operator stages wrote (one per backend)."""
    return sorted(p for p in (out / "ops").glob("*/results") if p.is_dir())


def tally(results: Path, bench: Path | None, ops: list[Path] | None = None) -> str:
    """The whole run in one line: suite outcomes per backend, operator rows per backend, then benchmarks
    measured and too noisy to judge."""
    from accel_harness.records import read_records

    parts = []
    for label, folders in (("tests", [results]), ("operator rows", ops or [])):
        counts: dict[str, dict[str, int]] = {}
        for folder in folders:
            for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
                _, records, _ = read_records(path)
                for rec in records:
                    per = counts.setdefault(str(rec.get("backend") or "?"), {})
                    per[rec["outcome"]] = per.get(rec["outcome"], 0) + 1
        for backend, per in sorted(counts.items()):
            shown = ", ".join(f"{per[o]} {o}" for o in ("passed", "failed", "error", "skipped", "xfailed", "xpassed") if per.get(o))
            parts.append(f"{backend}: {sum(per.values())} {label} ({shown})")
    if bench is not None and bench.is_dir():
        from accel_reports.analyse.noise import noisy_benchmarks  # the count the report gives

        measured = noisy = 0
        for path in bench.rglob("*.json"):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            items = [b for b in data.get("benchmarks", []) if isinstance(b, dict)] if isinstance(data, dict) else []
            measured += len(items)
            noisy += len(noisy_benchmarks(items))
        parts.append(f"{measured} benchmarks measured" + (f", {noisy} too noisy to judge" if noisy else ""))
    return "; ".join(parts) if parts else "no results were recorded"
