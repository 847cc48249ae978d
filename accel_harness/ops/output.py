"""Write a sweep's results: the tables, the records the reports read, a summary and a Markdown page.

``op_support.csv``  one row per entry x variant x dtype x direction (see :class:`~.plan.Row`)
``census.csv``      one row per aten overload: ``operator``, ``kind``, ``host_kernel``
``training_step.csv`` the overloads a training step reached: ``operator``, ``calls``, ``kind``
``support.csv``     per operator: the dtypes it passed in and its limitations (publishable)
``results/ops-<backend>.jsonl`` the rows as result records (history, regression gate, ``accel report``)
``summary.json``    headline figures, the device's dtype claims, the sweep's cost
``ops.md``          the headline, failures grouped by reason and message, the support list
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from ..records import RecordWriter, RunHeader, make_record
from .outcomes import OP_REASONS, RECORD_OUTCOME
from .plan import Row
from .runner import SweepResult
from .summary import headline, support_list

__all__ = ["OP_SUPPORT_COLUMNS", "apply_known_issues", "nodeid_of", "write_outputs"]

#: the columns of op_support.csv, the issue's nine first
OP_SUPPORT_COLUMNS = ("op", "variant", "dtype", "direction", "outcome", "reason_code", "max_abs_err", "max_rel_err",
                      "message", "kind", "samples", "tolerance", "known_issue", "seconds")


def nodeid_of(row: Row) -> str:
    """A row's test id in the records (device-neutral: the backend is not part of it)."""
    return f"suites/test_ops.py::{row.op}[{row.kind}-{row.variant}-{row.dtype}-{row.direction}]"


def apply_known_issues(rows: list[Row], known: Any, backend: str, torch_version: str | None) -> int:
    """Turn failed rows that a known issue's ``ops`` cover into ``known`` rows; returns how many."""
    if known is None:
        return 0
    count = 0
    for row in rows:
        if row.outcome != "failed":
            continue
        issue = known.match_op(row.op, row.dtype, backend, torch_version, row.message)
        if issue is not None:
            row.outcome, row.known_issue = "known", issue.id
            count += 1
    return count


