"""The steps of a matrix cell: one command each, run with its output in the cell's logs, and the
outcome counts of the harness records it leaves (what ``ci.run_cell`` builds its cell on).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def utc_now() -> str:
    """Now, in UTC, to the second (ISO 8601): the times ``cell.json`` records."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def in_github() -> bool:
    """Whether this runs in a GitHub Actions job (whose log can fold a step's output into a group)."""
    return os.environ.get("GITHUB_ACTIONS") == "true"


@dataclass
class Step:
    """One command of a cell, and once run, when it started, how long it took and how it ended."""

    name: str
    command: list[str]
    cwd: str | None = None
    echo: bool = False
    note: str = ""
    exit_code: int | None = None
    start: str | None = None
    duration_s: float | None = None
    log: str | None = None
    skipped: str | None = None
    #: shown on the console instead of the command (the log has the full command)
    label: str | None = None

    def shell(self) -> str:
        """The command as one shell-quoted line."""
        return " ".join(shlex.quote(c) for c in self.command)

    def to_dict(self) -> dict[str, Any]:
        """The step as ``cell.json`` records it."""
        data = {"name": self.name, "command": self.command, "cwd": self.cwd, "exit_code": self.exit_code,
                "start": self.start, "duration_s": self.duration_s, "log": self.log}
        if self.skipped:
            data["skipped"] = self.skipped
        return data


def run_logged(step: Step, env: dict[str, str], logs: Path, cell_dir: Path, cell_id: str) -> int:
    """Run ``step`` with its output in ``logs/<step>.log`` (echoed when ``step.echo``); its exit status.

    Fills in the step's start, duration, exit code and log (relative to ``cell_dir``); a failing quiet
    step prints its log's tail, so the console says why without opening the log.
    """
    step.start = utc_now()
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{step.name}.log"
    step.log = str(log.relative_to(cell_dir))
    github = in_github() and step.echo
    print(f"ci.run_cell [{cell_id}] {step.name}: {step.label or step.shell()}", flush=True)
    if github:
        print(f"::group::{cell_id} {step.name}", flush=True)
    began = time.perf_counter()
    with open(log, "w", encoding="utf-8", errors="replace") as fh:
        fh.write(f"$ {step.shell()}\n")
        fh.flush()
        try:
            proc = subprocess.Popen(step.command, cwd=step.cwd, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
        except OSError as exc:
            fh.write(f"cannot start: {exc}\n")
            step.exit_code, step.duration_s = 127, 0.0
            print(f"ci.run_cell [{cell_id}] {step.name}: cannot start: {exc}", flush=True)
            return 127
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            if step.echo:
                sys.stdout.write(line)
        step.exit_code = proc.wait()
    step.duration_s = round(time.perf_counter() - began, 2)
    if github:
        print("::endgroup::", flush=True)
    print(f"ci.run_cell [{cell_id}] {step.name}: exit {step.exit_code} in {step.duration_s:.1f}s", flush=True)
    if step.exit_code and not step.echo:
        tail = log.read_text(errors="replace").splitlines()[-25:]
        print("\n".join("    " + t for t in tail), flush=True)
    return step.exit_code


def count_outcomes(results: Path, split_known: bool = False) -> dict[str, int]:
    """Outcome counts of the harness records (``*.jsonl``) under ``results``; ``split_known``
    counts failures that a known issue covers as ``known`` (the operator sweep's outcome)."""
    counts: dict[str, int] = {}
    for path in sorted(results.rglob("*.jsonl")) if results.is_dir() else []:
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("type") == "test":
                outcome = str(obj.get("outcome"))
                if split_known and outcome == "failed" and obj.get("known_issue"):
                    outcome = "known"
                counts[outcome] = counts.get(outcome, 0) + 1
    return counts
