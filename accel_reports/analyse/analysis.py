"""Analyses of loaded results: pure functions from frames (see :mod:`accel_reports.load.loaders`) to frames.

A **cell** is one (backend, torch version, accel version) combination. Counts add up every record
of the runs in a cell (shards of one run add up; pass the runs you want reported, e.g. one nightly
per cell). Where one test has several records in a cell (repeated runs), the grid and the diff use
the latest (by run start time) and the grid marks the test as flaky when the records disagree.

* pass rate = passed / (passed + failed + error): skipped, xfailed and xpassed tests are not part
  of it (they did not run, or ran as expected-to-fail);
* a failure is an outcome ``failed`` or ``error``; it is **tracked** when it carries a known issue
  that the known-issues file in use defines (recorded by the harness, or matched by
  ``--known-issues`` at report time), **untracked** otherwise: an id written in a result file that
  no known-issues file in use defines does not count (see :func:`apply_known_issues`);
* failures are clustered by root cause: the known issue when there is one, else the signature
  (the noise-stripped first error line, :func:`accel_harness.records.failure_signature`);
* the diff against a baseline matches each current cell with the baseline cell of the same
  backend and torch version (any accel version), else the same backend's newest torch version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

import pandas as pd
from packaging.version import InvalidVersion, Version

from accel_harness.known_issues import KnownIssues

from . import benchmarks as bench
from .groups import CELL, FAILING, SKIP_NEEDS, cell_label, failure_clusters, skip_groups
from ..load.loaders import Loaded, Problem
from ..load.ops_records import parse_operator_id

__all__ = [
    "CELL",
    "FAILING",
    "SKIP_NEEDS",
    "Diff",
    "Report",
    "apply_known_issues",
    "build_report",
    "cell_label",
    "cell_positions",
    "diff_runs",
    "failure_clusters",
    "headline",
    "known_issues_passing",
    "skip_groups",
    "summary_matrix",
    "per_test_grid",
    "undefined_known_issues",
]

OUTCOME_ORDER = ["passed", "failed", "error", "skipped", "xfailed", "xpassed"]


# ---------------------------------------------------------------------------- helpers
def _version_key(text: Any) -> tuple:
    try:
        return (0, Version(str(text)))
    except InvalidVersion:
        return (1, str(text))


def _sorted_cells(frame: pd.DataFrame, columns: list[str] = CELL) -> list[tuple]:
    cells = frame[columns].drop_duplicates().itertuples(index=False, name=None)
    return sorted(cells, key=lambda c: (str(c[0]), *(_version_key(v) for v in c[1:])))


def _latest(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One record per ``keys``: the one from the latest run (by start time, then file order)."""
    ordered = frame.assign(_order=frame["start_time"].fillna("")).sort_values("_order", kind="mergesort")
    return ordered.drop_duplicates(keys, keep="last").drop(columns="_order")


# ---------------------------------------------------------------------------- known issues
def _torch_or_none(text: Any) -> str | None:
    """A torch version the known-issue filters can compare, or None (matches any range)."""
    try:
        Version(str(text))
    except InvalidVersion:
        return None
    return str(text)


def undefined_known_issues(tests: pd.DataFrame, known: KnownIssues | None,
                           problems: list[Problem] | None = None) -> pd.DataFrame:
    """``tests`` with every known-issue id that ``known`` does not define cleared.

    A result file can carry any id in ``known_issue`` (or ``tracked_pass``); only the known-issues
    file in use says which are real, so an id it does not define (or any id, with no file) does not
    make a failure tracked. With ``problems``, one ``"note"`` per file and id is added:
    ``undefined known issue 'X': recorded for N failures ...``.
    """
    if tests.empty:
        return tests
    defined = set(known.ids) if known is not None else set()
    claimed = tests["known_issue"]
    undefined = claimed.notna() & ~claimed.isin(defined)
    passes = tests["tracked_pass"]
    passes_undefined = passes.map(lambda ids: bool(ids) and any(i not in defined for i in ids))
    if not undefined.any() and not passes_undefined.any():
        return tests
    tests = tests.copy()
    if problems is not None and undefined.any():
        failing = tests["outcome"].isin(FAILING)
        why = ("the known-issues file in use does not define it" if known is not None
               else "no known-issues file is in use (--known-issues)")
        for (source, issue), group in tests[undefined].groupby(["source", "known_issue"], sort=True):
            fails = int(failing[group.index].sum())
            problems.append(Problem(str(source), 0, f"undefined known issue {issue!r}: recorded for {fails} failure"
                                                    f"{'' if fails == 1 else 's'} ({len(group)} record{'' if len(group) == 1 else 's'}), "
                                                    f"but {why}; those failures count as untracked", "note"))
    tests.loc[undefined, "known_issue"] = None
    if passes_undefined.any():
        kept = [tuple(i for i in ids if i in defined) or None if flag else ids for ids, flag in zip(passes, passes_undefined)]
        tests["tracked_pass"] = pd.Series(kept, index=tests.index, dtype=object)
    return tests


