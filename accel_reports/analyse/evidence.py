"""What a qualification run proves beyond pass and fail: flaky failures, expired known issues, the
device profile's applicable coverage and whether two runs can fairly be compared.

* **Flaky failures**: a failure whose ``--flake-runs`` re-runs passed at least once (its record's
  ``flake_rate`` is below 1), or a test the run history calls flaky in that cell. Such a failure is
  shown as "flaky (rate)" and is neither a new failure nor a gate failure: a re-run that passes is
  the evidence that the code is not broken, only unreliable.
* **Expired known issues**: entries whose ``expires`` date has passed cover nothing; the failures
  they used to cover count as untracked. Each is listed with the failures it would have covered.
* **Applicable coverage**: per capability area the profile claims, the tests that ran out of the
  tests applicable to the claim (the results file's ``profile_coverage``).
* **Comparability**: two runs compare fairly when they ran the same device profile (same file
  hash) on the same test selection (same hash of the selected test ids); :func:`comparison_notes`
  names what differs. Versions (torch, accel, plug-ins) are what a comparison is *for*, so they
  are listed, never called unfair.
"""

from __future__ import annotations

import datetime
from typing import Any, Iterable

import pandas as pd

from accel_harness.known_issues import KnownIssues

from .groups import CELL, FAILING

__all__ = ["DEFAULT_COLLECTION_DROP", "comparison_notes", "coverage_rows", "expired_issues", "fingerprint_rows",
           "flaky_failures", "is_flaky_rate"]

#: a drop in collected tests against the baseline larger than this share fails the collection gate
DEFAULT_COLLECTION_DROP = 0.05


def is_flaky_rate(rate: Any) -> bool:
    """Whether a recorded flake rate says "failed some re-runs, passed others" (0 < rate < 1)."""
    return isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate < 1


def _latest(tests: pd.DataFrame) -> pd.DataFrame:
    ordered = tests.assign(_t=tests["start_time"].fillna("").astype(str)).sort_values("_t", kind="mergesort")
    return ordered.drop_duplicates(CELL + ["test_id"], keep="last").drop(columns="_t")


def flaky_failures(tests: pd.DataFrame, flakiness: pd.DataFrame | None = None) -> pd.DataFrame:
    """The failures (latest record of a test in a cell) that are flaky rather than broken: the cell
    columns, ``test_id``, ``flake_rate`` (this run's re-runs, else the history's measured rate, else
    None), ``runs`` (how many runs the rate comes from), ``evidence`` (``re-runs`` or ``history``)."""
    columns = CELL + ["test_id", "flake_rate", "runs", "evidence"]
    if tests.empty:
        return pd.DataFrame(columns=columns)
    latest = _latest(tests)
    failing = latest[latest["outcome"].isin(FAILING)]
    if failing.empty:
        return pd.DataFrame(columns=columns)
    history: dict[tuple, tuple[Any, int]] = {}
    if flakiness is not None and not flakiness.empty:
        for row in flakiness[flakiness["flaky"]].to_dict("records"):
            rate = row.get("flake_rate")
            if not is_flaky_rate(rate):  # flaky by its flips: the share of failing runs is its rate
                decided = int(row["passes"]) + int(row["failures"])
                rate = round(int(row["failures"]) / decided, 4) if decided else None
            history[tuple(row[c] for c in CELL) + (row["test_id"],)] = (rate, int(row["runs"]))
    out = []
    for row in failing[CELL + ["test_id", "flake_rate"]].to_dict("records"):
        key = tuple(row[c] for c in CELL) + (row["test_id"],)
        if is_flaky_rate(row["flake_rate"]):
            out.append({**{c: row[c] for c in CELL}, "test_id": row["test_id"], "flake_rate": float(row["flake_rate"]),
                        "runs": 1, "evidence": "re-runs"})
        elif key in history:
            rate, runs = history[key]
            out.append({**{c: row[c] for c in CELL}, "test_id": row["test_id"], "flake_rate": rate, "runs": runs,
                        "evidence": "history"})
    frame = pd.DataFrame(out, columns=columns)
    frame["flake_rate"] = pd.Series([r["flake_rate"] for r in out], dtype=object)
    return frame


def _torch(text: Any) -> str | None:
    return None if text in (None, "unknown") else str(text)


