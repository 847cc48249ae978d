"""One precedence rule for every setting in every command: flag, then environment variable, then
config file, then detection; where the environment and the config file disagree, the command says
which it used and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel.launch.precedence import ORDER, choose

CONFIG = "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nbackend: cpu\nnum_processes: 1\nmixed_precision: 'no'\n"


def _run(tmp_path: Path, *args: str, device: str | None, timeout: float = 300) -> subprocess.CompletedProcess:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    env = {**os.environ, "ACCEL_CONFIG_FILE": str(config), "OMP_NUM_THREADS": "1"}
    env.pop("ACCEL_DEVICE", None)
    if device is not None:
        env["ACCEL_DEVICE"] = device
    return subprocess.run([sys.executable, "-m", "accel.commands.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def run_here(tmp_path, monkeypatch, capsys):
    """``accel ARGS`` through main() in this process with ``_run``'s config file, folder and ``ACCEL_DEVICE``
    (none of these commands gets as far as starting anything): a result shaped as ``_run``'s. The backend
    registry starts afresh for each command and after the test."""
    from types import SimpleNamespace

    from accel.backends import reset_registry
    from accel.commands.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(config))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    def run(*args: str, device: str | None):
        if device is None:
            monkeypatch.delenv("ACCEL_DEVICE", raising=False)
        else:
            monkeypatch.setenv("ACCEL_DEVICE", device)
        reset_registry()  # the backend is chosen afresh, as in a new process
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    yield run
    reset_registry()


def test_choose_follows_flag_environment_config_detection():
    assert ORDER == ("flag", "environment", "config file", "detection")
    assert choose("backend", detected="cpu") == choose("backend", flag="", environment=("ACCEL_DEVICE", ""), detected="cpu")
    assert choose("backend", detected="cpu").source == "detection"
    got = choose("backend", environment=("ACCEL_DEVICE", "xpu"), config=("c.yaml", "cpu"))
    assert (got.value, got.source, got.origin) == ("xpu", "environment", "ACCEL_DEVICE")
    assert "ACCEL_DEVICE (xpu) is used over what the config file c.yaml says cpu" in got.note
    assert choose("backend", flag="cuda", environment=("ACCEL_DEVICE", "xpu"), config=("c.yaml", "cpu")).value == "cuda"
    agree = choose("backend", environment=("ACCEL_DEVICE", "CPU"), config=("c.yaml", "cpu"))
    assert agree.note is None and agree.value == "CPU"
    assert choose("backend", config=("c.yaml", "cpu")).describe("backend") == "backend = cpu (from config file)"


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    return script


def test_accel_launch_environment_beats_the_config_file(tmp_path, run_here):
    proc = run_here("launch", str(_script(tmp_path)), device="xpu")
    assert proc.returncode == 2, proc.stdout + proc.stderr  # xpu is not here: refused, not silently cpu
    assert "xpu" in proc.stderr and "the backend came from ACCEL_DEVICE" in proc.stderr and "ran" not in proc.stdout


def test_accel_launch_flag_beats_the_environment_and_says_so(tmp_path):
    proc = _run(tmp_path, "launch", "--cpu", str(_script(tmp_path)), device="xpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ran" in proc.stdout
    assert "the command line (cpu) is used over what ACCEL_DEVICE says xpu" in proc.stderr


def test_accel_test_environment_beats_the_config_file(run_here):
    proc = run_here("test", device="xpu")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the backend came from ACCEL_DEVICE" in proc.stderr and "not available" in proc.stderr


def test_accel_env_says_where_the_backend_came_from(run_here):
    proc = run_here("env", "--json", device="xpu")
    assert proc.returncode == 2, proc.stderr  # the requested backend is not here: the report says why
    selected = json.loads(proc.stdout)["selected_backend"]
    assert selected["source"] == "ACCEL_DEVICE" and "not available" in selected["error"]
    assert "is used over what the config file" in selected["note"] and "says cpu" in selected["note"]
    text = run_here("env", device=None)
    assert "cpu (from config file" in text.stdout  # no environment variable: the config file decides


def test_accel_qualify_environment_beats_detection(tmp_path, run_here):
    proc = run_here("qualify", "-o", str(tmp_path / "q"), "--no-bench", "--ops", "none", device="xpu")
    assert proc.returncode == 2 and "xpu" in proc.stderr, proc.stdout + proc.stderr


def test_the_library_follows_the_environment(monkeypatch):
    from accel.backends import BackendError, get_registry

    monkeypatch.setenv("ACCEL_DEVICE", "cpu")
    assert get_registry().select().name == "cpu"
    monkeypatch.setenv("ACCEL_DEVICE", "xpu")  # named but not here: an error that says so, never a quiet fallback
    with pytest.raises(BackendError, match="xpu"):
        get_registry().select()