def apply_known_issues(tests: pd.DataFrame, known: KnownIssues | None, problems: list[Problem] | None = None) -> pd.DataFrame:
    """``tests`` with failures matched to ``known`` issues (where the harness did not already; an
    operator sweep's row by the entries' ``ops`` patterns too) and passing tests' ``tracked_pass``
    filled with the issues whose test patterns name them.

    Ids in the results that ``known`` does not define are cleared first (see
    :func:`undefined_known_issues`, which adds a note per file and id to ``problems``); with no
    known-issues file no failure is tracked."""
    tests = undefined_known_issues(tests, known, problems)
    if known is None or not len(known) or tests.empty:
        return tests
    tests = tests.copy()
    failing = tests[tests["outcome"].isin(FAILING) & tests["known_issue"].isna()]
    has_ops = any(issue.ops for issue in known)
    columns = ["test_id", "nodeid", "backend", "torch_version", "message", "traceback"]
    for idx, (test_id, nodeid, backend, torch_version, message, traceback) in zip(
            failing.index, failing[columns].itertuples(index=False, name=None)):
        text = "\n".join(t for t in (message, traceback) if isinstance(t, str))
        issue = known.match_failure(test_id, nodeid, backend, _torch_or_none(torch_version), text)
        operator = parse_operator_id(test_id) if issue is None and has_ops else None
        if operator is not None:  # an operator sweep's row: the entries' ``ops`` patterns cover it
            issue = known.match_op(operator["op"], operator["dtype"], backend, _torch_or_none(torch_version), text)
        if issue is not None:
            tests.at[idx, "known_issue"] = issue.id
    passing = tests[tests["outcome"] == "passed"]
    if passing.empty or not any(i.tests for i in known):
        return tests
    # match patterns once per distinct test, and only tests that start with a pattern's literal
    # prefix (the text before its first wildcard) can match it
    pairs = passing[["test_id", "nodeid"]].drop_duplicates()
    by_test: dict[tuple[str, str], tuple[str, ...]] = {}
    for issue in known:
        if not issue.tests:
            continue
        prefixes = tuple(re.split(r"[*?]", pattern, maxsplit=1)[0] for pattern in issue.tests)
        candidates = pairs[pairs["test_id"].map(lambda t: t.startswith(prefixes)) | pairs["nodeid"].map(lambda n: n.startswith(prefixes))]
        for test_id, nodeid in candidates.itertuples(index=False, name=None):
            if issue.matches_test(test_id, nodeid):
                by_test[(test_id, nodeid)] = by_test.get((test_id, nodeid), ()) + (issue.id,)
    if not by_test:
        return tests
    applies = {}
    for backend, torch_version in passing[["backend", "torch_version"]].drop_duplicates().itertuples(index=False, name=None):
        applies[(backend, torch_version)] = {i.id for i in known if i.applies_to(backend, _torch_or_none(torch_version))}
    tracked = tests["tracked_pass"].tolist()
    for idx, row in zip(passing.index, passing[["test_id", "nodeid", "backend", "torch_version"]].itertuples(index=False, name=None)):
        ids = by_test.get((row[0], row[1]))
        if not ids:
            continue
        ok = applies[(row[2], row[3])]
        found = tuple(i for i in ids if i in ok)
        if found:
            position = tests.index.get_loc(idx)
            tracked[position] = tuple(dict.fromkeys((tracked[position] or ()) + found))
    tests["tracked_pass"] = tracked
    return tests


