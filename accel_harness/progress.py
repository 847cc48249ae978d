"""Live progress of a child pytest run, for ``accel qualify`` (conformance suites, benchmarks, upstream suites).

A qualification runs for minutes in child processes; without this it prints nothing until the end.
:class:`PytestProgress` reads the child's output line by line (``-v`` lines, ``-q`` dot lines, or
xdist's ``[gw0] [ 40%] PASSED nodeid`` lines) and keeps: tests done of total, failures so far,
the test now running and the failing test names. :class:`ProgressDisplay` shows it: a rich live
panel on a terminal, or a plain line every ``every`` seconds when stdout is not a terminal or
``CI`` is set (logs stay readable, no control codes).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TextIO

__all__ = ["PytestProgress", "ProgressDisplay", "interactive", "run_streamed", "stop_group"]

#: pytest's outcome words in ``-v`` lines
_WORDS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped",
          "XFAIL": "xfailed", "XPASS": "xpassed"}
_VERBOSE = re.compile(r"^(?:\[gw\d+\]\s+(?:\[\s*\d+%\]\s+)?(?P<word1>[A-Z]+)\s+(?P<id1>\S+::\S+)"
                      r"|(?P<id2>\S+::\S+)\s+(?P<word2>[A-Z]+)\b)")
_DOTS = re.compile(r"^(?:\S+\.py\s+)?(?P<dots>[.sFExXu]+)\s*\[\s*\d+%\]\s*$")  # the [ 40%] tells it from "E   ..." lines
_TOTAL = re.compile(r"(?:collected|\bworkers?\s+\[)\s*(?P<n>\d+)\s+items?(?:.*?/\s*(?P<selected>\d+)\s+selected)?")
_SUMMARY = re.compile(r"^(?P<word>FAILED|ERROR)\s+(?P<id>\S+)")
_DOT_OUTCOMES = {".": "passed", "s": "skipped", "F": "failed", "E": "error", "x": "xfailed", "X": "xpassed", "u": "passed"}


def interactive(stream: TextIO | None = None) -> bool:
    """Whether a live display suits ``stream``: a terminal, and not under CI."""
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("CI")


@dataclass
class PytestProgress:
    """What one child pytest run has done so far, read from its output lines."""

    stage: str
    total: int | None = None
    done: int = 0
    current: str = ""
    failures: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    _seen: set = field(default_factory=set, repr=False)
    _dot_failures: int = 0

    @property
    def failed(self) -> int:
        """Failed or erroring tests so far (by name when pytest names them, else by dot count)."""
        return max(self._dot_failures, len(self.failures))

    def feed(self, line: str) -> None:
        """Take one output line of the child pytest."""
        text = line.rstrip("\n")
        total = _TOTAL.search(text)
        if total:
            self.total = int(total.group("selected") or total.group("n"))
            return
        summary = _SUMMARY.match(text)  # the -rfE summary at the end: "FAILED nodeid - message"
        if summary:
            self._note_failure(summary.group("id"))
            return
        verbose = _VERBOSE.match(text)
        if verbose:
            outcome = _WORDS.get(verbose.group("word1") or verbose.group("word2") or "")
            if outcome is None:
                return
            nodeid = verbose.group("id1") or verbose.group("id2")
            self.current = nodeid
            if nodeid not in self._seen:  # an error in teardown after a pass prints a second line
                self._seen.add(nodeid)
                self.done += 1
            if outcome in ("failed", "error"):
                self._note_failure(nodeid)
            return
        dots = _DOTS.match(text)
        if dots:
            for char in dots.group("dots"):
                self.done += 1
                self._dot_failures += _DOT_OUTCOMES[char] in ("failed", "error")

    def _note_failure(self, nodeid: str) -> None:
        if nodeid not in self.failures:
            self.failures.append(nodeid)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def line(self) -> str:
        """One plain status line."""
        of = f" of {self.total}" if self.total else ""
        now = f"; now {self.current}" if self.current else ""
        return (f"accel qualify: {self.stage}: {self.done}{of} tests done, {self.failed} failed/errors, "
                f"{self.elapsed:.0f}s elapsed{now}")


class ProgressDisplay:
    """Shows one :class:`PytestProgress` while its stage runs: rich live panel or periodic plain lines."""

    def __init__(self, progress: PytestProgress, *, live: bool | None = None, every: float = 15.0,
                 stream: TextIO | None = None):
        self.progress = progress
        self.stream = stream or sys.stdout
        self.live = interactive(self.stream) if live is None else live
        self.every = every
        self._last = time.monotonic()
        self._rich: Any = None
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> "ProgressDisplay":
        if self.live:
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            except ImportError:  # rich is in the harness extra; without it, plain lines
                self.live = False
                return self
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("[red]{task.fields[failed]} failed"), TimeElapsedColumn(),
                                 TextColumn("{task.fields[current]}"), console=Console(file=self.stream),
                                 transient=False)
            self._bar.start()
            self._task = self._bar.add_task(self.progress.stage, total=None, failed=0, current="")
        return self

    def feed(self, line: str) -> None:
        """Pass one child output line on to the progress, and refresh the display."""
        self.progress.feed(line)
        p = self.progress
        if self._bar is not None:
            current = p.current if len(p.current) <= 70 else "…" + p.current[-69:]
            self._bar.update(self._task, completed=p.done, total=p.total, failed=p.failed, current=current)
        elif time.monotonic() - self._last >= self.every:
            self._last = time.monotonic()
            print(p.line(), file=self.stream, flush=True)

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()


def stop_group(proc: subprocess.Popen, first: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """End a child started in its own session, and everything it started: ``first``, then SIGKILL."""
    for sig, wait in ((first, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def run_streamed(command: Sequence[str], log: str | os.PathLike[str], *, on_line: Callable[[str], None] | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                 timeout: float | None = None, header: str = "") -> int | None:
    """Run ``command`` with its output going line by line to ``log`` and to ``on_line``.

    Returns the exit status, or None when ``timeout`` ended it. The child runs in its own session,
    so a Ctrl-C reaches only this process: it then passes SIGINT on (pytest finishes its results
    files, marked interrupted), allows 20 s, ends the group, and raises KeyboardInterrupt.
    """
    with open(log, "w", encoding="utf-8") as fh:
        if header:
            fh.write(header)
            fh.flush()
        proc = subprocess.Popen(list(command), cwd=cwd, env=dict(env) if env is not None else None,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                fh.flush()
                if on_line is not None:
                    try:
                        on_line(line.rstrip("\n"))
                    except Exception:  # a display problem must not stop the run
                        pass

        reader = threading.Thread(target=pump, name="child-output", daemon=True)
        reader.start()
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            code = None
            reader.join(timeout=30)
            fh.write("\n# stopped: time limit\n")
            return code
        except KeyboardInterrupt:
            stop_group(proc, first=signal.SIGINT, grace=20.0)
            reader.join(timeout=30)
            fh.write("\n# stopped: interrupted\n")
            raise
        reader.join(timeout=30)
        return code
