"""`accel test` (the smoke check) and `accel qualify` (the main job), end to end on CPU."""

import json
import os
import subprocess
import sys
import time

import pytest

from _waits import SAFETY_NET_S

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _accel(*args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "accel.commands.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or ENV)


# slow (nightly): tests/lib/test_utils/scripts/test_smoke.py::test_accel_test_passes_under_mixed_precision[bf16-2] runs the same two-process
# accel test with these checks, and test_healthy_ranks_pass_the_training_check[no] its training check in full precision
@pytest.mark.slow
def test_accel_test_two_cpu_processes_all_checks_pass(tmp_path):
    out = tmp_path / "smoke.json"
    proc = _accel("test", "--cpu", "--num_processes", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "world size 2 (asked 2)" in proc.stdout
    assert "9 passed, 0 failed, 0 skipped" in proc.stdout
    payload = json.loads(out.read_text())
    assert payload["world_size"] == 2 and len(payload["ranks"]) == 2
    assert {r["check"] for r in payload["ranks"][1]} >= {"launch: world size", "training equivalence", "checkpoint round trip"}


def test_smoke_detects_a_launcher_that_started_fewer_processes(tmp_path, monkeypatch):
    """The pitfall `accelerate test` misses: asked for 2, got 1 — must fail, not pass. The checks run as the
    one process a launcher started, here in the test process (its random generators restored after)."""
    import random

    import numpy as np
    import torch

    from accel.test_utils.scripts import smoke

    out = tmp_path / "smoke.json"
    monkeypatch.setenv("ACCEL_TEST_EXPECTED_WORLD_SIZE", "2")
    monkeypatch.setenv("ACCEL_DEVICE", "cpu")
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            code = smoke.main(["--out", str(out)])
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
    assert code == 1
    rows = {r["check"]: r for r in json.loads(out.read_text())["ranks"][0]}
    assert rows["launch: world size"]["status"] == "fail"
    assert "asked for 2 processes, the launcher started 1" in rows["launch: world size"]["detail"]
    assert rows["training equivalence"]["status"] == "pass"  # the other checks still ran


def test_accel_test_rejects_bad_flags(capsys):
    from accel.commands.cli import main

    assert main(["test", "--cpu", "--num_processes", "0"]) == 2
    assert "num_processes" in capsys.readouterr().err
    assert main(["test", "--timeout", "-1"]) == 2
    assert "--timeout must be positive" in capsys.readouterr().err


def test_watchdog_stops_stuck_children():
    from accel.commands.test import _Watchdog

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    dog = _Watchdog(0.5)
    dog.start()
    child.wait(timeout=SAFETY_NET_S)  # the child would sleep far longer: only the watchdog ends it in time
    assert dog.fired
    assert child.returncode != 0


def test_merge_names_the_failing_rank():
    from accel.commands.test import _merge

    ok = {"check": "collectives", "status": "pass", "detail": "fine", "seconds": 0.1}
    bad = {"check": "collectives", "status": "fail", "detail": "AssertionError: gather gave [0.0]", "seconds": 0.2}
    (row,) = _merge([[ok], [bad]])
    assert row["status"] == "fail" and row["detail"].startswith("rank 1: AssertionError") and row["seconds"] == 0.2


#: a few quick tests of the backend contract (qualify end to end; the suites themselves run elsewhere)
CONTRACT_SELECTION = "backend_contract and (identity_and_availability or devices_and_synchronize or memory_statistics)"


def test_accel_qualify_end_to_end(tmp_path, monkeypatch, capsys):
    """Through main() in this process (its stages run as processes of their own either way;
    test_ctrl_c_renders_a_partial_report starts the command as one)."""
    from accel.commands.cli import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "qualify"
    code = main(["qualify", "--backend", "cpu", "-n", "0", "-o", str(out), "-k", CONTRACT_SELECTION, "--no-bench", "--ops", "none",
                 "--json"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stdout + stderr
    results = list((out / "results").glob("*.jsonl"))
    assert len(results) == 1 and not (out / "results" / "junit.xml").exists()  # one results file, no copy of it
    from accel_harness.records import read_records

    header, records, problems = read_records(results[0])
    assert not problems and header["run_id"]
    assert len(records) == 3 and all(r["backend"] == "cpu" for r in records)
    assert any(r["outcome"] == "passed" for r in records)
    assert str(out) in stdout
    # the report reads what qualify wrote without a single input problem of qualify's own making
    assert "warning" not in (out / "logs" / "report.log").read_text()
    summary = json.loads((out / "summary.json").read_text())
    suites = summary["stages"][0]
    assert summary["partial"] is False and suites["stage"] == "conformance suites" and suites["exit_code"] == 0
    assert suites["tests_total"] == suites["tests_done"] == len(records) and suites["failing_tests"] == []
    # where the time went: every stage that ran, with the seconds the summary recorded, and their sum
    costs = next(line for line in stdout.splitlines() if line.startswith("accel qualify: stage costs: "))
    assert [stage["stage"] for stage in summary["stages"]] == ["conformance suites", "report"]
    for stage in summary["stages"]:
        assert f"{stage['stage']} {stage['seconds']:.1f}s" in costs
    assert costs.endswith(f"; {sum(stage['seconds'] for stage in summary['stages']):.1f}s in all")


def test_accel_qualify_names_failing_tests(tmp_path, monkeypatch, capsys):
    """In this process (qualify's children are processes of their own either way): the console names the failure."""
    from accel.commands.cli import main

    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "test_mini.py").write_text(
        "import pytest\n"
        "def test_good(device):\n    assert device.type == 'cpu'\n"
        "def test_bad(device):\n    assert device.type == 'nowhere'\n"
    )
    out = tmp_path / "qualify"
    monkeypatch.setenv("ACCEL_SUITES_DIR", str(suites))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    code = main(["qualify", "--backend", "cpu", "-o", str(out), "--no-bench", "--ops", "none", "--json"])
    stdout, stderr = capsys.readouterr()
    assert code == 1, stdout + stderr
    assert "1 failing test(s):" in stdout and "test_mini.py::test_bad[cpu" in stdout
    assert "accel qualify: done (with failures)\naccel qualify: cpu: 2 tests (1 passed, 1 failed)\n" in stdout  # one tally
    stage = json.loads((out / "summary.json").read_text())["stages"][0]
    assert stage["failed"] == 1 and stage["tests_done"] == stage["tests_total"] == 2
    assert [name.split("/")[-1] for name in stage["failing_tests"]] == ["test_mini.py::test_bad[cpu-ws1]"]


def test_ctrl_c_renders_a_partial_report(tmp_path):
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "test_slow.py").write_text(
        "import time\n"
        "import pytest\n"
        "@pytest.mark.parametrize('i', range(40))\n"
        "def test_step(device, i):\n    time.sleep(0.5)\n"
    )
    out = tmp_path / "qualify"
    proc = subprocess.Popen([sys.executable, "-m", "accel.commands.cli", "qualify", "--backend", "cpu", "-o", str(out),
                             "--no-bench", "--ops", "none", "--json"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**ENV, "ACCEL_SUITES_DIR": str(suites)})
    log = out / "logs" / "suites.log"
    deadline = time.monotonic() + 300  # an event (3 tests passed), with room for a loaded machine
    while not (log.is_file() and log.read_text().count("PASSED") >= 3):
        assert proc.poll() is None, f"qualify ended (exit {proc.returncode}) before 3 tests passed:\n{proc.stdout.read()}"
        assert time.monotonic() < deadline, "3 tests did not pass within 300 s"
        time.sleep(0.2)
    proc.send_signal(2)  # what Ctrl-C sends; the suites run in their own session, so only qualify gets it
    try:
        stdout, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stdout
    assert "interrupted during conformance suites; rendering a partial report" in stdout
    assert "with failures" not in stdout and "interrupted during conformance suites; what finished is kept" in stdout
    html = (out / "report" / "report.html").read_text()
    assert "PARTIAL: interrupted during conformance suites" in html
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is True and summary["interrupted_during"] == "conformance suites"
    from accel_harness.records import read_records

    (results,) = (out / "results").glob("*.jsonl")
    _, records, _ = read_records(results)
    assert 3 <= len(records) < 40  # what finished before Ctrl-C is kept, and the run really stopped early


def test_accel_qualify_refuses_a_used_folder(tmp_path, capsys):
    from accel.commands.cli import main

    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("keep me")
    assert main(["qualify", "-o", str(tmp_path / "used"), "--no-bench", "--ops", "none"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "used" / "x").read_text() == "keep me"


def test_accel_qualify_output_that_cannot_be_made_is_one_line_and_exit_2(tmp_path, capsys):
    from accel.commands.cli import main

    (tmp_path / "a-file").write_text("x")
    code = main(["qualify", "-o", str(tmp_path / "a-file" / "sub"), "--no-bench", "--ops", "none"])  # an exception fails here
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "--output" in err and "is a file" in err