# ---------------------------------------------------------------------------- summary matrix
def summary_matrix(tests: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: runs, tests, one column per outcome, pass rate, tracked/untracked failures."""
    columns = CELL + ["runs", "tests"] + OUTCOME_ORDER + ["pass_rate", "tracked", "untracked"]
    if tests.empty:
        return pd.DataFrame(columns=columns)
    counts = pd.crosstab([tests[c] for c in CELL], tests["outcome"])
    for outcome in OUTCOME_ORDER:
        if outcome not in counts.columns:
            counts[outcome] = 0
    counts = counts[OUTCOME_ORDER]
    grouped = tests.groupby(CELL)
    counts["runs"] = grouped["run_id"].nunique()
    counts["tests"] = grouped.size()
    failing = tests[tests["outcome"].isin(FAILING)]
    tracked = failing[failing["known_issue"].notna()].groupby(CELL).size()
    counts["tracked"] = tracked.reindex(counts.index, fill_value=0)
    counts["untracked"] = counts["failed"] + counts["error"] - counts["tracked"]
    executed = counts["passed"] + counts["failed"] + counts["error"]
    counts["pass_rate"] = (counts["passed"] / executed.where(executed > 0)).astype(float)
    frame = counts.reset_index()
    order = sorted(range(len(frame)), key=lambda i: (str(frame.at[i, "backend"]), _version_key(frame.at[i, "torch_version"]), _version_key(frame.at[i, "accel_version"])))
    return frame.iloc[order].reset_index(drop=True)[columns]


# ---------------------------------------------------------------------------- per-test grid
def cell_positions(frame: pd.DataFrame, cells: list[tuple]) -> pd.Series:
    """For each row of ``frame``, the index of its cell in ``cells``."""
    table = pd.DataFrame({c: pd.Series([cell[i] for cell in cells], dtype=object) for i, c in enumerate(CELL)})
    table["_c"] = range(len(cells))
    merged = frame[CELL].merge(table, on=CELL, how="left")
    return pd.Series(merged["_c"].to_numpy(), index=frame.index)


def per_test_grid(tests: pd.DataFrame) -> tuple[list[tuple], pd.DataFrame]:
    """``(cells, grid)``: the sorted cells and one row per device-neutral test id with one column
    per cell position (the outcome there, NaN where the test did not run) and a ``flaky`` column
    listing the cell positions where the test's records disagree (None when they never do)."""
    if tests.empty:
        return [], pd.DataFrame(columns=["flaky"])
    cells = _sorted_cells(tests)
    keyed = tests[["test_id", "outcome", "start_time"]].assign(_c=cell_positions(tests, cells))
    latest = _latest(keyed, ["test_id", "_c"])
    grid = latest.pivot(index="test_id", columns="_c", values="outcome").reindex(columns=range(len(cells)))
    distinct = keyed.drop_duplicates(["test_id", "_c", "outcome"])
    disagreeing = distinct[distinct.duplicated(["test_id", "_c"])].drop_duplicates(["test_id", "_c"])
    flaky: dict[str, list[int]] = {}
    for test_id, position in zip(disagreeing["test_id"], disagreeing["_c"]):
        flaky.setdefault(test_id, []).append(int(position))
    grid["flaky"] = [sorted(flaky[t]) if t in flaky else None for t in grid.index]
    return cells, grid.sort_index()


def headline(clusters: pd.DataFrame) -> str | None:
    """``"16 of the 19 failures are one known issue: pytorch-135550 (url)"``, or None without failures."""
    if clusters.empty:
        return None
    total = int(clusters["count"].sum())
    top = clusters.iloc[0]
    noun = "failure" if total == 1 else "failures"
    if top["kind"] == "known issue":
        what = f"known issue {top['key']}" + (f" ({top['title']})" if top.get("title") else "")
    else:
        what = f"one signature: {top['key']}"
    if int(top["count"]) == total:
        return f"All {total} {noun} are {what}" if total > 1 else f"The only failure is {what}"
    count = int(top["count"])
    return f"{count} of the {total} {noun} {'is' if count == 1 else 'are'} {what}"


# ---------------------------------------------------------------------------- baseline diff
@dataclass
class Diff:
    """Current results against a baseline; every frame has the cell columns and ``test_id``."""

    new_failures: pd.DataFrame
    fixed: pd.DataFrame
    still_failing: pd.DataFrame
    disappeared: pd.DataFrame
    new_tests: pd.DataFrame
    collection: pd.DataFrame
    unmatched_cells: list[str] = field(default_factory=list)

    @property
    def new_untracked(self) -> pd.DataFrame:
        return self.new_failures[self.new_failures["known_issue"].isna()]

    @property
    def collection_drops(self) -> pd.DataFrame:
        return self.collection[self.collection["dropped"]]


def _cell_map(current: Iterable[tuple], baseline: pd.DataFrame) -> dict[tuple, tuple | None]:
    pairs = set(baseline[["backend", "torch_version"]].drop_duplicates().itertuples(index=False, name=None))
    newest: dict[str, tuple] = {}
    for backend, torch_version in pairs:
        if backend not in newest or _version_key(torch_version) > _version_key(newest[backend][1]):
            newest[backend] = (backend, torch_version)
    mapping = {}
    for cell in current:
        pair = (cell[0], cell[1])
        mapping[cell] = pair if pair in pairs else newest.get(cell[0])
    return mapping


def diff_runs(current: pd.DataFrame, baseline: pd.DataFrame, collection_threshold: float | None = None) -> Diff:
    """Compare ``current`` test records with ``baseline`` ones (see the module docstring).

    New failures: failing now, not failing in the baseline (passing, skipped, or absent there, or
    the baseline has no such cell at all; ``was`` says which). Fixed: failing in the baseline, passing now. Disappeared: in the baseline
    cell, absent now. Collection: tests per cell now and in the baseline, ``drop_share`` (the share
    of the baseline's tests missing now) and ``dropped`` when that share exceeds
    ``collection_threshold`` (default :data:`accel_reports.analyse.evidence.DEFAULT_COLLECTION_DROP`, 5 %;
    0 makes any drop count).
    """
    from .evidence import DEFAULT_COLLECTION_DROP

    threshold = DEFAULT_COLLECTION_DROP if collection_threshold is None else float(collection_threshold)
    keep = CELL + ["test_id", "outcome", "known_issue", "signature", "message", "nodeid"]
    cur = _latest(current, CELL + ["test_id"])
    base = _latest(baseline, ["backend", "torch_version", "test_id"])
    cells = _sorted_cells(cur) if not cur.empty else []
    mapping = _cell_map(cells, base) if not base.empty else {c: None for c in cells}
    cur = cur.assign(_bb=[mapping.get(c) for c in cur[CELL].itertuples(index=False, name=None)])
    matched = cur[cur["_bb"].notna()]
    base_keyed = base.assign(_bb=list(zip(base["backend"], base["torch_version"])))
    joined = matched[keep + ["_bb"]].merge(
        base_keyed[["_bb", "test_id", "outcome", "known_issue", "signature"]].rename(
            columns={"outcome": "was", "known_issue": "was_issue", "signature": "was_signature"}),
        on=["_bb", "test_id"], how="left",
    )
    joined["baseline_cell"] = [f"{b[0]} · torch {b[1]}" for b in joined["_bb"]]
    now_failing = joined["outcome"].isin(FAILING)
    was_failing = joined["was"].isin(FAILING)
    out_cols = CELL + ["test_id", "was", "outcome", "known_issue", "was_issue", "signature", "was_signature", "message", "baseline_cell"]
    new_failures = joined[now_failing & ~was_failing].copy()
    new_failures["was"] = new_failures["was"].fillna("absent")
    # a cell the baseline does not have: each of its failures is new against the baseline
    orphans = cur[cur["_bb"].isna() & cur["outcome"].isin(FAILING)][keep].copy()
    if not orphans.empty:
        orphans = orphans.assign(was="no baseline cell", was_issue=None, was_signature=None, baseline_cell=None)
        new_failures = pd.concat([new_failures[out_cols], orphans[out_cols]], ignore_index=True)
    fixed = joined[was_failing & joined["outcome"].isin(("passed", "xpassed"))]
    still = joined[now_failing & was_failing]
    new_tests = joined[joined["was"].isna()]
    # disappeared: in a baseline cell that a current cell maps to, but not in that current cell
    disappeared_rows = []
    collection_rows = []
    base_groups = {k: set(g["test_id"]) for k, g in base_keyed.groupby("_bb")} if not base.empty else {}
    for cell in cells:
        now_ids = set(cur.loc[(cur["backend"] == cell[0]) & (cur["torch_version"] == cell[1]) & (cur["accel_version"] == cell[2]), "test_id"])
        target = mapping.get(cell)
        before = base_groups.get(target, set()) if target else set()
        if target:
            for test_id in sorted(before - now_ids):
                disappeared_rows.append({"backend": cell[0], "torch_version": cell[1], "accel_version": cell[2],
                                         "test_id": test_id, "baseline_cell": f"{target[0]} · torch {target[1]}"})
        share = (len(before) - len(now_ids)) / len(before) if target and before else 0.0
        collection_rows.append({
            "backend": cell[0], "torch_version": cell[1], "accel_version": cell[2],
            "baseline_cell": f"{target[0]} · torch {target[1]}" if target else None,
            "baseline": len(before) if target else None, "current": len(now_ids),
            "delta": len(now_ids) - len(before) if target else None,
            "drop_share": max(share, 0.0) if target else None,
            "dropped": bool(target and len(now_ids) < len(before) and share > threshold),
        })
    unmatched = [cell_label(*c) for c in cells if mapping.get(c) is None]
    return Diff(
        new_failures=new_failures[out_cols].reset_index(drop=True),
        fixed=fixed[out_cols].reset_index(drop=True),
        still_failing=still[out_cols].reset_index(drop=True),
        disappeared=pd.DataFrame(disappeared_rows, columns=CELL + ["test_id", "baseline_cell"]),
        new_tests=new_tests[out_cols].reset_index(drop=True),
        collection=pd.DataFrame(collection_rows, columns=CELL + ["baseline_cell", "baseline", "current", "delta", "drop_share",
                                                                 "dropped"]),
        unmatched_cells=unmatched,
    )


def known_issues_passing(tests: pd.DataFrame, known: KnownIssues | None = None, diff: Diff | None = None) -> pd.DataFrame:
    """Known issues with tests that pass now: from ``tracked_pass`` (the issue's test patterns name a
    passing test) and from the diff (a test that failed with the issue in the baseline passes now).
    ``still_failing`` counts current failures carrying the issue; with none, consider closing it."""
    columns = ["issue", "url", "title", "passing", "examples", "still_failing", "consider_closing"]
    passing: dict[str, set[str]] = {}
    rows_with = tests[tests["tracked_pass"].notna()] if not tests.empty else tests
    for test_id, ids in zip(rows_with.get("test_id", []), rows_with.get("tracked_pass", [])):
        for issue_id in ids or ():
            passing.setdefault(issue_id, set()).add(test_id)
    if diff is not None and not diff.fixed.empty:
        for test_id, issue_id in zip(diff.fixed["test_id"], diff.fixed["was_issue"]):
            if isinstance(issue_id, str):
                passing.setdefault(issue_id, set()).add(test_id)
    if not passing:
        return pd.DataFrame(columns=columns)
    failing_counts = tests[tests["outcome"].isin(FAILING)]["known_issue"].value_counts() if not tests.empty else {}
    rows = []
    for issue_id, test_ids in passing.items():
        issue = known.get(issue_id) if known is not None else None
        still = int(failing_counts.get(issue_id, 0))
        rows.append({"issue": issue_id, "url": issue.url if issue else None, "title": issue.title if issue else None,
                     "passing": len(test_ids), "examples": sorted(test_ids)[:3], "still_failing": still,
                     "consider_closing": still == 0})
    return pd.DataFrame(rows, columns=columns).sort_values(["passing", "issue"], ascending=[False, True]).reset_index(drop=True)


# ---------------------------------------------------------------------------- the whole report
@dataclass
class Report:
    """Everything the renderers show, plus the CI gate's figures."""

    title: str
    generated: str
    loaded: Loaded
    tests: pd.DataFrame
    matrix: pd.DataFrame
    cells: list[tuple]
    grid: pd.DataFrame
    clusters: pd.DataFrame
    signature_clusters: pd.DataFrame
    headline: str | None
    skips: pd.DataFrame
    known_passing: pd.DataFrame
    diff: Diff | None
    bench_table: pd.DataFrame
    bench_summary: pd.DataFrame
    problems: list[Problem]
    known: KnownIssues | None = None
    baseline_files: list[str] = field(default_factory=list)
    threshold: float = bench.DEFAULT_THRESHOLD
    #: upstream suites (accel_reports.analyse.vendor): the vendor table and the compatibility comparisons
    vendor: pd.DataFrame = field(default_factory=pd.DataFrame)
    compat: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: from a run history (accel_reports.history.store), else empty: every stored benchmark run (trend lines),
    #: per-test flakiness across runs, and where each current failure's streak began
    history_benchmarks: pd.DataFrame = field(default_factory=pd.DataFrame)
    flakiness: pd.DataFrame = field(default_factory=pd.DataFrame)
    first_failed: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: model suite records that regressed against their latest earlier stored record (a model that learned last
    #: time and does not now; accel_reports.history.model_trends), with the curves; a regression for the gate
    model_regressions: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: failures that are flaky, not broken (accel_reports.analyse.evidence.flaky_failures): never new failures
    flaky: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: known issues past their expiry date and the untracked failures they used to cover
    expired: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: what the fingerprints say about comparing with the baseline (accel_reports.analyse.evidence.comparison_notes)
    comparison: list = field(default_factory=list)
    #: the share of the baseline's tests that may go missing before the collection gate fails
    collection_threshold: float | None = None

    @property
    def failures(self) -> int:
        return int(self.tests["outcome"].isin(FAILING).sum()) if not self.tests.empty else 0

    @property
    def untracked_failures(self) -> pd.DataFrame:
        """The failures a CI gate fails on: new untracked ones against the baseline when there is
        one, else every untracked failure."""
        if self.diff is not None:
            return self._not_flaky(self.diff.new_untracked)
        failing = self.tests[self.tests["outcome"].isin(FAILING)] if not self.tests.empty else self.tests
        return self._not_flaky(failing[failing["known_issue"].isna()]) if not failing.empty else failing

    def _not_flaky(self, failures: pd.DataFrame) -> pd.DataFrame:
        """``failures`` without those of flaky tests (shown as flaky, never as new failures)."""
        if self.flaky.empty or failures.empty:
            return failures
        flaky = set(self.flaky[CELL + ["test_id"]].itertuples(index=False, name=None))
        keep = [key not in flaky for key in failures[CELL + ["test_id"]].itertuples(index=False, name=None)]
        return failures[keep]

    @property
    def regressions(self) -> pd.DataFrame:
        table = self.bench_table
        return table[table["status"] == "regression"] if not table.empty else table


def build_report(
    loaded: Loaded,
    baseline: Loaded | None = None,
    known: KnownIssues | None = None,
    *,
    title: str = "accel qualification report",
    threshold: float = bench.DEFAULT_THRESHOLD,
    alpha: float = bench.DEFAULT_ALPHA,
    min_samples: int = bench.DEFAULT_MIN_SAMPLES,
    history: Any = None,
    collection_threshold: float | None = None,
) -> Report:
    """Run every analysis on ``loaded`` (and ``baseline``) and collect the results.

    ``history`` (an :class:`accel_reports.history.store.History`) judges benchmarks against the noise band
    of their own stored runs, sets model suite runs against their last stored run, and adds trends, flakiness
    and first failures to the report.
    ``collection_threshold``: see :func:`diff_runs`."""
    from .evidence import comparison_notes, expired_issues, flaky_failures

    issue_notes: list[Problem] = []  # undefined known-issue ids
    tests = apply_known_issues(loaded.tests, known, issue_notes)
    # a baseline without test records (a wrong path, benchmarks only) cannot make failures "old"
    base_tests = apply_known_issues(baseline.tests, known, issue_notes) if baseline is not None and not baseline.tests.empty else None
    cells, grid = per_test_grid(tests)
    diff = diff_runs(tests, base_tests, collection_threshold) if base_tests is not None else None
    clusters = failure_clusters(tests, known, by="root")
    history_benchmarks = history.benchmarks_frame() if history is not None else pd.DataFrame()
    table = bench.compare_benchmarks(
        loaded.benchmarks, baseline.benchmarks if baseline is not None else None,
        history=history_benchmarks if history is not None else None,
        threshold=threshold, alpha=alpha, min_samples=min_samples,
    )
    problems = list(loaded.problems) + (list(baseline.problems) if baseline is not None else []) + issue_notes
    from .vendor import compatibility, vendor_table

    vendor = vendor_table(tests, loaded.runs, known)
    flakiness = history.flakiness() if history is not None else pd.DataFrame()
    return Report(
        title=title,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        loaded=loaded,
        tests=tests,
        matrix=summary_matrix(tests),
        cells=cells,
        grid=grid,
        clusters=clusters,
        signature_clusters=failure_clusters(tests, known, by="signature"),
        headline=headline(clusters),
        skips=skip_groups(tests),
        known_passing=known_issues_passing(tests, known, diff),
        diff=diff,
        bench_table=table,
        bench_summary=bench.summarise_benchmarks(table),
        problems=problems,
        known=known,
        baseline_files=list(baseline.files) if baseline is not None else [],
        threshold=threshold,
        vendor=vendor,
        compat=compatibility(tests, vendor),
        history_benchmarks=history_benchmarks,
        flakiness=flakiness,
        first_failed=history.first_failed() if history is not None else pd.DataFrame(),
        model_regressions=history.model_regressions(tests) if history is not None else pd.DataFrame(),
        flaky=flaky_failures(tests, flakiness),
        expired=expired_issues(loaded.runs, tests, known),
        comparison=comparison_notes(loaded.runs, baseline.runs) if baseline is not None else [],
        collection_threshold=collection_threshold,
    )
