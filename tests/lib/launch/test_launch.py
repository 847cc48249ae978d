"""`accel launch`: real multi-rank launches through torch elastic, plus the checks made before start.

Real launches run `python -m accel.commands.cli launch ...` in a subprocess (the elastic agent
installs signal handlers and forks, which a pytest process should not host); the ranks write what
they saw into files under tmp_path. Validation and the launch plan are checked in-process: they
finish before anything would start.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _fake_backend import NoDevice

from accel.backends import Availability, Backend, Capability, get_backend, register_backend, reset_registry
from accel.commands import cli
from accel.commands import launch as launch_command
from accel.launch.network import loopback_interface
from accel.launch.plan import LaunchPlan
from _waits import SAFETY_NET_S
from dist_utils import free_port

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
REPORT = SCRIPTS / "report_rank.py"
FAIL = SCRIPTS / "fail_rank.py"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No user config or device override leaks in; the default config path points into tmp."""
    for name in ("ACCEL_DEVICE", "ACCEL_CONFIG_FILE", "ACCEL_USE_CPU", "ACCEL_MIXED_PRECISION", "GLOO_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    reset_registry()
    yield
    reset_registry()


def launch(args: list[str], tmp_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    full_env = dict(os.environ)
    full_env.update(
        ACCEL_TEST_OUT=str(out),
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "accel.commands.cli", "launch", *args],
        capture_output=True, text=True, timeout=SAFETY_NET_S, env=full_env, cwd=cwd or tmp_path,
    )


def rank_records(tmp_path: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("rank*.json"))}


def parse(argv: list[str]):
    parser = cli.build_parser(load="launch")
    return parser.parse_args(["launch", *argv])


def plan_for(argv: list[str]) -> LaunchPlan:
    return launch_command.build_plan(parse(argv))


# ---------------------------------------------------------------------------- real launches
def test_cpu_two_processes_start_two_ranks_that_form_a_group(tmp_path):
    result = launch(["--cpu", "--num_processes", "2", "--mixed_precision", "bf16", str(REPORT), "a", "--b", "c", "--collective"], tmp_path)
    assert result.returncode == 0, result.stderr
    ranks = rank_records(tmp_path)
    assert sorted(ranks) == [0, 1]  # two processes, not one (Accelerate's pitfall)
    for rank, rec in ranks.items():
        assert rec["world_size"] == 2 and rec["local_rank"] == rank
        assert rec["argv"] == ["a", "--b", "c", "--collective"]  # script flags are not eaten by the launcher
        assert rec["state_world"] == 2 and rec["state_rank"] == rank
        assert rec["distributed_type"].endswith("MULTI_CPU") and rec["comm"] == "gloo"
        assert rec["all_reduce"] == 3.0  # 1 + 2: the collective really spans both ranks
        assert rec["env"]["ACCEL_USE_CPU"] == "true"
        assert rec["env"]["ACCEL_MIXED_PRECISION"] == "bf16"
        assert rec["env"]["ACCEL_DEVICE"] == "cpu"
        assert rec["env"]["MASTER_ADDR"] == "127.0.0.1"
        assert rec["env"]["GLOO_SOCKET_IFNAME"] == loopback_interface()
        assert rec["name"] == "__main__" and rec["path0"] == str(SCRIPTS)  # like `python script.py`
        # the script left its group open; the bootstrap closed it (a live gloo group can abort the exit)
        assert (tmp_path / "out" / f"rank{rank}.exit").read_text() == "closed"


