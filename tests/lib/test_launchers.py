"""notebook_launcher and debug_launcher: real CPU workers that form a gloo group; results via files."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from accel.backends import reset_registry
from accel.launchers import debug_launcher, notebook_launcher
from accel.state import AcceleratorState, GradientState, PartialState
from _waits import SAFETY_NET_S
from dist_utils import free_port


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    for name in ("ACCEL_DEVICE", "ACCEL_MIXED_PRECISION", "ACCEL_USE_CPU", "GLOO_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCEL_DEVICE", "cpu")  # the workers fork: keep every device runtime out of it
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    reset_registry()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    reset_registry()


def report(out_dir: str, tag: str) -> None:
    """Worker body: join the group through accel's state, all-reduce, write what was seen."""
    state = PartialState()
    total = torch.tensor([float(state.process_index + 1)])
    dist.all_reduce(total)
    record = {
        "tag": tag,
        "rank": state.process_index,
        "world": state.num_processes,
        "local_rank": state.local_process_index,
        "sum": total.item(),
        "precision": os.environ.get("ACCEL_MIXED_PRECISION"),
        "use_cpu": os.environ.get("ACCEL_USE_CPU"),
        "fork_launched": os.environ.get("FORK_LAUNCHED"),
    }
    Path(out_dir, f"{tag}{state.process_index}.json").write_text(json.dumps(record))


def rank1_fails(pid_file: str | None = None) -> None:
    """Rank 1 raises; rank 0 sleeps far past any test's wait (it must be stopped, not waited for).

    With ``pid_file``, rank 0 writes its pid there first and rank 1 raises only once it is written.
    """
    if int(os.environ["RANK"]) == 1:
        while pid_file and not os.path.exists(pid_file):
            time.sleep(0.05)
        raise ValueError("boom in rank 1")
    if pid_file:
        Path(pid_file + ".part").write_text(str(os.getpid()))
        os.replace(pid_file + ".part", pid_file)
    time.sleep(3600)


FAILED_ATTEMPTS = 2  # rank 1 fails the first two attempts once the group formed; the third must work


def fails_then_reports(out_dir: str) -> None:
    """Worker body for max_restarts: fails FAILED_ATTEMPTS attempts after forming the group, then records what it saw."""
    attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
    if attempt > 0 and rank == 0:
        time.sleep(1.0)  # the others reach the store first: they must wait for this attempt's rank 0, not use the last one's
    state = PartialState(timeout=timedelta(seconds=20))
    total = torch.tensor([float(state.process_index + 1)])
    dist.all_reduce(total)
    if attempt < FAILED_ATTEMPTS:
        if rank == 1:
            raise ValueError(f"attempt {attempt} fails")
        time.sleep(30)  # the agent stops it
    record = {"rank": state.process_index, "world": state.num_processes, "sum": total.item(), "attempt": attempt}
    Path(out_dir, f"again{state.process_index}.json").write_text(json.dumps(record))


def records(tmp_path: Path, tag: str) -> dict[int, dict]:
    return {json.loads(p.read_text())["rank"]: json.loads(p.read_text()) for p in tmp_path.glob(f"{tag}*.json")}


def test_signatures_match_accelerate():
    assert list(inspect.signature(notebook_launcher).parameters) == [
        "function", "args", "num_processes", "mixed_precision", "use_port", "master_addr", "node_rank", "num_nodes",
        "rdzv_backend", "rdzv_endpoint", "rdzv_conf", "rdzv_id", "max_restarts", "monitor_interval", "log_line_prefix_template",
    ]
    params = inspect.signature(notebook_launcher).parameters
    assert (params["use_port"].default, params["rdzv_backend"].default, params["monitor_interval"].default) == ("29500", "static", 0.1)
    debug_params = inspect.signature(debug_launcher).parameters
    assert [(p.name, p.default) for p in debug_params.values()] == [("function", inspect.Parameter.empty), ("args", ()), ("num_processes", 2)]


def test_debug_launcher_runs_the_function_in_two_cpu_processes(tmp_path):
    debug_launcher(report, args=(str(tmp_path), "dbg"))
    got = records(tmp_path, "dbg")
    assert sorted(got) == [0, 1]
    for rank, rec in got.items():
        assert (rec["world"], rec["local_rank"], rec["sum"]) == (2, rank, 3.0)
        assert rec["use_cpu"] == "true" and rec["fork_launched"] == "1"
    assert not PartialState._shared_state  # the parent's state was not touched


def test_debug_launcher_with_three_processes(tmp_path):
    debug_launcher(report, args=(str(tmp_path), "three"), num_processes=3)
    got = records(tmp_path, "three")
    assert sorted(got) == [0, 1, 2] and {r["sum"] for r in got.values()} == {6.0}


@pytest.mark.timeout(SAFETY_NET_S)  # waiting for the sleeping rank would outlast this
def test_debug_launcher_reports_the_failing_rank(tmp_path):
    pid_file = tmp_path / "rank0.pid"
    with pytest.raises(Exception, match="boom in rank 1") as info:
        debug_launcher(rank1_fails, args=(str(pid_file),))
    assert "Process 1" in str(info.value)
    rank0 = int(pid_file.read_text())
    try:  # the sleeping rank was ended (it is gone, or a zombie left for its reaper)
        with open(f"/proc/{rank0}/stat") as handle:
            assert handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        pass


