"""Operator conformance in a report: the rows of ``accel ops`` sweeps summarised per cell.

An operator sweep (:mod:`accel_harness.ops`) writes one test record per operator x variant x dtype x
direction and its headline figures in the run header; the loader checks both
(:mod:`accel_reports.load.ops_records`). A report may hold thousands of such rows; this module turns the latest row of each
in a cell into what a vendor reads at a glance:

* the headline figures: the run header's own (the numbers ``accel ops`` printed), else the same
  computation (:func:`accel_harness.ops.summary.headline`) over the rows, without census or trace;
* operator families x dtypes: operators compared and passed, by :func:`~accel_harness.ops.summary.pass_rates`
  (an operator passes in a dtype when every compared row of it passed);
* failures grouped by reason code and message signature, skips by reason code;
* the census counts, the training step's fallbacks, the profile's dtype claims;
* the support list (:func:`accel_harness.ops.summary.support_list`).

Torch-free: everything here reads records only.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import pandas as pd

from accel_harness.records import failure_signature

from .groups import CELL, FAILING, cell_label
from ..load.ops_records import checked_figures, is_operator_id, parse_operator_id

__all__ = ["CORE", "FAMILY_ORDER", "NAMESPACES", "family_of", "operator_cells", "operator_rows", "split_tests"]

#: torch namespaces that make an operator family of their own (the op name's prefix); any other
#: name (``add``, ``div.floor_rounding``: an entry's variant after the dot) is a plain aten op
NAMESPACES = ("nn.functional", "fft", "linalg", "special", "sparse", "masked", "signal", "nested")
#: the family of plain aten operators
CORE = "core"
#: the family of every entry of a database other than OpInfo
KIND_FAMILIES = {"module": "nn", "optim": "optim"}
#: families in the order the report lists them (others after them, by name)
FAMILY_ORDER = (CORE,) + NAMESPACES + tuple(KIND_FAMILIES.values())


def family_of(kind: str, op: str) -> str:
    """The family an operator is shown in: ``nn.functional.relu`` -> ``nn.functional``, ``fft.fft`` ->
    ``fft``, ``add`` -> ``core``; modules are ``nn`` and optimizers ``optim`` whatever their name."""
    if kind in KIND_FAMILIES:
        return KIND_FAMILIES[kind]
    for namespace in NAMESPACES:
        if op.startswith(namespace + "."):
            return namespace
    return CORE


# ---------------------------------------------------------------------------- rows
def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def split_tests(tests: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(operator rows, other tests)`` of a tests frame."""
    if tests.empty:
        return tests, tests
    mask = tests["test_id"].map(is_operator_id).astype(bool)
    return tests[mask], tests[~mask]


def _reason_of(outcome: str, record_reason: Any, detail: Any, text: Any) -> str:
    """The sweep's reason code of a row: from its details, else its record (skips), else the
    ``<reason>: <message>`` text the sweep writes for a failure."""
    from accel_harness.ops.outcomes import OP_REASONS, PASSED, TORCH_XFAIL

    if isinstance(detail, dict) and isinstance(detail.get("reason_code"), str):
        return detail["reason_code"]
    if outcome == "skipped" and isinstance(record_reason, str) and record_reason:
        return record_reason
    if isinstance(text, str):
        head = text.split(":", 1)[0].strip()
        if head in OP_REASONS:
            return head
    return {"passed": PASSED, "xpassed": PASSED, "xfailed": TORCH_XFAIL}.get(outcome, "unknown")


def _unprefixed(text: Any, reason: str) -> str:
    text = text if isinstance(text, str) else ""
    return text[len(reason) + 2:] if text.startswith(reason + ": ") else text


def operator_rows(tests: pd.DataFrame) -> list[dict[str, Any]]:
    """The latest record of each operator row in each cell, as the sweep's rows: the id's fields,
    ``outcome`` as the sweep names it (a failure with a known issue is ``known``), ``reason_code``,
    the message and signature without the reason, and the cell, run and known issue."""
    ops, _ = split_tests(tests)
    if ops.empty:
        return []
    ordered = ops.assign(_order=ops["start_time"].fillna("")).sort_values("_order", kind="mergesort")
    latest = ordered.drop_duplicates(CELL + ["test_id"], keep="last")
    rows = []
    columns = CELL + ["run_id", "start_time", "test_id", "outcome", "reason_code", "message", "signature", "traceback",
                      "known_issue", "operator"]
    for values in latest[columns].itertuples(index=False, name=None):
        record = dict(zip(columns, values))
        parsed = parse_operator_id(record["test_id"])
        outcome = record["outcome"]
        issue = record["known_issue"] if isinstance(record["known_issue"], str) and record["known_issue"] else None
        if outcome in FAILING:
            outcome = "known" if issue else "failed"
        text = record["traceback"] if isinstance(record["traceback"], str) else record["message"]
        reason = _reason_of(outcome, record["reason_code"], record["operator"], text)
        message = _unprefixed(record["message"], reason)
        signature = _unprefixed(record["signature"], reason) or failure_signature(message) or ""
        detail = record["operator"] if isinstance(record["operator"], dict) else {}
        rows.append({**parsed, "cell": tuple(record[c] for c in CELL), "run_id": record["run_id"],
                     "start_time": record["start_time"], "test_id": record["test_id"], "outcome": outcome,
                     "reason_code": reason, "message": message, "signature": signature, "known_issue": issue,
                     "max_abs_err": detail.get("max_abs_err") if _finite(detail.get("max_abs_err")) else None})
    return rows


