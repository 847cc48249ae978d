"""`accel launch` end to end on the backend under test.

``python -m accel.commands.cli launch --backend NAME --num_processes 2 script.py`` (plus ``--cpu`` on
the cpu backend) must start exactly two ranks that form a process group on the backend's collective
backend and can all-reduce; a rank that fails must fail the launch with its own exit code.

A two-rank launch needs what a ``world_size(2)`` test needs: a collective backend, and on backends
whose ranks cannot share a device, two devices. The skip decision is the harness's own for that
marker (``accel_harness.markers.evaluate``), so the reason codes are the same (``needs-multiprocess``,
``needs-devices``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from accel_harness.markers import evaluate, format_skip

LAUNCH_TIMEOUT_S = 180

SCRIPT = textwrap.dedent(
    """
    import os
    import sys

    if sys.argv[1:] == ["fail"] and os.environ.get("RANK") == "1":
        sys.exit(7)  # before joining the group: rank 0 is left waiting and must be stopped

    import torch
    import torch.distributed as dist

    from accel.state import PartialState

    state = PartialState()
    value = torch.tensor([float(state.process_index + 1)], device=state.device)
    dist.all_reduce(value)
    report = (f"world={state.num_processes} backend={state.hardware_backend.name} "
              f"device={value.device.type} sum={value.item():g}")
    # a file per rank: the ranks share the launcher's stdout, where their lines may interleave
    folder = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(folder, f"rank{state.process_index}.report"), "w") as fh:
        fh.write(report)
    """
)

_ENV_TO_CLEAR = (
    "ACCEL_DEVICE", "ACCEL_CONFIG_FILE", "ACCEL_USE_CPU", "ACCEL_MIXED_PRECISION", "ACCELERATE_USE_CPU",
    "ACCELERATE_MIXED_PRECISION", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
)


@pytest.fixture
def two_rank_backend(backend):
    """The instance's backend, if it can run two ranks; else the skip a world_size(2) test would get."""
    reason = evaluate([pytest.mark.world_size(2).mark], backend)
    if reason is not None:
        pytest.skip(format_skip(reason))
    return backend


def _launch(backend, tmp_path, *script_args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "launched.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in _ENV_TO_CLEAR}
    env.update(OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "cache"))  # no user config file is read
    command = [sys.executable, "-m", "accel.commands.cli", "launch", "--backend", backend.name, "--num_processes", "2"]
    if backend.device_type == "cpu":
        command.append("--cpu")
    command += [str(script), *script_args]
    return subprocess.run(command, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=env, cwd=tmp_path)


def test_launch_starts_two_ranks_that_all_reduce(two_rank_backend, tmp_path):
    result = _launch(two_rank_backend, tmp_path)
    output = f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.returncode == 0, output
    reports = {p.stem: p.read_text() for p in tmp_path.glob("rank*.report")}
    assert sorted(reports) == ["rank0", "rank1"], output
    for rank, report in reports.items():
        assert report == f"world=2 backend={two_rank_backend.name} device={two_rank_backend.device_type} sum=3", \
            f"rank {rank}: {report}\n{output}"


def test_a_failing_rank_fails_the_launch_with_its_exit_code(two_rank_backend, tmp_path):
    result = _launch(two_rank_backend, tmp_path, "fail")
    output = f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.returncode == 7, output
    assert "rank 1" in result.stderr and "exit code 7" in result.stderr, output
    assert not list(tmp_path.glob("rank*.report")), output
