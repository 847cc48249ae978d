"""One inner pytest session whose results several tests inspect (pytester's own fixture is per test).

A module-scoped fixture writes its suite into a folder with :func:`write`, runs it once with
:func:`run` (in a subprocess, as ``pytester.runpytest_subprocess`` does: ``--basetemp`` inside the
folder, no outer ``PYTEST_ADDOPTS``, ``HOME`` in the folder, no colours) and hands the result to
the tests. ``-rA`` lists every test's outcome, which :func:`outcomes` reads per file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from _waits import SAFETY_NET_S


def write(folder: Path, **files: str) -> None:
    """Write ``name=source`` as ``folder/name.py`` (source dedented)."""
    for name, source in files.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))


def run(folder: Path, *args: str, env: dict[str, str] | None = None, timeout: float = SAFETY_NET_S) -> pytest.RunResult:
    """``python -m pytest -p no:cacheprovider -rA ARGS`` in ``folder``; its exit status and output."""
    full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HOME": str(folder),
                "USERPROFILE": str(folder), "PY_COLORS": "0", **(env or {})}
    for name in ("PYTEST_ADDOPTS", "TOX_ENV_DIR"):
        full_env.pop(name, None)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", f"--basetemp={folder / 'basetemp'}", "-p", "no:cacheprovider",
                           "-rA", *args], cwd=folder, env=full_env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return pytest.RunResult(done.returncode, done.stdout.splitlines(), done.stderr.splitlines(),
                            time.monotonic() - started)


_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S+?\.py)::(\S+)")
_SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] (\S+?\.py):\d+")


def outcomes(result: pytest.RunResult, file: str) -> Counter:
    """Outcome -> count for the tests of ``file`` (e.g. ``test_leak.py``), from the ``-rA`` summary."""
    counts: Counter = Counter()
    for line in result.outlines:
        if (match := _SUMMARY.match(line)) and match[2] == file:
            counts[match[1].lower()] += 1
        elif (match := _SKIPPED.match(line)) and match[2] == file:
            counts["skipped"] += int(match[1])
    return counts


def outcome_of(result: pytest.RunResult, test_id: str) -> str | None:
    """The outcome (``passed``, ``failed``, ...) of one test, ``FILE::NAME[PARAMS]``, from the ``-rA`` summary."""
    for line in result.outlines:
        if (match := _SUMMARY.match(line)) and f"{match[2]}::{match[3]}" == test_id:
            return match[1].lower()
    return None


def section(result: pytest.RunResult, test_name: str) -> str:
    """The failure section of one test (from its ``____ NAME ____`` header to the next header)."""
    text = result.stdout.str()
    header = re.search(rf"^_+ {re.escape(test_name)}(\[\S*\])? _+$", text, flags=re.M)
    assert header, f"no section for {test_name}:\n{text[-4000:]}"
    rest = text[header.end():]
    following = re.search(r"^(_{3,} \S.* _{3,}|={3,} .* ={3,})$", rest, flags=re.M)
    return rest[:following.start()] if following else rest


def check_all(checks: dict, result: pytest.RunResult) -> None:
    """Run every check (description -> callable raising AssertionError); fail once, naming each that failed,
    with the end of the session's output: one failing scenario does not hide the others."""
    failed = []
    for what, check in checks.items():
        try:
            check()
        except AssertionError as exc:
            failed.append(f"{what}: {exc}")
    assert not failed, "\n\n".join(failed) + "\n\n--- the inner session's output (end) ---\n" + result.stdout.str()[-8000:]
