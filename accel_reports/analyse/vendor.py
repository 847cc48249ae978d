"""The vendor table: upstream test suites (``accel qualify --upstream``) by version, torch and backend.

An upstream run's results file carries ``extra["upstream"]`` in its header (see
:mod:`accel_harness.upstream`): the project and version of the suite, what it ran against (the project
itself, or accel through the import rewrite), the run's status (``completed``,
``collection-failed``, ``no-tests``, ``interrupted``) and what could not be installed. The loader
puts that block in the ``upstream`` column of the runs frame and makes the run's cell version the
*subject* (``accelerate 1.15.0 tests → accel 0.1.0``), so the two sides of a compatibility
measurement are two cells of the usual matrix and grid.

This module adds, from those frames:

* :func:`vendor_table`: one row per suite x subject x torch version x backend (each test counted
  once, from its latest run): status, passed /
  failed / errors / skipped, pass rate, modules that failed to import, root-cause clusters (known
  issues linked) and skip reasons by code: the table a vendor's qualification report shows;
* :func:`compatibility`: where one suite ran against its own project and against another
  (accel), how many of the tests that pass on the project also pass on the other, and why the
  rest do not, grouped by cause;
* :func:`vendor_lines`: the report's headline sentences for both.
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from accel.facts import reasons
from accel_harness.known_issues import KnownIssues

from .groups import failure_clusters, skip_groups
from ..load.headers import side as _side, subject_label, upstream_block  # re-exported: the vendor table's vocabulary

__all__ = ["VENDOR_COLUMNS", "COMPAT_COLUMNS", "compatibility", "subject_label", "upstream_block", "vendor_lines", "vendor_table"]

VENDOR_COLUMNS = [
    "suite", "subject", "against", "reference", "torch_version", "backend", "status", "runs", "tests", "passed", "failed",
    "error", "skipped", "xfailed", "xpassed", "pass_rate", "import_errors", "clusters", "skip_reasons", "not_installed",
    "headline",
]
COMPAT_COLUMNS = ["suite", "reference_subject", "subject", "torch_version", "backend", "reference_passed", "also_passed",
                  "share", "differences", "causes", "files"]

#: what a skip reason code says the skipped tests need, in a vendor's words
_NEEDS_SHORT = {
    reasons.NEEDS_DEVICES: "more devices", reasons.NEEDS_PACKAGE: "a library that is not installed",
    reasons.NOT_ON_BACKEND: "another accelerator", reasons.BACKEND_UNAVAILABLE: "an unavailable backend",
    reasons.UNSUPPORTED_DTYPE: "a dtype the backend lacks", reasons.TORCH_VERSION: "another torch version",
    reasons.OPT_IN: "to be asked for (slow tests)", reasons.KNOWN_LIMITATION: "an upstream fix (disabled upstream)",
    reasons.NEEDS_MULTIPROCESS: "several processes", reasons.BACKEND_NOT_SELECTED: "another selected backend",
    reasons.UNSPECIFIED: "something their message names (no reason code)",
}


def _runs_with_upstream(runs: pd.DataFrame) -> pd.DataFrame:
    if runs.empty or "upstream" not in runs.columns:
        return runs.iloc[0:0]
    return runs[runs["upstream"].map(lambda b: isinstance(b, dict))]


def _latest_per_test(frame: pd.DataFrame) -> pd.DataFrame:
    """One record per test id: the one from the latest run (by start time), so re-measuring one
    side and reporting it with an older run of the other counts each test once."""
    if frame.empty:
        return frame
    ordered = frame.assign(_order=frame["start_time"].fillna("")).sort_values("_order", kind="mergesort")
    return ordered.drop_duplicates("test_id", keep="last").drop(columns="_order")


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def vendor_table(tests: pd.DataFrame, runs: pd.DataFrame, known: KnownIssues | None = None, clusters: int = 5) -> pd.DataFrame:
    """One row per (suite, subject, torch version, backend) of the upstream runs (see module doc)."""
    upstream_runs = _runs_with_upstream(runs)
    if upstream_runs.empty:
        return pd.DataFrame(columns=VENDOR_COLUMNS)
    info = pd.DataFrame({
        "run_id": upstream_runs["run_id"].to_numpy(),
        "_block": upstream_runs["upstream"].to_numpy(),
        "_backend": upstream_runs["backends"].map(lambda s: str(s).split(",")[0].strip() or "unknown").to_numpy(),
        "_torch": upstream_runs["torch_version"].map(lambda v: "unknown" if v in (None, "") else str(v)).to_numpy(),
        "_start": upstream_runs["start_time"].to_numpy(),
    })
    info["_suite"] = info["_block"].map(lambda b: _side(b.get("project"), b.get("version")))
    info["_subject"] = info["_block"].map(subject_label)
    rows = []
    for (suite, subject, torch_version, backend), group in info.groupby(["_suite", "_subject", "_torch", "_backend"], sort=True):
        blocks = list(group["_block"])
        mine = _latest_per_test(tests[tests["run_id"].isin(set(group["run_id"]))]) if not tests.empty else tests
        counts = mine["outcome"].value_counts() if not mine.empty else pd.Series(dtype=int)
        count = {o: int(counts.get(o, 0)) for o in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")}
        executed = count["passed"] + count["failed"] + count["error"]
        rate = count["passed"] / executed if executed else None
        statuses = sorted({str(b.get("status") or "unknown") for b in blocks})
        status = statuses[0] if len(statuses) == 1 else ", ".join(statuses)
        import_errors = int(((mine["outcome"] == "error") & ~mine["nodeid"].astype(str).str.contains("::")).sum()) if not mine.empty else 0
        cl = failure_clusters(mine, known) if not mine.empty else pd.DataFrame()
        cluster_rows = [{"count": int(r["count"]), "kind": r["kind"], "key": r["key"], "url": r["url"], "title": r["title"],
                         "example": (r["examples"] or [None])[0]} for _, r in cl.head(clusters).iterrows()]
        sk = skip_groups(mine) if not mine.empty else pd.DataFrame()
        skip_rows = [{"code": r["reason_code"], "count": int(r["count"]), "needs": _NEEDS_SHORT.get(r["reason_code"], r["needs"]),
                      "message": r["messages"][0][0] if r["messages"] else ""} for _, r in sk.iterrows()]
        failed_install = sorted({f"{name} ({_short(reason, 200)})" if reason else str(name) for b in blocks
                                 for name, reason in ((b.get("install") or {}).get("failed") or {}).items()})
        block = blocks[-1]
        row = {
            "suite": suite, "subject": subject, "against": _side(block.get("against") or block.get("project"), block.get("against_version")),
            "reference": (block.get("against") or block.get("project")) == block.get("project"),
            "torch_version": torch_version, "backend": backend, "status": status, "runs": len(group), "tests": int(len(mine)),
            **count, "pass_rate": rate, "import_errors": import_errors, "clusters": cluster_rows, "skip_reasons": skip_rows,
            "not_installed": failed_install,
        }
        row["headline"] = _headline(row)
        rows.append(row)
    rows.sort(key=lambda r: (r["suite"], not r["reference"], r["subject"], r["torch_version"], r["backend"]))  # reference first
    return pd.DataFrame(rows, columns=VENDOR_COLUMNS)


def _short(text: Any, limit: int = 140) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _headline(row: Mapping[str, Any]) -> str:
    where = f"{row['suite']} against {row['against']} on PyTorch {row['torch_version']}, {row['backend']}"
    if row["status"] == "collection-failed":
        first = _short(row["clusters"][0]["key"]) if row["clusters"] else "no test could be collected"
        return f"{where}: the suite fails at collection ({row['import_errors']} module(s) cannot be imported; {first})."
    if row["status"] == "no-tests":
        return f"{where}: no tests were collected."
    text = (f"{where}: {row['failed']} failed, {row['passed']} passed, {row['skipped']} skipped"
            + (f", {row['error']} error{'' if row['error'] == 1 else 's'}" if row["error"] else "") + f" ({_pct(row['pass_rate'])}).")
    if row["import_errors"]:
        text += f" {row['import_errors']} test module(s) fail to import."
    failures = row["failed"] + row["error"]
    if row["clusters"] and failures:
        top = row["clusters"][0]
        what = (f"known issue {top['key']}" + (f" ({top['url']})" if top.get("url") else f" ({_short(top['title'], 100)})" if top.get("title") else "")) \
            if top["kind"] == "known issue" \
            else f"one cause: {_short(top['key'])}"
        text += f" {top['count']} of the {failures} failures are {what}." if top["count"] > 1 else ""
    if row["skip_reasons"]:
        needs = ", ".join(f"{s['needs']} ({s['count']})" for s in row["skip_reasons"][:3])
        text += f" Skipped tests need {needs}."
    if row["status"] == "interrupted":
        text += " The run was cut short."
    return text


def compatibility(tests: pd.DataFrame, vendor: pd.DataFrame, causes: int = 15) -> pd.DataFrame:
    """For each suite/torch/backend with a reference run (against its own project) and another
    subject: the tests passing on the reference, how many of them pass on the other subject, and
    the rest grouped by cause (the known issue, else the failure signature, or the import error
    of a module that did not load)."""
    if vendor.empty or tests.empty:
        return pd.DataFrame(columns=COMPAT_COLUMNS)
    rows = []
    for (suite, torch_version, backend), group in vendor.groupby(["suite", "torch_version", "backend"], sort=True):
        refs = group[group["reference"]]
        others = group[~group["reference"]]
        if refs.empty or others.empty:
            continue
        ref_subject = refs.iloc[0]["subject"]
        cell = tests[(tests["backend"] == backend) & (tests["torch_version"] == torch_version)]
        ref = _latest_per_test(cell[cell["accel_version"] == ref_subject])
        ref_passed = set(ref.loc[ref["outcome"] == "passed", "test_id"])
        for _, other in others.iterrows():
            theirs = _latest_per_test(cell[cell["accel_version"] == other["subject"]])
            latest = theirs.set_index("test_id")
            modules = latest[~latest.index.str.contains("::")]
            also = {t for t in ref_passed if t in latest.index and latest.at[t, "outcome"] == "passed"}
            grouped: dict[str, list[str]] = {}
            for test in sorted(ref_passed - also):
                if test in latest.index:
                    rec = latest.loc[test]
                    issue = rec["known_issue"] if isinstance(rec["known_issue"], str) and rec["known_issue"] else None
                    if issue:
                        key = f"{rec['outcome']}: known issue {issue}"
                    elif rec["outcome"] == "skipped":
                        key = f"skipped [{rec['reason_code']}]: {rec['message'] or ''}"
                    else:
                        key = f"{rec['outcome']}: {rec['signature'] or rec['message'] or '(no text)'}"
                else:
                    module = test.split("::")[0]
                    sig = modules.at[module, "signature"] if module in modules.index else None
                    key = f"module does not import: {sig}" if sig else "not collected"
                grouped.setdefault(key, []).append(test)
            files = _per_file(ref, theirs, ref_passed, also)
            cause_rows = sorted(({"cause": k, "count": len(v), "examples": v[:3]} for k, v in grouped.items()),
                                key=lambda r: (-r["count"], r["cause"]))
            rows.append({"suite": suite, "reference_subject": ref_subject, "subject": other["subject"], "torch_version": torch_version,
                         "backend": backend, "reference_passed": len(ref_passed), "also_passed": len(also),
                         "share": len(also) / len(ref_passed) if ref_passed else None,
                         "differences": len(ref_passed) - len(also), "causes": cause_rows[:causes], "files": files})
    return pd.DataFrame(rows, columns=COMPAT_COLUMNS)


def _file_of(test_id: str) -> str:
    return str(test_id).split("::")[0]


def _per_file(ref: pd.DataFrame, other: pd.DataFrame, ref_passed: set, also: set) -> list[dict[str, Any]]:
    """Side by side per test file: outcome counts on the reference and on the other subject, and
    how many of the reference's passing tests pass on both."""
    def counts(frame: pd.DataFrame) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        latest = frame.drop_duplicates("test_id", keep="last")
        for test_id, outcome in zip(latest["test_id"], latest["outcome"]):
            row = out.setdefault(_file_of(test_id), {"passed": 0, "failed": 0, "error": 0, "skipped": 0})
            key = outcome if outcome in row else ("failed" if outcome == "xpassed" else "skipped")
            row[key] += 1
        return out

    mine, theirs = counts(ref), counts(other)
    empty = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    rows = []
    for name in sorted(set(mine) | set(theirs)):
        rows.append({"file": name, "reference": mine.get(name, dict(empty)), "other": theirs.get(name, dict(empty)),
                     "reference_passed": sum(1 for t in ref_passed if _file_of(t) == name),
                     "both_passed": sum(1 for t in also if _file_of(t) == name)})
    return rows


def vendor_lines(vendor: pd.DataFrame, compat: pd.DataFrame) -> list[str]:
    """The headline sentences: one per vendor-table row, one per compatibility comparison."""
    lines = [str(h) for h in vendor["headline"]] if not vendor.empty else []
    for _, row in compat.iterrows():
        lines.append(f"{row['suite']} tests on {row['backend']}, torch {row['torch_version']}: {row['also_passed']} of the "
                     f"{row['reference_passed']} tests that pass against {row['reference_subject'].split(' → ')[-1]} also pass against "
                     f"{row['subject'].split(' → ')[-1]} ({_pct(row['share'])}).")
    return lines
