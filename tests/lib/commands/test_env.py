"""`accel env` and the CLI skeleton: real registry, real probes, output parsed and checked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _fake_backend import NoDevice

import accel
from accel.backends import Availability, Backend, register_backend, reset_registry
from accel import sysinfo
from accel.commands import cli, env as env_command
from accel.launch.config_file import config_file_in_use, default_config_path
from _waits import SAFETY_NET_S

TOP_LEVEL_KEYS = {
    "schema_version",
    "accel",
    "torch",
    "python",
    "platform",
    "cpu",
    "packages",
    "backends",
    "selected_backend",
    "distributed",
    "deepspeed",
    "plugins",
    "environment_variables",
    "config_file",
 "run_plan",}

SECTIONS = (
    "accel",
    "torch",
    "python",
    "platform",
    "cpu",
    "packages",
    "backends (probe order)",
    "backend cpu",
    "distributed",
    "deepspeed",
    "plug-ins",
    "environment variables",
    "config file",
)


pytestmark = pytest.mark.usefixtures("clean_environment")


class AbsentBackend(NoDevice, Backend):
    """An extra backend that is never present; registered in-process like a plug-in would be."""

    name = "absent"
    device_type = "absent"
    priority = 500

    def _probe(self) -> Availability:
        return Availability(False, "no absent device on this machine")


class BrokenBackend(NoDevice, Backend):
    """Claims to be available but fails when asked about its devices."""

    name = "broken"
    device_type = "broken"
    priority = 2000  # after cpu, so it is never the selected backend

    def _probe(self) -> Availability:
        return Availability(True, "claims to be here")

    def device_count(self) -> int:
        raise RuntimeError("driver exploded")


def run_env(capsys, *extra: str, expect: int = 0) -> dict:
    code = cli.main(["env", "--json", *extra])
    out, err = capsys.readouterr()
    assert code == expect, err
    return json.loads(out)


def backend_named(data: dict, name: str) -> dict:
    matches = [b for b in data["backends"] if b["name"] == name]
    assert len(matches) == 1, [b["name"] for b in data["backends"]]
    return matches[0]


@pytest.fixture(autouse=True)
def deepspeed_not_asked(request, monkeypatch):
    """Asking DeepSpeed costs a child process per environment; only the DeepSpeed test here does it."""
    if "asks_deepspeed" in request.keywords:
        return
    from accel.backends import deepspeed_agreement

    monkeypatch.setattr(deepspeed_agreement, "probe_deepspeed", lambda *a, **k: {"installed": False})


@pytest.mark.asks_deepspeed
def test_env_shows_deepspeeds_choice_next_to_accels(capsys, monkeypatch, tmp_path):
    from _deepspeed_fake import install_fake_deepspeed

    install_fake_deepspeed(tmp_path, monkeypatch)
    monkeypatch.setenv("ACCEL_DEVICE", "cpu")
    info = run_env(capsys)["deepspeed"]
    assert info["device"] == "cuda" and info["version"] == "9.9.9"  # the fake picks cuda unless told
    assert info["agreement"]["agree"] is False and "accel uses 'cpu'" in info["agreement"]["problems"][0]
    assert cli.main(["env"]) == 0
    text = capsys.readouterr().out
    assert "DISAGREES with accel" in text and "DS_ACCELERATOR=cpu" in text
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert run_env(capsys)["deepspeed"]["agreement"]["agree"] is True
    quick = env_command.collect_environment(include_deepspeed=False)["deepspeed"]
    assert quick == {"installed": True, "asked": False}


def test_json_has_stable_top_level_keys_and_versions(capsys):
    data = run_env(capsys)
    assert set(data) == TOP_LEVEL_KEYS
    assert data["schema_version"] == env_command.SCHEMA_VERSION
    assert data["accel"]["version"] == accel.__version__
    import torch

    assert data["torch"]["version"] == torch.__version__
    assert data["torch"]["build"] == env_command.torch_build(torch.version)
    assert data["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert data["cpu"]["logical_cores"] == os.cpu_count()
    import numpy

    assert data["packages"]["numpy"] == numpy.__version__
    assert set(data["distributed"]["backends"]) == set(sysinfo.COLLECTIVES)
    assert data["distributed"]["backends"]["gloo"] is True  # the CPU wheel ships gloo
    assert isinstance(data["distributed"]["oneccl_bindings_for_pytorch"], bool)


def test_torch_build_names_the_accelerator_toolkit():
    class Versions:
        cuda = None
        hip = None
        xpu = None

    plain = Versions()
    assert env_command.torch_build(plain) == "cpu"
    plain.cuda = "12.4"
    assert env_command.torch_build(plain) == "CUDA 12.4"
    plain.cuda, plain.hip = None, "6.2.41133"
    assert env_command.torch_build(plain) == "ROCm 6.2.41133"
    plain.hip, plain.xpu = None, "20250101"
    assert env_command.torch_build(plain) == "XPU 20250101"


def test_backends_follow_probe_order_and_cpu_is_available(capsys):
    from accel.backends import get_registry

    data = run_env(capsys)
    assert [b["name"] for b in data["backends"]] == get_registry().names()
    cpu = backend_named(data, "cpu")
    assert cpu["available"] is True
    assert cpu["device_count"] == 1
    assert cpu["comm_backend"] == "gloo"
    assert cpu["devices"][0]["index"] == 0 and cpu["devices"][0]["name"]
    assert cpu["capabilities"]["multiprocess"]["supported"] is True
    assert data["selected_backend"]["error"] is None
    assert data["selected_backend"]["source"] == "detected"
    assert data["selected_backend"]["name"] == get_registry().select().name


def test_unavailable_backends_carry_a_reason(capsys):
    register_backend(AbsentBackend)
    data = run_env(capsys)
    absent = backend_named(data, "absent")
    assert absent["available"] is False
    assert absent["reason"] == "no absent device on this machine"
    assert "devices" not in absent
    unavailable = [b for b in data["backends"] if not b["available"]]
    assert unavailable
    for info in unavailable:
        assert isinstance(info["reason"], str) and info["reason"].strip(), info


def test_unknown_accel_device_is_reported_not_raised(capsys, monkeypatch):
    monkeypatch.setenv("ACCEL_DEVICE", "bogus")
    reset_registry()
    data = run_env(capsys, expect=2)
    selected = data["selected_backend"]
    assert selected["name"] is None
    assert selected["source"] == "ACCEL_DEVICE"
    assert "unknown backend 'bogus'" in selected["error"]
    assert "cpu" in selected["error"]  # the message lists the known names
    assert data["environment_variables"]["ACCEL_DEVICE"] == "bogus"
    assert backend_named(data, "cpu")["available"] is True  # everything else still reported

    assert cli.main(["env"]) == 2
    text, err = capsys.readouterr()
    selected_line = next(line for line in text.splitlines() if line.strip().startswith("selected"))
    assert "error: unknown backend 'bogus'" in selected_line
    assert err.splitlines()[0].startswith("accel env: error: unknown backend 'bogus'")


def test_unavailable_accel_device_shows_why(capsys, monkeypatch):
    register_backend(AbsentBackend)
    monkeypatch.setenv("ACCEL_DEVICE", "absent")
    selected = run_env(capsys, expect=2)["selected_backend"]
    assert selected["name"] is None
    assert "not available" in selected["error"]
    assert "no absent device on this machine" in selected["error"]
    # the reason is the first line (on stderr) and the exit status says something is wrong
    assert cli.main(["env"]) == 2
    out, err = capsys.readouterr()
    first = err.splitlines()[0]
    assert first.startswith("accel env: error: backend 'absent'") and "no absent device on this machine" in first
    assert first.endswith("(from ACCEL_DEVICE)")
    assert "selected" in out  # the whole report still prints


def test_accel_device_override_is_selected(capsys, monkeypatch):
    monkeypatch.setenv("ACCEL_DEVICE", "CPU")
    selected = run_env(capsys)["selected_backend"]
    assert selected == {"name": "cpu", "source": "ACCEL_DEVICE", "note": None, "error": None}


def test_one_failing_probe_does_not_take_the_command_down(capsys, monkeypatch):
    register_backend(BrokenBackend)

    def no_model() -> str:
        raise OSError("cpuinfo unreadable")

    monkeypatch.setattr(sysinfo, "_cpu_model", no_model)
    data = run_env(capsys)
    broken = backend_named(data, "broken")
    assert "driver exploded" in broken["error"]
    assert broken["available"] is True
    assert data["cpu"]["model"] == {"error": "OSError: cpuinfo unreadable"}
    assert data["cpu"]["logical_cores"] == os.cpu_count()
    assert backend_named(data, "cpu")["available"] is True

    assert cli.main(["env"]) == 0
    text = capsys.readouterr().out
    assert "error: OSError: cpuinfo unreadable" in text
    assert "describe failed: RuntimeError: driver exploded" in text


def test_whole_section_failure_is_recorded(monkeypatch):
    def broken_registry():
        raise ImportError("torch is broken")

    monkeypatch.setattr(sysinfo, "_load_registry", broken_registry)
    data = env_command.collect_environment()
    assert "torch is broken" in data["backends"]["error"]
    assert "torch is broken" in data["selected_backend"]["error"]
    assert data["config_file"]["exists"] is False  # unrelated sections still filled
    text = env_command.render_text(data)
    assert "torch is broken" in text


def test_config_file_path_follows_accel_config_file(capsys, monkeypatch, tmp_path):
    target = tmp_path / "my config.yaml"
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(target))
    assert default_config_path() == target
    data = run_env(capsys)
    assert data["config_file"] == {"path": str(target), "exists": False}
    assert data["environment_variables"]["ACCEL_CONFIG_FILE"] == str(target)

    target.write_text("compute_environment: LOCAL_MACHINE\nnum_processes: 2\nuse_cpu: true\n")
    assert config_file_in_use() == (target, True)
    section = run_env(capsys)["config_file"]
    assert (section["path"], section["exists"]) == (str(target), True)
    assert section["contents"]["num_processes"] == 2 and section["contents"]["use_cpu"] is True


def test_env_config_file_option_prints_the_contents_or_the_problem(capsys, tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n")
    assert cli.main(["env", "--config_file", str(config)]) == 0
    out = capsys.readouterr().out
    section = out[out.index("config file"):]
    assert str(config) in section and "distributed_type" in section and "FSDP" in section and "fsdp_version=2" in section
    config.write_text("num_proceses: 2\n")
    assert cli.main(["env", "--config_file", str(config)]) == 0
    assert "unknown key 'num_proceses' (did you mean 'num_processes'?)" in capsys.readouterr().out
    assert cli.main(["env", "--config_file", str(tmp_path / "none.yaml")]) == 0
    assert f"no such file: {tmp_path / 'none.yaml'}" in capsys.readouterr().out


def test_env_module_has_a_which_to_patch(monkeypatch, capsys):
    import accel.commands.env as env_command_module

    monkeypatch.setattr(env_command_module, "which", lambda name: None)
    info = env_command_module.env_command(env_command_module.env_command_parser().parse_args([]))
    assert info["`accel` bash location"] == "Not found"
    monkeypatch.setattr(env_command_module, "which", lambda name: f"/opt/bin/{name}")
    assert env_command_module.env_command(env_command_module.env_command_parser().parse_args([]))["`accel` bash location"] == "/opt/bin/accel"


def test_default_config_path_uses_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_config_path() == tmp_path / "accel" / "default_config.yaml"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_config_path() == tmp_path / "home" / ".cache" / "accel" / "default_config.yaml"


def test_json_round_trips_only_plain_types(capsys):
    data = run_env(capsys)

    def walk(value):
        if isinstance(value, dict):
            assert all(isinstance(k, str) for k in value)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        else:
            assert value is None or isinstance(value, (bool, int, float, str)), repr(value)

    walk(data)
    assert sysinfo._jsonable({1: (2, {3}), "x": Path("/p")}) == {"1": [2, [3]], "x": "/p"}


def test_human_output_has_every_section_aligned(capsys):
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    positions = [lines.index(title) for title in SECTIONS]  # each title on a line of its own
    assert positions == sorted(positions)
    cpu_line = next(line for line in lines if line.startswith("  cpu "))
    assert "available: " in cpu_line and "not available" not in cpu_line
    # values start in one column: every top-level row has its value at the same offset
    version_row = next(line for line in lines if line.startswith("  version "))
    column = len(version_row) - len(version_row[2:].split(None, 1)[1])
    path_row = next(line for line in lines if line.startswith("  path "))
    assert path_row[column - 2 : column] == "  " and path_row[column] != " "
    assert not out.lstrip().startswith("{")


def test_bad_flag_is_one_line_exit_2(capsys):
    assert cli.main(["env", "--bogus"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert "accel env: error: unrecognized argument --bogus" in err
    assert "Traceback" not in err


def test_unknown_command_is_one_line_exit_2(capsys):
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "invalid choice: 'frobnicate'" in err


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "env" in capsys.readouterr().err


def test_help_and_version_return_0(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"accel {accel.__version__}"
    assert cli.main(["env", "--help"]) == 0
    assert "--json" in capsys.readouterr().out


def test_usage_error_from_a_command_is_one_line_exit_2(capsys, monkeypatch):
    from accel.commands import UsageError

    def bad_run(args):
        raise UsageError("--world-size must be positive, got -1")

    monkeypatch.setattr(env_command, "run", bad_run)
    assert cli.main(["env"]) == 2
    assert capsys.readouterr().err == "accel env: error: --world-size must be positive, got -1\n"


def test_every_command_module_has_the_interface():
    import importlib

    for name, (module_path, summary) in cli.COMMANDS.items():
        module = importlib.import_module(module_path)
        assert callable(module.add_arguments) and callable(module.run), name
        assert summary.strip(), name


def test_help_does_not_import_torch():
    code = "import sys; from accel.commands.cli import main; rc = main(['--help']); print('torch' in sys.modules, rc)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY_NET_S, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False 0"


def test_installed_console_script_runs(tmp_path):
    script = shutil.which("accel", path=str(Path(sys.executable).parent))
    cmd = [script] if script else [sys.executable, "-m", "accel.commands.cli"]
    env = {k: v for k, v in os.environ.items() if k not in ("ACCEL_DEVICE", "ACCEL_CONFIG_FILE")}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    proc = subprocess.run([*cmd, "env", "--json"], capture_output=True, text=True, timeout=SAFETY_NET_S, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert backend_named(data, "cpu")["available"] is True
    assert data["config_file"]["path"] == str(tmp_path / "accel" / "default_config.yaml")
    # the text form: test_human_output_has_every_section_aligned (in-process, cli.main) and tests/lib/launch/test_precedence.py's accel env runs (a subprocess)


def test_env_shows_the_run_plan_the_launcher_environment_asks_for(monkeypatch, clean_environment):
    from accel.commands.env import collect_environment, render_text

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    env = collect_environment(include_deepspeed=False)
    assert env["run_plan"]["strategy"] == "deepspeed" and env["run_plan"]["distributed_type"] == "DEEPSPEED"
    assert "ACCELERATE_USE_DEEPSPEED=true" in render_text(env)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert collect_environment(include_deepspeed=False)["run_plan"]["strategy"] == "ddp"