def test_config_file_is_honoured_and_a_flag_overrides_it_and_module_mode_runs_a_module_as_main(tmp_path):
    """A config file found through the environment decides the run; here it runs a module (``-m``), which
    each rank runs as ``__main__`` with its own flags. A flag then overrides the file (the plan the launcher
    hands the ranks: test_flags_override_the_config_file_which_overrides_defaults for every setting)."""
    config = tmp_path / "two.yaml"
    config.write_text("num_processes: 2\nuse_cpu: true\nmixed_precision: fp16\ndebug: true\n")
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "entry.py").write_text(REPORT.read_text())
    result = launch(["-m", "mypkg.entry", "--x", "1"], tmp_path, env={"ACCEL_CONFIG_FILE": str(config)}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    ranks = rank_records(tmp_path)
    assert sorted(ranks) == [0, 1]
    assert {r["env"]["ACCEL_MIXED_PRECISION"] for r in ranks.values()} == {"fp16"}
    assert {r["env"]["ACCEL_DEBUG_MODE"] for r in ranks.values()} == {"true"}
    assert all(r["name"] == "__main__" and r["argv"] == ["--x", "1"] for r in ranks.values())

    plan = plan_for(["--config_file", str(config), "--num-processes", "1", "--mixed_precision", "no", str(REPORT)])
    assert plan.nproc_per_node == 1
    assert plan.env["ACCEL_MIXED_PRECISION"] == "no"
    assert plan.env["ACCEL_USE_CPU"] == "true"  # still from the file


def test_a_rank_that_raises_fails_the_launch_with_its_traceback(tmp_path):
    result = launch(["--cpu", "--num_processes", "2", str(FAIL), "raise"], tmp_path)
    assert result.returncode == 1  # the exit status of a Python process killed by an exception
    err = result.stderr
    assert "accel launch: rank 1 (local rank 1" in err and "failed with exit code 1" in err
    summary = err[err.index("accel launch: rank 1"):]
    assert "ValueError: boom from rank 1" in summary
    assert 'fail_rank.py", line' in summary and "explode()" in summary  # the end of the traceback
    assert "launch.py" not in summary  # the bootstrap's own frames are left out
    assert "also stopped: rank 0" in summary  # rank 0 (sleeping 60 s) was ended, not waited for


def test_a_rank_exit_code_becomes_the_launch_exit_code(tmp_path):
    result = launch(["--cpu", "--num_processes", "2", str(FAIL), "exit:3"], tmp_path)
    assert result.returncode == 3, result.stderr
    assert "rank 1 (local rank 1" in result.stderr and "failed with exit code 3" in result.stderr
    assert "rank 1 exits on purpose" in result.stderr  # the rank's own output is passed through


def test_two_machines_on_loopback_form_one_group(tmp_path):
    """Two launchers (machine ranks 0 and 1) meet at --main_process_ip/--main_process_port."""
    port = free_port()
    common = ["--cpu", "--num_machines", "2", "--num_processes", "4", "--main_process_ip", "127.0.0.1",
              "--main_process_port", port, str(REPORT), "--collective"]
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, ACCEL_TEST_OUT=str(out), OMP_NUM_THREADS="1")
    second = subprocess.Popen([sys.executable, "-m", "accel.commands.cli", "launch", "--machine_rank", "1", *common],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = launch(["--machine_rank", "0", *common], tmp_path)
        _, second_err = second.communicate(timeout=SAFETY_NET_S)
    finally:
        if second.poll() is None:
            second.kill()
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second_err
    ranks = rank_records(tmp_path)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert {r["local_rank"] for r in ranks.values()} == {0, 1}
    assert all(r["state_world"] == 4 and r["all_reduce"] == 10.0 for r in ranks.values())


# ---------------------------------------------------------------------------- checks before start
def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    code = cli.main(["launch", *argv])
    return code, capsys.readouterr().err


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('should not run')\n")
    return path


def test_missing_script_is_a_usage_error_naming_the_path(tmp_path, capsys):
    missing = tmp_path / "nope" / "train.py"
    code, err = run_cli(["--cpu", "--num_processes", "2", str(missing)], capsys)
    assert code == 2
    assert err.strip() == f"accel launch: error: training script not found: {missing}"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cpu", "--num_processes", "0"], "--num_processes must be at least 1, got 0"),
        (["--cpu", "--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "10.0.0.1", "--num_processes", "2"],
         "--machine_rank must be from 0 to num_machines - 1 (1), got 2"),
        (["--cpu", "--num_machines", "2", "--num_processes", "2"], "needs --main_process_ip"),
        (["--cpu", "--num_machines", "2", "--num_processes", "3", "--main_process_ip", "10.0.0.1"], "must be a multiple of --num_machines (2)"),
        (["--backend", "nosuch"], "unknown backend 'nosuch'; known backends:"),
        (["--cpu", "--backend", "cuda"], "--cpu contradicts --backend cuda"),
        (["--cpu", "-m", "--no_python"], "--module and --no_python cannot be used together"),
        (["--cpu", "--num_processes", "two"], "invalid int value: 'two'"),
        (["--cpu", "--mixed_precision", "fp32"], "invalid choice: 'fp32'"),
        (["--cpu", "--max_restarts", "-1"], "--max_restarts must be 0 or more"),
        (["--config_file", "/no/such/config.yaml"], "config file not found: /no/such/config.yaml"),
    ],
)
def test_invalid_combinations_are_one_line_usage_errors(argv, message, script, capsys):
    code, err = run_cli([*argv, str(script)], capsys)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("accel launch: error:")


