"""``accel/test_utils/scripts/test_merge_weights.py`` (run by Accelerate's multi-device FSDP test) on
two real processes: on cpu, and on emu's two devices when the accel-emu plug-in is installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel.test_utils.testing import path_in_accelerate_package

SCRIPT = path_in_accelerate_package("test_utils", "scripts", "test_merge_weights.py")
TIMEOUT_S = 420  # two ranks importing torch (and loading emu) on a busy 2-core machine


def _launch(backend: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", "ACCELERATE_", "FSDP_", "PYTEST_"))}
    for name in ("ACCEL_EMU_BUILD_DIR",):  # reuse an existing emu build
        if name in os.environ:
            env[name] = os.environ[name]
    env.update(OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "accel.commands.cli", "launch", "--num_processes", "2", "--backend", backend]
    if backend == "cpu":
        command.append("--cpu")
    command.append(str(SCRIPT))
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=tmp_path)


# cpu is slow (nightly): emu runs the same script and merges on two devices, and
# suites/test_fsdp.py::test_merge_weights_output_loads_into_a_plain_module merges on cpu
@pytest.mark.parametrize("backend", [pytest.param("cpu", marks=pytest.mark.slow), "emu"])
def test_merge_weights_script_checks_four_merges(backend, tmp_path):
    if backend == "emu" and importlib.util.find_spec("accel_emu") is None:
        pytest.skip("the accel-emu plug-in is not installed (pip install -e plugins/accel-emu)")
    result = _launch(backend, tmp_path)
    output = f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-6000:]}"
    assert result.returncode == 0, output
    assert "test_merge_weights: 4 merges checked on 2 processes" in result.stdout, output
    assert not list(tmp_path.iterdir()), "the script left files in the working folder"


def test_merge_weights_script_refuses_a_single_process(tmp_path, monkeypatch):
    """The script run as ``__main__`` in this process (one process, no launcher): it stops before any training.
    Its FSDP Accelerator made a one-process group (FSDP needs one, as Accelerate's does); it is taken down after."""
    import runpy

    import torch.distributed as dist

    for name in os.environ:
        if name.startswith(("ACCEL_", "ACCELERATE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ACCEL_USE_CPU", "1")
    monkeypatch.chdir(tmp_path)
    try:
        with pytest.raises(SystemExit, match="needs two or more processes"):
            runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert not list(tmp_path.iterdir())
