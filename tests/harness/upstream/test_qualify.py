"""``accel qualify --upstream``: a tiny upstream project at hand (no network), against itself and
against a stand-in for accel (``--against``), into results, the vendor report and ``--json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel_harness.records import read_records
from _waits import SAFETY_NET_S

PKG_INFO = """\
Metadata-Version: 2.1
Name: fakeproj
Version: 2.0
Provides-Extra: testing
Requires-Dist: pytest; extra == "testing"
"""

CORE_TESTS = '''\
import unittest

import pytest

from fakeproj import add


class T(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(1, 2), 3)

    @unittest.skip("test requires a GPU")
    def test_gpu(self):
        pass

    @unittest.skipUnless(False, "test requires multiple XPUs")
    def test_multi(self):
        pass

    def test_value(self):
        from fakeproj import VALUE
        assert VALUE == 1


@pytest.mark.fakeproj_own_marker
def test_marked():
    assert add(2, 2) == 4
'''


def _project(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "fakeproj-2.0"
    (root / "src" / "fakeproj").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "PKG-INFO").write_text(PKG_INFO)
    (root / "setup.cfg").write_text("[tool:pytest]\nmarkers =\n    fakeproj_own_marker: its own marker\n")
    (root / "src" / "fakeproj" / "__init__.py").write_text("def add(a, b):\n    return a + b\n\nVALUE = 1\n")
    (root / "tests" / "test_core.py").write_text(CORE_TESTS)
    (root / "tests" / "test_more.py").write_text("from fakeproj import VALUE\n\n\ndef test_value():\n    assert VALUE == 1\n")
    alt = tmp_path / "alt"
    (alt / "altproj").mkdir(parents=True)
    (alt / "altproj" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")  # no VALUE: a compatibility gap
    return root, alt


def _host_project(tmp_path: Path) -> Path:
    # the output folder sits in a project whose pytest config is strict about markers: the upstream
    # suite must run under its own configuration, not that one
    project = tmp_path / "host_project"
    project.mkdir(exist_ok=True)
    (project / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n")
    return project


def _qualify_here(tmp_path: Path, monkeypatch, capsys, *args: str, pythonpath: str = "") -> tuple[int, str, str]:
    """``accel qualify`` through ``main()`` in this process, from the host project (its children are processes
    of their own either way; test_ctrl_c_stops_the_suite... runs the command as one): the exit status, stdout, stderr."""
    from accel.commands.cli import main

    monkeypatch.chdir(_host_project(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", pythonpath)
    monkeypatch.delenv("ACCEL_DEVICE", raising=False)
    code = main(["qualify", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_qualify_upstream_against_itself_and_a_rewrite(tmp_path, monkeypatch, capsys):
    root, alt = _project(tmp_path)
    out = tmp_path / "host_project" / "q"
    code, stdout, stderr = _qualify_here(tmp_path, monkeypatch, capsys, "--upstream", str(root), "--against",
                                         "fakeproj,altproj", "--no-install", "--no-bench", "-o", str(out), "--json",
                                         pythonpath=f"{root / 'src'}{os.pathsep}{alt}")
    text = stdout + stderr
    assert code == 1, text  # the rewritten side has failures
    assert "fakeproj 2.0 against fakeproj on cpu: completed — 4 passed, 2 skipped" in text
    assert "fakeproj 2.0 against altproj on cpu: completed — 2 passed, 1 failed, 1 error, 2 skipped (1 modules failed to import)" in text
    assert "2 of the 4 tests that pass against fakeproj also pass against altproj (50.0%)" in text

    ref = out / "results" / "fakeproj-2.0-against-fakeproj-cpu.jsonl"
    header, records, problems = read_records(ref)
    assert not problems and header["extra"]["upstream"]["status"] == "completed" and header["backends"] == ["cpu"]
    codes = {r["nodeid"].split("::")[-1]: r["reason_code"] for r in records if r["outcome"] == "skipped"}
    assert codes == {"test_gpu": "not-on-backend", "test_multi": "needs-devices"}
    rewritten = (out / "work" / "fakeproj-2.0-against-altproj-cpu" / "tests" / "test_core.py").read_text()
    assert "from altproj import add" in rewritten and "fakeproj_own_marker" in rewritten  # only the word is rewritten

    md = (out / "report" / "report.md").read_text()
    assert "## Upstream suites" in md and "1 × module does not import: ImportError: cannot import name 'VALUE'" in md
    assert "input problem" not in md  # qualify's own files do not count twice
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["against"], r["status"], r["counts"]) for r in summary["runs"]] == [
        ("fakeproj", "completed", {"passed": 4, "skipped": 2}),
        ("altproj", "completed", {"passed": 2, "failed": 1, "skipped": 2, "error": 1}),
    ]
    assert summary["requirements"] == ["pytest"] and summary["install"]["skipped"]


def test_qualify_upstream_suite_that_fails_at_collection(tmp_path, monkeypatch, capsys):
    root, _ = _project(tmp_path)
    (root / "tests" / "conftest.py").write_text("import torch\ntorch.xpu.no_such_memory_op()\n")
    out = tmp_path / "host_project" / "q"
    code, stdout, stderr = _qualify_here(tmp_path, monkeypatch, capsys, "--upstream", str(root), "--no-install",
                                         "--no-bench", "-o", str(out), pythonpath=str(root / "src"))
    text = stdout + stderr
    assert code == 1, text
    assert "against fakeproj on cpu: collection-failed" in text
    header, records, _ = read_records(out / "results" / "fakeproj-2.0-against-fakeproj-cpu.jsonl")
    assert header["extra"]["upstream"]["status"] == "collection-failed"
    md = (out / "report" / "report.md").read_text()
    assert "| collection-failed |" in md and "the suite fails at collection" in md
    assert "the suite fails at collection (1 module(s) cannot be imported; AttributeError: module 'torch.xpu' has no attribute " \
           "'no\\_such\\_memory\\_op')" in md  # the reason, from pytest's output
    assert [(r["nodeid"], r["outcome"], r["signature"]) for r in records] == [
        ("tests", "error", "AttributeError: module 'torch.xpu' has no attribute 'no_such_memory_op'")]


@pytest.mark.parametrize("spec, needle", [("fakeproj", "NAME==VERSION"), ("./missing-folder", "no such folder")])
def test_qualify_upstream_usage_errors(tmp_path, monkeypatch, capsys, spec, needle):
    code, _, err = _qualify_here(tmp_path, monkeypatch, capsys, "--upstream", spec, "--no-bench", "-o", str(tmp_path / "q"))
    assert code == 2 and needle in err, err


def test_against_without_upstream_is_a_usage_error(tmp_path, monkeypatch, capsys):
    code, _, err = _qualify_here(tmp_path, monkeypatch, capsys, "--against", "accel", "--no-bench", "-o", str(tmp_path / "q"))
    assert code == 2 and "--against only goes with --upstream" in err, err


def _started_marker_test(marker: Path) -> str:
    """A test that says (by writing ``marker``) that it is running, then sleeps far past any timeout."""
    return ("import pathlib\nimport time\n\n"
            f"def test_slow():\n    pathlib.Path({str(marker)!r}).write_text('running')\n    time.sleep(600)\n")


def _wait_for(path: Path, proc: subprocess.Popen | None = None, limit: float = SAFETY_NET_S) -> None:
    """Wait until ``path`` exists (an event, not a guessed delay); fail naming what never happened."""
    import time

    deadline = time.monotonic() + limit
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the command ended (exit {proc.returncode}) before {path.name} appeared:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{path.name} did not appear within {limit:.0f}s")
        time.sleep(0.1)


def test_a_run_past_its_session_timeout_is_stopped_and_keeps_what_finished(tmp_path, monkeypatch):
    import time

    from accel_harness import progress
    from accel_harness import upstream as up

    tests = tmp_path / "suite" / "tests"
    tests.mkdir(parents=True)
    (tests / "test_a_fast.py").write_text("def test_fast():\n    pass\n")
    started = tmp_path / "slow-started"
    (tests / "test_b_slow.py").write_text(_started_marker_test(started))
    suite = up.Suite("fakeproj", "2.0", tests, tmp_path / "suite")
    limit = 1234.5  # never reached: the limit strikes as an event, once the slow test runs (test_fast done)
    waits = []

    class LimitStrikesOnceTheSlowTestRuns(subprocess.Popen):
        def wait(self, timeout=None):
            if timeout != limit:
                return super().wait(timeout)
            waits.append(timeout)
            deadline = time.monotonic() + SAFETY_NET_S
            while not started.exists() and self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.poll() is not None:
                return self.returncode
            raise subprocess.TimeoutExpired(self.args, timeout)

    with monkeypatch.context() as patched:
        patched.setattr(progress.subprocess, "Popen", LimitStrikesOnceTheSlowTestRuns)
        run = up.run_suite(suite, "cpu", tmp_path / "out", session_timeout=limit, test_timeout=None)
    assert waits == [limit]  # the session's limit is the wait on the suite's process
    assert started.exists(), run.log.read_text()
    assert run.status == "interrupted" and run.exit_code is None, run.log.read_text()
    assert run.counts == {"passed": 1}
    assert "# stopped: time limit" in run.log.read_text()
    header, records, _ = read_records(run.results)
    assert header["interrupted"] and header["extra"]["upstream"]["status"] == "interrupted"


def test_ctrl_c_stops_the_suite_and_still_renders_a_partial_report(tmp_path):
    import signal

    root, _ = _project(tmp_path)
    started = tmp_path / "slow-started"
    (root / "tests" / "test_slow.py").write_text(_started_marker_test(started))  # collected after test_core/test_more
    out = tmp_path / "q"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root / "src")}
    env.pop("ACCEL_DEVICE", None)
    proc = subprocess.Popen([sys.executable, "-m", "accel.commands.cli", "qualify", "--upstream", str(root), "--no-install",
                             "--no-bench", "-o", str(out)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(started, proc)  # the quick tests are done and the slow one is running
        proc.send_signal(signal.SIGINT)
        # bounded by qualify itself: 20 s for the suite to stop, 30 s for its output, then the report
        text, _ = proc.communicate(timeout=SAFETY_NET_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, text
    assert "interrupted; rendering a partial report" in text
    header, records, _ = read_records(out / "results" / "fakeproj-2.0-against-fakeproj-cpu.jsonl")
    assert header["interrupted"] and header["extra"]["upstream"]["status"] == "interrupted"
    assert {r["outcome"] for r in records} >= {"passed"} and not any("test_slow" in r["nodeid"] for r in records)
    md = (out / "report" / "report.md").read_text()
    assert "cut short" in md and "| interrupted |" in md