# ---------------------------------------------------------------------------- per cell
#: operators named per failure group (the rest are counted)
GROUP_OPERATORS = 12


def _families(rows: list[dict[str, Any]], dtypes: list[str]) -> list[dict[str, Any]]:
    """Per family: operators, and per dtype the operators compared and passed and those that did not pass."""
    from accel_harness.ops.outcomes import COMPARED_OUTCOMES
    from accel_harness.ops.summary import pass_rates

    by_family: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_family[(family_of(row["kind"], row["op"]), row["kind"])].append(row)
    out = []
    for (family, kind), members in by_family.items():
        rates = pass_rates(members, kind=kind)
        bad: dict[str, set[str]] = defaultdict(set)
        for row in members:
            if row["outcome"] in COMPARED_OUTCOMES and row["outcome"] not in ("passed", "xpassed"):
                bad[row["dtype"]].add(row["op"])
        out.append({"family": family, "kind": kind, "operators": len({r["op"] for r in members}),
                    "rates": {d: {**rates[d], "failing": sorted(bad[d])} for d in dtypes if d in rates}})
    order = {name: i for i, name in enumerate(FAMILY_ORDER)}
    return sorted(out, key=lambda f: (order.get(f["family"], len(order)), f["family"], f["kind"]))


def _failure_groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failing rows (known issues too) by reason code and message signature, largest first."""
    from accel_harness.ops.outcomes import OP_REASONS

    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["outcome"] in ("failed", "known"):
            groups[(row["reason_code"], row["signature"] or "(no error text)")].append(row)
    out = []
    for (reason, signature), members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        operators = sorted({f"{r['op']} ({r['dtype']})" for r in members})
        errors = [r["max_abs_err"] for r in members if r["max_abs_err"] is not None]
        out.append({"reason": reason, "meaning": OP_REASONS.get(reason, ("", ""))[1], "signature": signature,
                    "rows": len(members), "untracked": sum(1 for r in members if r["outcome"] == "failed"),
                    "known_issues": sorted({r["known_issue"] for r in members if r["known_issue"]}),
                    "operators": operators[:GROUP_OPERATORS], "more": max(len(operators) - GROUP_OPERATORS, 0),
                    "message": next((r["message"] for r in members if r["message"]), ""),
                    "max_abs_err": max(errors) if errors else None})
    return out


def _latest_run(rows: list[dict[str, Any]], runs: pd.DataFrame) -> tuple[str | None, Any]:
    """The newest run the rows come from, and its header's ``extra.ops`` (None when not loaded)."""
    started = {r["run_id"]: r["start_time"] or "" for r in rows}
    run_id = max(started, key=lambda r: (started[r], r)) if started else None
    if run_id is None or runs.empty or "ops" not in runs.columns:
        return run_id, None
    match = runs.loc[runs["run_id"] == run_id, "ops"]
    return run_id, (match.iloc[0] if len(match) else None)


def _ordered_dtypes(found: set[str]) -> list[str]:
    from accel_harness.ops.plan import ALL_DTYPES

    return [d for d in ALL_DTYPES if d in found] + sorted(found - set(ALL_DTYPES))


def operator_cells(tests: pd.DataFrame, runs: pd.DataFrame) -> list[dict[str, Any]]:
    """Per cell with operator rows: the summary (see the module docstring) as plain data."""
    from accel_harness.ops.output import headline_lines
    from accel_harness.ops.summary import headline, pass_rates, support_list

    by_cell: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in operator_rows(tests):
        by_cell[row["cell"]].append(row)
    cells = []
    for cell in sorted(by_cell, key=lambda c: tuple(str(v) for v in c)):
        rows = by_cell[cell]
        run_id, stored = _latest_run(rows, runs)
        figures, _ = checked_figures(stored)
        from_run = figures is not None
        if figures is None:
            figures = {**headline(rows, [], []), "profile_claims": {}}
        step = figures.get("training_step") or {}
        dtypes = _ordered_dtypes({r["dtype"] for r in rows if r["outcome"] != "skipped"})
        cells.append({
            "cell": cell, "label": cell_label(*cell), "run_id": run_id, "runs": len({r["run_id"] for r in rows}),
            "figures": figures, "from_run": from_run, "lines": headline_lines({"headline": figures}),
            "rows": len(rows), "counts": dict(Counter(r["outcome"] for r in rows)),
            "dtypes": dtypes,
            "families": _families(rows, dtypes), "total": pass_rates(rows),
            "failures": _failure_groups(rows),
            "skips": sorted(Counter(r["reason_code"] for r in rows if r["outcome"] == "skipped").items(),
                            key=lambda kv: (-kv[1], kv[0])),
            "census": figures.get("census"), "fallbacks": list(step.get("fallback_overloads") or []),
            "claims": figures.get("profile_claims") or {},
            "support": support_list(rows),
        })
    return cells