def expired_issues(runs: pd.DataFrame, tests: pd.DataFrame, known: KnownIssues | None,
                   today: datetime.date | None = None) -> pd.DataFrame:
    """Known issues past their ``expires`` date, from the run headers and the known-issues files in
    use: ``id``, ``expires``, ``issue`` (a link), ``failures`` (untracked failures it used to cover:
    recorded by the harness, or matched now) and ``examples`` (up to three of their test ids)."""
    columns = ["id", "expires", "issue", "failures", "examples"]
    entries: dict[str, dict[str, Any]] = {}
    for listed in (runs["expired_known_issues"] if not runs.empty and "expired_known_issues" in runs else ()):
        for entry in listed or ():
            if isinstance(entry, dict) and entry.get("id"):
                entries.setdefault(str(entry["id"]), {"expires": entry.get("expires"), "issue": entry.get("issue")})
    expired_known = known.expired(today) if known is not None else []
    for issue in expired_known:
        entries.setdefault(issue.id, {"expires": issue.expires.isoformat(), "issue": issue.issue or issue.url})
    if not entries:
        return pd.DataFrame(columns=columns)
    covered: dict[str, set[str]] = {}
    if not tests.empty:
        failing = tests[tests["outcome"].isin(FAILING) & tests["known_issue"].isna()]
        for test_id, issue_id in zip(failing["test_id"], failing["expired_issue"]):
            if isinstance(issue_id, str) and issue_id in entries:
                covered.setdefault(issue_id, set()).add(test_id)
        if expired_known:
            only = KnownIssues(expired_known)
            rest = failing[failing["expired_issue"].isna()]
            for test_id, nodeid, backend, torch_version, message, traceback in rest[
                    ["test_id", "nodeid", "backend", "torch_version", "message", "traceback"]].itertuples(index=False, name=None):
                text = "\n".join(t for t in (message, traceback) if isinstance(t, str))
                issue = only.match_failure(test_id, nodeid, backend, _torch(torch_version), text, include_expired=True)
                if issue is not None:
                    covered.setdefault(issue.id, set()).add(test_id)
    rows = [{"id": issue_id, "expires": data["expires"], "issue": data["issue"], "failures": len(covered.get(issue_id, ())),
             "examples": sorted(covered.get(issue_id, ()))[:3]} for issue_id, data in sorted(entries.items())]
    return pd.DataFrame(rows, columns=columns)


def coverage_rows(runs: pd.DataFrame) -> list[dict[str, Any]]:
    """Per run that used a device profile: the profile, its claims, what the backend's probes
    disagreed with, and per claimed area the applicable tests, how many ran, passed, failed, were
    skipped and contradicted a claim, with the share that ran (``coverage``)."""
    out = []
    if runs.empty or "profile" not in runs:
        return out
    for run in runs.to_dict("records"):
        profile = run.get("profile")
        if not isinstance(profile, dict):
            continue
        coverage = run.get("profile_coverage") if isinstance(run.get("profile_coverage"), dict) else {}
        areas = []
        for area, data in sorted((coverage.get("areas") or {}).items()):
            if not isinstance(data, dict):
                continue
            applicable, ran = _count(data.get("applicable")), _count(data.get("ran"))
            contradicted = data.get("contradicted") if isinstance(data.get("contradicted"), list) else []
            areas.append({"area": str(area), "applicable": applicable, "ran": ran, "passed": _count(data.get("passed")),
                          "failed": _count(data.get("failed")), "skipped": _count(data.get("skipped")),
                          "contradicted": [str(c) for c in contradicted],
                          "coverage": ran / applicable if applicable else None})
        declared = profile.get("declared") if isinstance(profile.get("declared"), dict) else {}
        not_claimed = coverage.get("not_claimed") if isinstance(coverage.get("not_claimed"), dict) else {}
        out.append({"run_id": run["run_id"], "name": profile.get("name"), "version": profile.get("version"),
                    "format": profile.get("format"), "sha256": profile.get("sha256"),
                    "claims": [f"{k}: {v}" if not isinstance(v, bool) else k for k, v in declared.items()
                               if v is not None and v is not False],
                    "disagreements": [f"{k}: {v}" for k, v in (profile.get("disagreements") or {}).items()],
                    "areas": areas, "not_claimed": {str(k): _count(v) for k, v in not_claimed.items()},
                    "recorded": bool(coverage)})
    return out


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _short(digest: Any) -> str:
    return str(digest)[:12] if isinstance(digest, str) and digest else "–"


