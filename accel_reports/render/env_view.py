"""The report's environment block and its path handling (part of :mod:`accel_reports.render.report`): the
distinct machines and software of the runs, and file names and free text written relative to the
report folder, never as local absolute paths."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from ..analyse.analysis import Report
from .text import _records, _short_time, _version_sort_key


# ---------------------------------------------------------------------------- environment block
def _join_map(value: Any) -> str:
    """``{"cuda": "550.54"}`` -> ``550.54``; with several backends ``cuda: 550.54; xpu: 1.3``."""
    if isinstance(value, dict):
        items = [(k, v) for k, v in value.items() if v not in (None, "", [], {})]
        if len(value) == 1 and items:
            return str(items[0][1])
        return "; ".join(f"{k}: {v}" for k, v in items)
    return "" if value is None else str(value)


#: environment columns: (key, heading); the runs frame's column when it has one, else the header's
_ENV_FIELDS = (("host", "host"), ("os", "OS"), ("kernel", "kernel"), ("python", "Python"), ("backends", "backends"),
               ("devices", "devices"), ("driver_versions", "driver"), ("runtime_versions", "runtime"),
               ("torch", "torch"), ("accel_version", "accel"), ("git_commit", "git commit"))


def _benchmark_environments(benchmarks: pd.DataFrame) -> list[dict[str, Any]]:
    """Environment rows from the machine and commit each pytest-benchmark file recorded (kept in
    the rows by the loader), for a report of benchmarks only: harness runs carry a fuller header."""
    rows = []
    for _, group in benchmarks.groupby("source", sort=True, dropna=False):
        env = next((e for e in group["environment"] if isinstance(e, dict)), {}) if "environment" in group else {}

        def text(key: str) -> str:
            value = env.get(key)
            return value if isinstance(value, str) else ""

        devices = sorted({f"{b}: {d}" for b, d in zip(group["backend"], group["device"]) if d})
        torch = sorted({str(t) for t in group["torch_version"] if t})
        accel = sorted({str(a) for a in group["accel_version"] if a})
        when = next((str(w) for w in group["datetime"] if isinstance(w, str) and w), None)
        rows.append({
            "host": text("host"), "os": text("os"), "kernel": text("kernel"), "python": text("python"),
            "backends": ", ".join(sorted({str(b) for b in group["backend"]})),
            "devices": "; ".join(devices) or text("cpu"), "driver_versions": "", "runtime_versions": "",
            "torch": ", ".join(torch), "accel_version": ", ".join(accel), "git_commit": text("git_commit"),
            "start_time": when,
        })
    return rows


def _environment_view(report: Report) -> list[dict[str, Any]]:
    """Distinct machine and software environments of the runs (OS, kernel, driver and runtime
    versions, git commit), each with its run count and time span, from what the loader kept of
    each run's header (no file is read here: a report from a run history has only the history);
    a report of benchmarks only uses the benchmark files' machine and commit information."""
    runs = report.loaded.runs
    if runs.empty:
        bench = report.loaded.benchmarks
        if bench.empty:
            return []
        return _collapse_environments(_benchmark_environments(bench))
    rows = []
    for run in _records(runs):
        def pick(key: str) -> str:
            value = run.get(key)
            return value if isinstance(value, str) else ""

        commit = pick("git_commit")
        rows.append({
            "host": pick("host"), "os": pick("os"), "kernel": pick("kernel"), "python": pick("python"),
            "backends": pick("backends"), "devices": pick("devices") or pick("device_models"),
            "driver_versions": _join_map(run.get("driver_versions")),
            "runtime_versions": _join_map(run.get("runtime_versions")),
            "torch": " ".join(v for v in (pick("torch_version"), pick("torch_build")) if v),
            "accel_version": pick("accel_version"), "git_commit": commit,
            "start_time": run.get("start_time"),
        })
    return _collapse_environments(rows)


def _collapse_environments(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per distinct environment, with its run count and first and last start time. The
    commit is not part of what makes an environment distinct (a nightly history has one per night):
    a row shows its latest run's commit and how many distinct commits its runs had."""
    envs: dict[tuple, dict[str, Any]] = {}
    for row in found:
        key = tuple(row[k] for k, _ in _ENV_FIELDS if k != "git_commit")
        start = str(row.pop("start_time", None) or "")
        entry = envs.setdefault(key, {**row, "runs": 0, "first": None, "last": None, "commits": set(), "_latest": None})
        entry["runs"] += 1
        if row["git_commit"]:
            entry["commits"].add(row["git_commit"])
            if entry["_latest"] is None or start >= entry["_latest"]:
                entry["_latest"], entry["git_commit"] = start, row["git_commit"]
        if start:
            entry["first"] = min(filter(None, (entry["first"], start)))
            entry["last"] = max(filter(None, (entry["last"], start)))
    rows = sorted(envs.values(), key=lambda r: (r["host"], r["backends"], _version_sort_key(r["torch"].split(" ")[0]), r["accel_version"]))
    for row in rows:
        row["commit_short"] = row["git_commit"][:12] if row["git_commit"] else "not recorded"
        row["commit_count"] = len(row.pop("commits"))
        row.pop("_latest")
        if row["commit_count"] > 1:
            row["commit_short"] += f" (latest of {row['commit_count']})"
        row["first_text"], row["last_text"] = _short_time(row["first"]), _short_time(row["last"])
    return rows


# ---------------------------------------------------------------------------- paths
def _shown_path(path: Any, base: Path) -> str:
    """``path`` relative to the report folder ``base`` (``../results/run.jsonl``): a report that is
    moved with its inputs still names them, and no local absolute path is written into it."""
    text = str(path or "")
    if not text or "://" in text:
        return text
    import os

    try:
        return Path(os.path.relpath(os.path.abspath(text), base)).as_posix()
    except ValueError:  # another drive (Windows): the file name is all that can be shown
        return Path(text).name


def _path_scrubber(base: Path):
    """A function that replaces the absolute local folders found in free text (tracebacks, messages)
    with their place relative to the report folder ``base``, or ``<python>`` / ``~`` for the Python
    installation and the home folder."""
    import os
    import sys

    roots: list[tuple[str, str]] = []
    # the working folder (where the suites ran, as a rule) is left out: its files read as the suites name them
    for folder, label in ((os.getcwd(), ""), (str(base), "./"), (sys.prefix, "<python>/"), (sys.base_prefix, "<python>/"),
                          (os.path.expanduser("~"), "~/")):
        folder = os.path.abspath(folder)
        if len(folder) > 1:
            roots.append((folder.rstrip(os.sep) + os.sep, label))
    roots.sort(key=lambda r: -len(r[0]))  # the deepest folder first
    pattern = re.compile("|".join(re.escape(folder) for folder, _ in roots)) if roots else None
    replacement = dict(roots)

    def scrub(value: Any) -> Any:
        if not isinstance(value, str) or pattern is None:
            return value
        return pattern.sub(lambda m: replacement[m.group(0)], value)


    return scrub
