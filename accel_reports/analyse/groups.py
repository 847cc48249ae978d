"""Failures grouped by root cause and skips grouped by reason: the groupings the analyses and the
vendor table share (a module below both, so neither imports the other for them).

* :func:`failure_clusters`: failures by known issue when one matched, else by signature (the
  noise-stripped first error line, :func:`accel_harness.records.failure_signature`);
* :func:`skip_groups`: skips by reason code, with what the skipped tests need (:data:`SKIP_NEEDS`).

:mod:`accel_reports.analyse.analysis` re-exports all of them.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from accel.facts.reasons import SKIP_REASONS, UNSPECIFIED, describe_reason
from accel_harness.known_issues import KnownIssues

__all__ = ["CELL", "FAILING", "SKIP_NEEDS", "cell_label", "failure_clusters", "skip_groups"]

#: the columns that make a cell: one (backend, torch version, accel version) combination
CELL = ["backend", "torch_version", "accel_version"]
#: the outcomes that count as failures
FAILING = ("failed", "error")

#: what a skip reason code means the test needs (shown next to the skip groups): accel.facts.reasons' table
SKIP_NEEDS = {**SKIP_REASONS, UNSPECIFIED: describe_reason(UNSPECIFIED)}


def cell_label(backend: Any, torch_version: Any, accel_version: Any = None) -> str:
    """``xpu · torch 2.8.0 · accel 0.2.0``: a cell as the report names it."""
    label = f"{backend} · torch {torch_version}"
    if accel_version in (None, "", "unknown"):
        return label
    # an upstream suite's cell names its subject ("accelerate 1.15.0 tests → accel 0.1.0") itself
    return label + (f" · {accel_version}" if " " in str(accel_version) else f" · accel {accel_version}")


# ---------------------------------------------------------------------------- failures
def failure_clusters(tests: pd.DataFrame, known: KnownIssues | None = None, by: str = "root", examples: int = 3) -> pd.DataFrame:
    """Failures grouped, largest first.

    ``by="root"``: by known issue when one matched, else by signature; ``by="signature"``: by
    signature only (the known issues seen in each group are listed). Columns: kind, key,
    issue, url, title, count, share, tests, cells, backends, examples, signature, message.
    """
    columns = ["kind", "key", "issue", "url", "title", "count", "share", "tests", "cells", "backends",
               "examples", "signature", "message", "issues"]
    failing = tests[tests["outcome"].isin(FAILING)]
    if failing.empty:
        return pd.DataFrame(columns=columns)
    signature = failing["signature"].map(lambda s: str(s) if isinstance(s, str) and s else "(no error text)")
    if by == "root":
        issue = [str(i) if isinstance(i, (str, int)) and str(i) else None for i in failing["known_issue"]]
        key = pd.Series([i if i is not None else "sig:" + s for i, s in zip(issue, signature)], index=failing.index, dtype=object)
    elif by == "signature":
        key = "sig:" + signature
    else:
        raise ValueError(f"by must be 'root' or 'signature', got {by!r}")
    failing = failing.assign(_key=key, _signature=signature)
    total = len(failing)
    rows = []
    for group_key, group in failing.groupby("_key", sort=False):
        is_issue = not group_key.startswith("sig:")
        issue = known.get(group_key) if (known is not None and is_issue) else None
        test_counts = group["test_id"].value_counts()
        sig_counts = group["_signature"].value_counts()
        cells = sorted({cell_label(*c) for c in group[CELL].itertuples(index=False, name=None)})
        rows.append({
            "kind": "known issue" if is_issue else "signature",
            "key": group_key if is_issue else group_key[4:],
            "issue": group_key if is_issue else None,
            "url": issue.url if issue else None,
            "title": issue.title if issue else None,
            "count": len(group),
            "share": len(group) / total,
            "tests": len(test_counts),
            "cells": cells,
            "backends": sorted(group["backend"].unique().tolist()),
            "examples": test_counts.index[:examples].tolist(),
            "signature": sig_counts.index[0],
            "message": next((m for m in group["message"] if isinstance(m, str) and m), None),
            "issues": sorted(group["known_issue"].dropna().unique().tolist()),
        })
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(["count", "key"], ascending=[False, True], kind="mergesort").reset_index(drop=True)


# ---------------------------------------------------------------------------- skips
def skip_groups(tests: pd.DataFrame, messages: int = 3) -> pd.DataFrame:
    """Skips by reason code, largest first: count, tests, cells, what the tests need, top messages."""
    columns = ["reason_code", "needs", "count", "tests", "cells", "messages"]
    skipped = tests[tests["outcome"] == "skipped"]
    if skipped.empty:
        return pd.DataFrame(columns=columns)
    codes = skipped["reason_code"].fillna(UNSPECIFIED)
    rows = []
    for code, group in skipped.assign(_code=codes).groupby("_code", sort=False):
        top = group["message"].fillna("").value_counts().head(messages)
        rows.append({
            "reason_code": code,
            "needs": SKIP_NEEDS.get(code, ""),
            "count": len(group),
            "tests": group["test_id"].nunique(),
            "cells": group[CELL].drop_duplicates().shape[0],
            "messages": [(m, int(n)) for m, n in top.items()],
        })
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(["count", "reason_code"], ascending=[False, True], kind="mergesort").reset_index(drop=True)