def test_an_unavailable_backend_gets_the_registry_reason(script, capsys):
    code, err = run_cli(["--backend", "mps", str(script)], capsys)
    assert code == 2
    assert "backend 'mps'" in err and "not available" in err


def test_a_broken_config_file_is_a_usage_error_with_file_and_line(tmp_path, script, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("use_cpu: true\nnum_proceses: 2\n")
    code, err = run_cli(["--config_file", str(config), str(script)], capsys)
    assert code == 2
    assert f"config file {config}, line 2: unknown key 'num_proceses' (did you mean 'num_processes'?)" in err


def test_a_busy_port_is_refused_before_start(script, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run_cli(["--cpu", "--main_process_port", str(port), str(script)], capsys)
    assert code == 2 and f"port {port} on 127.0.0.1 is in use" in err


class _FakeBackend(NoDevice, Backend):
    """A registered backend that exists only for the launch plan (no device is touched)."""

    device_type = "fakedev"
    distributed_type = "MULTI_GPU"
    priority = 5
    comm: str | None = "gloo"
    count = 4
    fp16 = True

    def _probe(self) -> Availability:
        return Availability(True, "fake device for launch tests")

    def device_count(self) -> int:
        return self.count

    @property
    def comm_backend(self) -> str | None:
        return self.comm

    def comm_backend_reason(self) -> str:
        return "" if self.comm else "fakedev has no collective backend: single process only"

    def amp_capability(self, dtype: torch.dtype) -> Capability:
        if dtype == torch.float16 and not self.fp16:
            return Capability(False, "fakedev has no fp16 autocast")
        return Capability(True, "fake")


class SoloBackend(_FakeBackend):
    name = "solo"
    comm = None
    count = 1


class MultiBackend(_FakeBackend):
    name = "multi"
    visible_devices_env = "FAKEDEV_VISIBLE_DEVICES"
    comm = "fakeccl"
    probes: list = []

    def amp_capability(self, dtype: torch.dtype) -> Capability:
        self.probes.append(dtype)  # on a real device this would run a kernel in the launcher
        return super().amp_capability(dtype)


class HostNoFp16Backend(_FakeBackend):
    name = "hostnofp16"
    device_type = "cpu"
    count = 1
    fp16 = False


@pytest.fixture
def fake_backends():
    for backend in (SoloBackend, MultiBackend, HostNoFp16Backend):
        register_backend(backend, replace=True)
    yield
    reset_registry()


def test_several_processes_on_a_single_process_backend_is_refused(fake_backends, script, capsys):
    code, err = run_cli(["--backend", "solo", "--num_processes", "2", str(script)], capsys)
    assert code == 2
    assert "backend 'solo' cannot run 2 processes: fakedev has no collective backend" in err
    plan = plan_for(["--backend", "solo", str(script)])  # one process is fine
    assert plan.num_processes == 1 and plan.env["ACCEL_DEVICE"] == "solo"


def test_gpu_ids_map_onto_the_backends_visible_devices_variable(fake_backends, script):
    plan = plan_for(["--backend", "multi", "--gpu_ids", "2, 0", str(script)])
    assert plan.env["FAKEDEV_VISIBLE_DEVICES"] == "2,0"
    assert plan.nproc_per_node == 2  # one process per listed device
    assert plan.env["ACCEL_DEVICE"] == "multi" and plan.env["ACCEL_USE_CPU"] == "false"
    assert "GLOO_SOCKET_IFNAME" not in plan.env  # only gloo (CPU) runs are pinned to loopback
    assert plan_for(["--backend", "multi", str(script)]).nproc_per_node == 4  # default: every device


def test_fp16_on_a_backend_without_fp16_is_a_warning_not_an_error(fake_backends, script, capsys):
    plan = plan_for(["--backend", "hostnofp16", "--mixed_precision", "fp16", str(script)])
    assert any("fp16" in w and "fakedev has no fp16 autocast" in w for w in plan.warnings)
    assert plan.env["ACCEL_MIXED_PRECISION"] == "fp16"
    assert not plan_for(["--backend", "hostnofp16", "--mixed_precision", "bf16", str(script)]).warnings


def test_device_backends_are_not_probed_in_the_launcher(fake_backends, script):
    MultiBackend.probes.clear()
    plan = plan_for(["--backend", "multi", "--mixed_precision", "fp16", str(script)])
    assert plan.env["ACCEL_MIXED_PRECISION"] == "fp16"
    assert MultiBackend.probes == []  # no kernel on device 0 from the launcher process


def test_plan_passes_max_restarts_to_torch_elastic_with_the_static_rendezvous(script):
    args = plan_for(["--cpu", "--num_processes", "3", "--max_restarts", "2", str(script)]).torchrun_args
    assert args[args.index("--max-restarts") + 1] == "2" and args[args.index("--rdzv-backend") + 1] == "static"
    args = plan_for(["--cpu", str(script)]).torchrun_args
    assert args[args.index("--max-restarts") + 1] == "0"


def test_plan_for_a_single_node_cpu_run(script, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    plan = plan_for(["--cpu", "--num-processes", "2", str(script), "--num_processes", "7", "--cpu"])
    args = plan.torchrun_args
    assert args[args.index("--nproc-per-node") + 1] == "2" and args[args.index("--nnodes") + 1] == "1"
    assert args[args.index("--master-addr") + 1] == "127.0.0.1"
    port = int(args[args.index("--master-port") + 1])
    assert 0 < port < 65536
    assert args[-4:] == [str(script), "--num_processes", "7", "--cpu"]  # the script's own flags, untouched
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert plan.env["OMP_NUM_THREADS"] == str(max(cores // 2, 1))
    assert plan.env["GLOO_SOCKET_IFNAME"] == loopback_interface()
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert "OMP_NUM_THREADS" not in plan_for(["--cpu", str(script)]).env  # a user's setting is kept


def test_flags_override_the_config_file_which_overrides_defaults(tmp_path, script, monkeypatch):
    config = tmp_path / "cfg.yaml"
    config.write_text("num_processes: 2\nuse_cpu: true\nmixed_precision: bf16\nmain_process_port: 0\n")
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(config))
    from_file = plan_for([str(script)])
    assert (from_file.nproc_per_node, from_file.mixed_precision, from_file.backend) == (2, "bf16", "cpu")
    flagged = plan_for(["--num_processes", "1", str(script)])
    assert (flagged.nproc_per_node, flagged.mixed_precision) == (1, "bf16")
    monkeypatch.delenv("ACCEL_CONFIG_FILE")
    default = plan_for([str(script)])  # no file at the default path: defaults (the detected backend)
    assert (default.mixed_precision, default.backend) == ("no", get_backend().name)
    if default.backend == "cpu":
        assert default.nproc_per_node == 1


def test_multi_node_plan_uses_the_main_process_address(script):
    plan = plan_for(["--cpu", "--num_machines", "2", "--machine_rank", "1", "--num_processes", "4",
                     "--main_process_ip", "10.1.2.3", str(script)])
    args = plan.torchrun_args
    assert plan.nproc_per_node == 2 and args[args.index("--node-rank") + 1] == "1"
    assert args[args.index("--rdzv-endpoint") + 1] == "10.1.2.3:29500"
    assert "GLOO_SOCKET_IFNAME" not in plan.env  # not a loopback run
