"""accel's own multi-process check scripts (accel.test_utils.scripts), run as Accelerate's suite runs them."""

from __future__ import annotations

import pytest

from accel import debug_launcher
from accel.test_utils import test_ops, test_script, test_sync
from accel.test_utils.scripts import test_distributed_data_loop
from accel.test_utils.scripts.external_deps import test_metrics
from dist_utils import free_port


@pytest.fixture(scope="module", autouse=True)
def dynamo_imported_once():
    """The ranks debug_launcher forks build optimizers, and an optimizer's first construction imports
    torch._dynamo (seconds): imported here once, each forked rank inherits it instead of importing it again."""
    import torch._dynamo  # noqa: F401


@pytest.mark.parametrize("script", [test_ops, test_sync, test_script, test_distributed_data_loop, test_metrics],
                         ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_scripts_pass_on_two_cpu_processes(script):
    debug_launcher(script.main, num_processes=2)


def test_scripts_pass_on_one_process():
    for script in (test_ops, test_sync):
        debug_launcher(script.main, num_processes=1)


def test_test_ops_fails_loudly_when_a_collective_is_wrong(monkeypatch):
    from accel.utils import operations

    def gather_object_dropping_the_last_rank(obj):
        return [obj[0]] if isinstance(obj, list) else [obj]

    # debug_launcher forks: the ranks inherit the broken collective
    monkeypatch.setattr(operations, "gather_object", gather_object_dropping_the_last_rank)
    with pytest.raises(Exception) as info:
        debug_launcher(test_ops.main, num_processes=2)
    assert "gather_object gave" in str(info.value) or "gather_object gave" in repr(info.value.__cause__)


def test_test_sync_fails_loudly_when_no_sync_synchronises(monkeypatch):
    import contextlib

    from accel.accelerator import Accelerator

    monkeypatch.setattr(Accelerator, "no_sync", lambda self, model: contextlib.nullcontext())
    with pytest.raises(Exception) as info:
        debug_launcher(test_sync.main, num_processes=2)
    assert "no_sync" in str(info.value) or "no_sync" in repr(info.value.__cause__)


def _run(command, **env):
    import os
    import subprocess
    import sys

    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300, env=full_env)


def test_cli_script_under_accel_launch_checks_the_world_size(monkeypatch, capsys):
    from accel.test_utils.scripts import test_cli
    from accel.test_utils.testing import path_in_accelerate_package

    script = str(path_in_accelerate_package("test_utils", "scripts", "test_cli.py"))
    launch = ["-m", "accel.commands.cli", "launch", "--cpu", "--num_processes", "2", script]
    ok = _run(launch, ACCEL_TEST_EXPECTED_WORLD_SIZE="2")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "process 0 of 2" in ok.stdout and "process 1 of 2" in ok.stdout
    # the script's own check, in this process as one unlaunched process (a launch exits with its rank's
    # code: tests/lib/launch/test_launch.py's test_a_rank_exit_code_becomes_the_launch_exit_code)
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCEL_TEST_EXPECTED_WORLD_SIZE", "3")
    with pytest.raises(SystemExit) as wrong:
        test_cli.main()
    assert wrong.value.code == 1 and "expected 3 processes, the launcher started 1" in capsys.readouterr().err


def test_notebook_script_on_two_processes():
    from accel.test_utils.testing import path_in_accelerate_package

    script = str(path_in_accelerate_package("test_utils", "scripts", "test_notebook.py"))
    # a port of its own: the default (29500) is shared by everything on the host that takes the default
    done = _run([script], ACCEL_NUM_PROCESSES="2", ACCEL_TEST_PORT=free_port())
    # the whole short-summary and the workers' errors: a rare gloo "Connection refused" under load is not yet explained
    assert done.returncode == 0, done.stdout[-12000:] + done.stderr[-4000:]
    assert "4 passed" in done.stdout


def test_ddp_comm_hook_script_on_two_cpu_processes(capfd):
    from accel.test_utils.scripts import test_ddp_comm_hook

    debug_launcher(test_ddp_comm_hook.main, num_processes=2)
    out = capfd.readouterr().out
    for hook in ("no", "fp16", "power_sgd", "batched_power_sgd"):
        assert f"test_ddp_comm_hook: {hook} on 2 processes" in out


def test_ddp_comm_hook_script_needs_two_processes():
    from accel.test_utils.scripts import test_ddp_comm_hook

    with pytest.raises(Exception):
        debug_launcher(test_ddp_comm_hook.main, num_processes=1)