def fingerprint_rows(runs: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per run that recorded a fingerprint: torch, accel, plug-ins, profile, the hash over
    them, and the selected tests' count and hash."""
    out = []
    if runs.empty or "fingerprint" not in runs:
        return out
    for run in runs.to_dict("records"):
        print_ = run.get("fingerprint")
        if not isinstance(print_, dict):
            continue
        selection = run.get("selection") if isinstance(run.get("selection"), dict) else {}
        profile = print_.get("profile") if isinstance(print_.get("profile"), dict) else None
        plugins = print_.get("plugins") if isinstance(print_.get("plugins"), dict) else {}
        out.append({
            "run_id": run["run_id"], "backends": run.get("backends") or "",
            "torch": print_.get("torch") or "–", "accel": print_.get("accel") or "–",
            "plugins": ", ".join(f"{k} {v}" for k, v in sorted(plugins.items())) or "none",
            "profile": (f"{profile.get('name')} {profile.get('version') or ''}".strip() + f" ({_short(profile.get('sha256'))})")
            if profile else "none",
            "environment_hash": _short(print_.get("sha256")),
            "tests": selection.get("count"), "selection_hash": _short(selection.get("sha256")),
        })
    return out


def _profiles(runs: pd.DataFrame) -> dict[str, set]:
    found: dict[str, set] = {}
    for backends, print_ in zip(runs["backends"], runs["fingerprint"]):
        if isinstance(print_, dict):
            profile = print_.get("profile") if isinstance(print_.get("profile"), dict) else {}
            for backend in str(backends or "").split(", "):
                found.setdefault(backend, set()).add(profile.get("sha256"))
    return found


def _selections(runs: pd.DataFrame) -> dict[str, set]:
    found: dict[str, set] = {}
    for backends, selection in zip(runs["backends"], runs["selection"]):
        if isinstance(selection, dict) and selection.get("sha256"):
            for backend in str(backends or "").split(", "):
                found.setdefault(backend, set()).add((selection.get("sha256"), selection.get("count")))
    return found


def _versions(runs: pd.DataFrame, key: str) -> set:
    return {p.get(key) for p in runs["fingerprint"] if isinstance(p, dict) and p.get(key)}


def comparison_notes(current: pd.DataFrame, baseline: pd.DataFrame) -> list[dict[str, Any]]:
    """What the two sets of runs' fingerprints say about comparing them, per backend both have:
    ``{"backend", "fair": bool, "what", "text"}``. Unfair: different device profiles (file hashes) or
    different test selections (hashes of the selected ids). Different torch or accel versions are
    noted as fair (comparing them is the point). Runs without fingerprints are not judged."""
    notes: list[dict[str, Any]] = []
    if current.empty or baseline.empty or "fingerprint" not in current or "fingerprint" not in baseline:
        return notes
    now_profiles, then_profiles = _profiles(current), _profiles(baseline)
    now_sel, then_sel = _selections(current), _selections(baseline)
    for backend in sorted(set(now_profiles) & set(then_profiles)):
        if now_profiles[backend] != then_profiles[backend]:
            def label(hashes: Iterable[Any]) -> str:
                return ", ".join(_short(h) if h else "no profile" for h in sorted(hashes, key=str))
            notes.append({"backend": backend, "fair": False, "what": "different device profiles",
                          "text": f"{backend}: different device profiles (now {label(now_profiles[backend])}, "
                                  f"baseline {label(then_profiles[backend])}): claims, tolerances and known issues differ"})
        if backend in now_sel and backend in then_sel and {h for h, _ in now_sel[backend]} != {h for h, _ in then_sel[backend]}:
            now_n = "/".join(str(n) for _, n in sorted(now_sel[backend], key=str))
            then_n = "/".join(str(n) for _, n in sorted(then_sel[backend], key=str))
            notes.append({"backend": backend, "fair": False, "what": "different test selections",
                          "text": f"{backend}: different test selections ({now_n} tests now, {then_n} in the baseline; "
                                  "the selected test ids differ): pass rates and counts are not like for like"})
    for key in ("torch", "accel"):
        now, then = _versions(current, key), _versions(baseline, key)
        if now and then and now != then:
            notes.append({"backend": None, "fair": True, "what": f"different {key} versions",
                          "text": f"{key} {', '.join(sorted(then))} in the baseline, {', '.join(sorted(now))} now"})
    return notes