def test_notebook_launcher_runs_two_workers_with_the_precision(tmp_path, capsys):
    notebook_launcher(report, args=(str(tmp_path), "nb"), num_processes=2, mixed_precision="bf16", use_port=free_port())
    got = records(tmp_path, "nb")
    assert sorted(got) == [0, 1]
    for rank, rec in got.items():
        assert (rec["world"], rec["local_rank"], rec["sum"]) == (2, rank, 3.0)
        assert rec["precision"] == "bf16" and rec["fork_launched"] == "1"
    assert "Launching training on 2 CPUs." in capsys.readouterr().out
    assert "ACCEL_MIXED_PRECISION" not in os.environ  # the parent's environment is restored


def test_notebook_launcher_with_one_process_runs_here(monkeypatch):
    seen = []
    notebook_launcher(lambda x: seen.append((x, os.getpid(), os.environ.get("ACCEL_MIXED_PRECISION"))), args=(7,),
                      num_processes=1, mixed_precision="fp16")
    assert seen == [(7, os.getpid(), "fp16")]


def test_notebook_launcher_failure_names_the_rank():
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    with pytest.raises(ChildFailedError) as info:
        notebook_launcher(rank1_fails, num_processes=2, use_port=free_port())
    rank, failure = info.value.get_first_failure()
    assert rank == 1 and failure.exitcode == 1
    assert "boom in rank 1" in str(info.value)


@pytest.mark.timeout(SAFETY_NET_S)  # a rank that hung on a failed attempt's address would outlast this
def test_notebook_launcher_restarts_failed_attempts(tmp_path):
    # a restarted attempt shares the agent's store with the failed ones: it must not meet their gloo addresses (it
    # did: each pair of ranks then hung or was refused about two times in three; three ranks, two restarts catch it).
    # A refused connection would fail one more attempt than the restarts allow
    notebook_launcher(fails_then_reports, args=(str(tmp_path),), num_processes=3, max_restarts=FAILED_ATTEMPTS,
                      use_port=free_port())
    got = records(tmp_path, "again")
    assert sorted(got) == [0, 1, 2]
    assert {(rec["world"], rec["sum"], rec["attempt"]) for rec in got.values()} == {(3, 6.0, FAILED_ATTEMPTS)}


# slow (nightly): test_notebook_launcher_restarts_failed_attempts covers the restarts through the same elastic
# agent, static store and per-attempt group, tests/lib/launch/test_launch.py::test_plan_passes_max_restarts_to_torch_elastic_with_the_static_rendezvous
# that accel launch hands --max_restarts to it
@pytest.mark.slow
def test_accel_launch_restarts_failed_attempts(tmp_path):
    # `accel launch --max_restarts` runs torchrun's static rendezvous: the same shared store as notebook_launcher
    script = tmp_path / "restarting.py"
    script.write_text(
        "import sys\n"
        "from tests.lib.test_launchers import fails_then_reports\n"
        "fails_then_reports(sys.argv[1])\n"
    )
    tests = Path(__file__).resolve().parents[1]  # the checkout (for this module) and the tests' helpers
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCEL_DEVICE="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [str(tests.parent), str(tests / "support"),
                                                        os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "accel.commands.cli", "launch", "--cpu", "--num_processes", "3",
               "--max_restarts", str(FAILED_ATTEMPTS), str(script), str(tmp_path)]
    proc = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=SAFETY_NET_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the agent and its workers: a hung restart must not outlive the test
        output, _ = proc.communicate()
        pytest.fail(f"accel launch --max_restarts hung:\n{output[-3000:]}")
    assert proc.returncode == 0, output[-3000:]
    got = records(tmp_path, "again")
    assert sorted(got) == [0, 1, 2]
    assert {(rec["world"], rec["sum"], rec["attempt"]) for rec in got.values()} == {(3, 6.0, FAILED_ATTEMPTS)}
    assert f"attempt {FAILED_ATTEMPTS - 1} fails" in output and f"attempt {FAILED_ATTEMPTS} fails" not in output


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({}, ValueError, "specify the number of processes"),
        ({"num_processes": 2, "mixed_precision": "fp32"}, ValueError, "Unknown mixed_precision mode"),
        ({"num_processes": 2, "node_rank": 1, "num_nodes": 1}, ValueError, "node_rank must be less than the number of nodes"),
        ({"num_processes": 0}, ValueError, "at least 1"),
    ],
)
def test_notebook_launcher_argument_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        notebook_launcher(report, **kwargs)


def test_launchers_refuse_a_parent_with_state_or_a_process_group(tmp_path):
    PartialState()  # single process: no group, but the state exists
    with pytest.raises(ValueError, match="only be created inside your training function"):
        notebook_launcher(report, args=(str(tmp_path), "x"), num_processes=2, use_port=free_port())
    AcceleratorState._reset_state(reset_partial_state=True)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="already has a torch.distributed process group"):
            debug_launcher(report, args=(str(tmp_path), "x"))
        with pytest.raises(RuntimeError, match="already has a torch.distributed process group"):
            notebook_launcher(report, args=(str(tmp_path), "x"), num_processes=2, use_port=free_port())
    finally:
        dist.destroy_process_group()
    assert not list(tmp_path.glob("x*.json"))  # nothing ran


def test_notebook_launcher_refuses_a_port_another_program_listens_on(tmp_path):
    """A listener that is not the store (gloo's, a stray server) would make the workers wait forever."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", int(free_port())))
        holder.listen()
        port = str(holder.getsockname()[1])
        with pytest.raises(ConnectionError, match=f"port {port} on 127.0.0.1 is already taken.*another use_port"):
            notebook_launcher(report, args=(str(tmp_path), "taken"), num_processes=2, use_port=port)
    assert not records(tmp_path, "taken")  # no worker started