def _csv(path: Path, columns: tuple[str, ...] | list[str], rows: list[dict[str, Any]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _records(result: SweepResult, rows: list[Row], path: Path, command: str | None, figures: dict[str, Any]) -> Path:
    from accel.backends import get_backend

    # the header the suites write (versions, build, devices, driver, commit), so a sweep and the suites of
    # one machine fall into one cell of the report and tell the same facts
    header = RunHeader.collect([get_backend(result.backend)], extra={
        "stage": "operators", "command": command, "device": result.device, "claims": result.claims, "ops": figures})
    with RecordWriter(path, header) as writer:
        for row in rows:
            outcome = RECORD_OUTCOME[row.outcome]
            text = None if outcome in ("passed", "skipped", "xpassed") else f"{row.reason_code}: {row.message or ''}"
            record = make_record(run_id=writer.run_id, nodeid=nodeid_of(row), backend=result.backend, outcome=outcome,
                                 duration=row.seconds, text=text if outcome != "skipped" else None,
                                 message=row.message if outcome == "skipped" else None, known_issue=row.known_issue,
                                 extra={"area": "operators", **{k: v for k, v in asdict(row).items() if k != "message"}})
            record.reason_code = row.reason_code  # every row carries its code, failures too
            writer.write(record)
    return path


def write_outputs(result: SweepResult, out: Path, command: str | None = None,
                  claims: dict[str, Any] | None = None) -> dict[str, Path]:
    """Write every file of a sweep into ``out`` (created); ``claims`` is the profile's dtype claims
    checked against the rows. Returns name -> path."""
    out.mkdir(parents=True, exist_ok=True)
    rows = sorted(result.rows, key=lambda r: (r.kind, r.op, r.dtype, r.variant, r.direction))
    figures = headline(rows, result.census, result.trace)
    figures["profile_claims"] = claims or {}
    paths = {
        "op_support": _csv(out / "op_support.csv", OP_SUPPORT_COLUMNS, [asdict(r) for r in rows]),
        "support": _csv(out / "support.csv", ("op", "supported_dtypes", "limitations"),
                        [{"op": s["op"], "supported_dtypes": " ".join(s["supported_dtypes"]),
                          "limitations": "; ".join(s["limitations"])} for s in support_list(rows)]),
    }
    if result.census:
        paths["census"] = _csv(out / "census.csv", ("operator", "kind", "host_kernel"), result.census)
    if result.trace:
        paths["training_step"] = _csv(out / "training_step.csv", ("operator", "calls", "kind"), result.trace)
    (out / "results").mkdir(exist_ok=True)
    paths["records"] = _records(result, rows, out / "results" / f"ops-{result.backend}.jsonl", command, figures)
    summary = {"backend": result.backend, "device": result.device, "torch": result.torch, "command": command,
               "claims": result.claims, "profile_claims": claims or {}, "headline": figures, "census_error": result.census_error,
               "cost": {"seconds": round(result.seconds, 2), "tasks": result.tasks, "cases": result.cases,
                        "workers": result.workers, "restarts": result.restarts,
                        "cases_per_second": round(result.cases / result.seconds, 1) if result.seconds else None}}
    paths["summary"] = out / "summary.json"
    paths["summary"].write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    paths["markdown"] = out / "ops.md"
    paths["markdown"].write_text(markdown(summary, rows), encoding="utf-8")
    return paths


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def headline_lines(summary: dict[str, Any]) -> list[str]:
    """The headline in sentences (the console and the Markdown page print the same lines)."""
    figures = summary["headline"]
    lines = []
    for dtype, rate in sorted(figures["operators_passed"].items()):
        lines.append(f"{dtype}: {rate['passed']} of {rate['compared']} operators passed ({_share(rate['share'])})")
    census = figures.get("census")
    if census:
        lines.append(f"device kernels: {census['kinds'].get('device-kernel', 0)} of {census['need_backend_kernel']} aten "
                     f"overloads that need a backend kernel ({_share(census['device_kernel_share'])}; the host has "
                     f"{_share(census['host_kernel_share'])}); fallback: {census['kinds'].get('fallback', 0)}, "
                     f"missing: {census['kinds'].get('missing', 0)}")
    step = figures.get("training_step")
    if step:
        lines.append(f"a training step reached {step['overloads']} overloads, {len(step['fallback_overloads'])} of them "
                     f"({step['fallback_calls']} of {step['calls']} calls) through the fallback")
    outcomes = figures["outcomes"]
    lines.append("rows: " + ", ".join(f"{outcomes[o]} {o}" for o in ("passed", "failed", "known", "xfailed", "xpassed", "skipped")
                                       if outcomes.get(o)))
    return lines


def markdown(summary: dict[str, Any], rows: list[Row]) -> str:
    """The sweep as a Markdown page: headline, failures grouped by reason and message, fallbacks, support list."""
    from ..records import failure_signature

    lines = [f"# Operator conformance: {summary['backend']} ({summary['device']}), torch {summary['torch']}", ""]
    if summary.get("command"):
        lines += [f"`{summary['command']}`", ""]
    lines += [f"- {line}" for line in headline_lines(summary)]
    cost = summary["cost"]
    lines += [f"- {cost['cases']} cases in {cost['seconds']} s on {cost['workers']} workers "
              f"({cost['cases_per_second']} cases/s, {cost['restarts']} worker restarts)", ""]
    unclaimed = {d: why for d, why in summary["claims"].items() if why}
    if unclaimed:
        lines += ["Dtypes the device does not claim (not swept):", ""] + [f"- {d}: {why}" for d, why in unclaimed.items()] + [""]
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        if row.outcome in ("failed", "known"):
            groups[(row.reason_code, failure_signature(row.message or "") or "")].append(row)
    if groups:
        lines += ["## Failures by reason", "", "| reason | rows | operators | message |", "|---|---:|---|---|"]
        for (reason, signature), members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            ops = sorted({f"{r.op} ({r.dtype})" for r in members})
            shown = ", ".join(ops[:8]) + (f", ... {len(ops) - 8} more" if len(ops) > 8 else "")
            known = {r.known_issue for r in members if r.known_issue}
            lines.append(f"| {reason}{' (known: ' + ', '.join(sorted(known)) + ')' if known else ''} | {len(members)} | "
                         f"{_cell(shown)} | {_cell(signature[:160])} |")
        lines.append("")
    lines += ["## Reason codes", "", "| code | outcome | meaning |", "|---|---|---|"]
    lines += [f"| {code} | {outcome} | {meaning} |" for code, (outcome, meaning) in OP_REASONS.items()] + [""]
    step = summary["headline"].get("training_step")
    if step and step["fallback_overloads"]:
        lines += ["## Reached through the fallback in a training step", "", ", ".join(f"`{o}`" for o in step["fallback_overloads"]), ""]
    lines += ["## Support list", "", "| operator | dtypes passed | limitations |", "|---|---|---|"]
    lines += [f"| {s['op']} | {' '.join(s['supported_dtypes'])} | {_cell('; '.join(s['limitations']))} |" for s in support_list(rows)]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
