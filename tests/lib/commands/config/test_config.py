"""`accel config` and the config file: defaults, flags, questions, broken files, atomic saves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accel.backends import get_backend
from accel.commands import cli
from accel.commands.config import config as config_command
from accel.launch.config_file import ConfigError, LaunchConfig, default_config_path, load_config, save_config
from _waits import SAFETY_NET_S

REPO = Path(__file__).resolve().parents[4]


pytestmark = pytest.mark.usefixtures("clean_environment")


def run_config(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(["config", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---------------------------------------------------------------------------- writing
def test_default_writes_the_default_for_the_detected_backend(capsys):
    path = default_config_path()
    assert not path.exists()
    code, out, _ = run_config(["default"], capsys)
    assert code == 0 and f"accel config saved at {path}" in out
    config = load_config(path)
    backend = get_backend()
    assert config.backend == backend.name and config.mixed_precision == "no"
    if backend.name == "cpu":
        assert (config.num_processes, config.use_cpu, config.distributed_type) == (1, True, "NO")
    else:
        assert config.num_processes == backend.device_count()


def test_default_does_not_overwrite_without_force(capsys):
    path = default_config_path()
    path.parent.mkdir(parents=True)
    path.write_text("num_processes: 3\nuse_cpu: true\n")
    code, _, err = run_config(["default"], capsys)
    assert code == 2 and "already exists; pass --force" in err
    assert load_config(path).num_processes == 3
    code, _, _ = run_config(["default", "--force", "--mixed_precision", "bf16"], capsys)
    assert code == 0
    assert load_config(path).mixed_precision == "bf16" and load_config(path).num_processes != 3


def test_accel_config_file_variable_chooses_where_to_write(tmp_path, monkeypatch, capsys):
    target = tmp_path / "elsewhere" / "mine.yaml"
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(target))
    code, out, _ = run_config(["default"], capsys)
    assert code == 0 and target.is_file() and str(target) in out
    assert not (tmp_path / "cache").exists()


def test_flags_write_without_asking(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda prompt="": pytest.fail(f"asked {prompt!r}"))
    target = tmp_path / "flags.yaml"
    code, _, err = run_config(
        ["--config_file", str(target), "--cpu", "--num_processes", "4", "--mixed-precision", "bf16", "--debug"], capsys
    )
    assert code == 0, err
    config = load_config(target)
    assert (config.num_processes, config.mixed_precision, config.use_cpu, config.backend) == (4, "bf16", True, "cpu")
    assert config.distributed_type == "MULTI_CPU" and config.debug is True


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_processes", "two"], "argument --num_processes: expected a whole number >= 1, got 'two'"),
        (["--mixed_precision", "fp32"], "expected one of no, fp16, bf16, fp8, got 'fp32'"),
        (["--cpu", "--num_machines", "2", "--num_processes", "2"], "need --main_process_ip"),
        (["--cpu", "--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "h"], "machine_rank: must be below num_machines (2)"),
        (["--backend", "nosuch"], "unknown backend 'nosuch'"),
        (["--cpu", "--backend", "cuda"], "--cpu contradicts backend 'cuda'"),
    ],
)
def test_bad_flags_are_usage_errors_and_write_nothing(argv, message, tmp_path, capsys):
    target = tmp_path / "never.yaml"
    code, _, err = run_config(["--config_file", str(target), *argv], capsys)
    assert code == 2 and message in err
    assert not target.exists()


# ---------------------------------------------------------------------------- questions
def answer_with(monkeypatch, answers: list[str]) -> list[str]:
    prompts: list[str] = []
    remaining = iter(answers)

    def fake_input(prompt: str = "") -> str:
        prompts.append(prompt)
        try:
            return next(remaining)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)
    monkeypatch.setattr(config_command, "_stdin_is_tty", lambda: True)
    return prompts


def test_questions_show_defaults_and_ask_again_after_a_bad_answer(tmp_path, monkeypatch, capsys):
    target = tmp_path / "asked.yaml"
    # backend, machines (bad, then good), processes (bad, then good), mixed precision (bad, then good), debug, strategy
    prompts = answer_with(monkeypatch, ["cpu", "zero", "", "0", "3", "fp32", "bf16", "", ""])
    code, out, err = run_config(["--config_file", str(target)], capsys)
    assert code == 0, err
    config = load_config(target)
    assert (config.backend, config.num_machines, config.num_processes, config.mixed_precision, config.debug) == ("cpu", 1, 3, "bf16", False)
    assert config.distributed_type == "MULTI_CPU"
    assert prompts[0].startswith("Which hardware backend") and prompts[0].endswith(f"[{get_backend().name}]: ")
    assert prompts[1].endswith("[1]: ") and prompts[2] == prompts[1]  # asked again after "zero"
    assert "expected a whole number >= 1, got 'zero'; please try again" in out
    assert "expected one of no, fp16, bf16, fp8, got 'fp32'" in out
    assert sum(p.startswith("How many processes") for p in prompts) == 2


def test_questions_for_several_machines(tmp_path, monkeypatch, capsys):
    target = tmp_path / "nodes.yaml"
    answer_with(monkeypatch, ["cpu", "2", "5", "1", "10.0.0.7", "", "c10d", "yes", "3", "4", "no", "n", "ddp"])
    code, out, err = run_config(["--config_file", str(target)], capsys)
    assert code == 0, err
    config = load_config(target)
    assert (config.num_machines, config.machine_rank, config.main_process_ip, config.main_process_port) == (2, 1, "10.0.0.7", 29500)
    assert (config.rdzv_backend, config.same_network, config.num_processes) == ("c10d", True, 4)
    assert "the rank must be below 2" in out and "multiple of the number of machines (2)" in out


def test_input_ending_early_writes_nothing(tmp_path, monkeypatch, capsys):
    target = tmp_path / "half.yaml"
    answer_with(monkeypatch, ["cpu"])
    code, _, err = run_config(["--config_file", str(target)], capsys)
    assert code == 2 and "input ended" in err
    assert not target.exists()


def test_without_a_terminal_and_without_flags_it_does_not_wait(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "accel.commands.cli", "config"],
        stdin=subprocess.PIPE, capture_output=True, text=True, timeout=SAFETY_NET_S, env=env,  # a pipe left open
    )
    assert result.returncode == 2
    assert "stdin is not a terminal" in result.stderr and "accel config default" in result.stderr
    assert not (tmp_path / "cache").exists()


# ---------------------------------------------------------------------------- show
def test_show_prints_the_file_in_use(tmp_path, monkeypatch, capsys):
    code, _, err = run_config(["show"], capsys)
    assert code == 1 and "no config file at" in err
    target = tmp_path / "shown.yaml"
    target.write_text("num_processes: 2\nuse_cpu: true\n")
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(target))
    code, out, _ = run_config(["show"], capsys)
    assert code == 0 and out == f"# {target}\nnum_processes: 2\nuse_cpu: true\n"


# ---------------------------------------------------------------------------- loading
def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, expected",
    [
        ("num_processes: 2\nmixed_precision: [bf16\nuse_cpu: true\n", ", line 3: YAML syntax error"),
        ("use_cpu: true\nnum_process: 2\n", ", line 2: unknown key 'num_process' (did you mean 'num_processes'?)"),
        ("use_cpu: true\n\nnum_processes: two\n", ", line 3: num_processes: expected a whole number >= 1, got 'two'"),
        ("mixed_precision: fp32\n", ", line 1: mixed_precision: expected one of no, fp16, bf16, fp8, got 'fp32'"),
        ("mixed_precision: bf61\n", "got 'bf61' (did you mean 'bf16'?)"),
        ("use_cpu: maybe\n", ", line 1: use_cpu: expected true or false, got 'maybe'"),
        ("num_machines: 2\nmachine_rank: 2\n", ", line 2: machine_rank: must be below num_machines (2), got 2"),
        ("num_processes: 2\nnum_processes: 3\n", ", line 2: num_processes: appears twice with different values (lines 1 and 2)"),
        ("num_processes: true\n", "num_processes: expected a whole number >= 1, got True"),
        ("gpu_ids: 0,0\n", "gpu_ids: lists a device twice"),
        ("- num_processes\n", "expected a mapping"),
        ("", "the file is empty"),
        ("fsdp_config: 3\n", "line 1: fsdp_config: expected a mapping of settings, got 3"),
    ],
)
def test_broken_files_name_the_file_line_and_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"config file {path}")
    assert expected in message


def test_values_are_normalised(tmp_path):
    config = load_config(write(tmp_path, "mixed_precision: no\ndistributed_type: multi_cpu\ngpu_ids: 1\nnum_processes: '4'\n"))
    # unquoted `no` is YAML's false; a lone index is an int
    assert (config.mixed_precision, config.distributed_type, config.gpu_ids, config.num_processes) == ("no", "MULTI_CPU", "1", 4)


@pytest.mark.parametrize("kind", ["DATA_PARALLEL", "model_parallel", "NO"])
def test_sagemaker_configs_take_sagemakers_distributed_types(tmp_path, kind):
    """As Accelerate's SageMakerDistributedType: DATA_PARALLEL and MODEL_PARALLEL under AMAZON_SAGEMAKER only."""
    text = f"compute_environment: AMAZON_SAGEMAKER\ndistributed_type: {kind}\nmixed_precision: 'no'\n"
    config = load_config(write(tmp_path, text))
    assert (config.compute_environment, config.distributed_type) == ("AMAZON_SAGEMAKER", kind.upper())
    assert load_config(save_config(config, tmp_path / "copy.yaml")) == config


@pytest.mark.parametrize("environment, kind, allowed", [
    ("LOCAL_MACHINE", "DATA_PARALLEL", "NO, MULTI_CPU"),
    ("AMAZON_SAGEMAKER", "MULTI_GPU", "NO, DATA_PARALLEL, MODEL_PARALLEL"),
])
def test_a_distributed_type_of_the_other_environment_is_refused(tmp_path, environment, kind, allowed):
    path = write(tmp_path, f"compute_environment: {environment}\ndistributed_type: {kind}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"line 2: distributed_type: with compute_environment {environment} expected one of {allowed}" in message
    assert f"got '{kind}'" in message


def test_an_accelerate_json_config_loads_and_keeps_its_other_keys(tmp_path):
    data = {
        "compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": "MULTI_CPU", "downcast_bf16": False,
        "enable_cpu_affinity": False, "machine_rank": 0, "main_training_function": "main", "mixed_precision": "no",
        "num_machines": 1, "num_processes": 2, "rdzv_backend": "static", "same_network": True,
        "tpu_use_cluster": False, "tpu_use_sudo": False, "use_cpu": True,
    }
    path = tmp_path / "accelerate.yaml"
    path.write_text(json.dumps(data, indent=2))
    config = load_config(path)
    assert (config.num_processes, config.use_cpu, config.distributed_type) == (2, True, "MULTI_CPU")
    assert config.extra == {"downcast_bf16": False, "enable_cpu_affinity": False, "tpu_use_cluster": False, "tpu_use_sudo": False}
    copy = save_config(config, tmp_path / "copy.yaml")
    assert load_config(copy) == config and load_config(copy).extra == config.extra


# ---------------------------------------------------------------------------- saving
def test_save_is_atomic_and_leaves_no_temp_files(tmp_path, monkeypatch):
    path = tmp_path / "cfg" / "default_config.yaml"
    save_config(LaunchConfig(num_processes=2, use_cpu=True), path)
    before = path.read_text()
    assert load_config(path).num_processes == 2

    def crash(src, dst):
        raise OSError("disk vanished")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk vanished"):
        save_config(LaunchConfig(num_processes=8, use_cpu=True), path)
    assert path.read_text() == before  # the old file is intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["default_config.yaml"]  # temp file removed


def test_save_refuses_an_invalid_config_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "cfg.yaml"
    save_config(LaunchConfig(num_processes=1), path)
    before = path.read_text()
    with pytest.raises(ConfigError, match="mixed_precision"):
        save_config(LaunchConfig(mixed_precision="fp32"), path)
    assert path.read_text() == before


def test_the_wizard_asks_for_deepspeed_and_writes_accelerates_keys(tmp_path, monkeypatch, capsys):
    target = tmp_path / "ds.yaml"
    # backend, machines, processes, precision, debug, strategy (bad, then good), config file, stage, optimizer, params,
    # zero3 init, 16-bit save, accumulation
    prompts = answer_with(monkeypatch, ["cpu", "", "2", "bf16", "", "megatron", "deepspeed", "none", "3", "cpu", "", "", "",
                                        "4"])
    code, out, err = run_config(["--config_file", str(target)], capsys)
    assert code == 0, err
    data = yaml.safe_load(target.read_text())
    assert data["distributed_type"] == "DEEPSPEED"
    assert data["deepspeed_config"] == {"zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "none",
                                        "zero3_init_flag": False, "zero3_save_16bit_model": True,
                                        "gradient_accumulation_steps": 4}
    assert "answer one of ddp, deepspeed, fsdp, not 'megatron'" in out
    assert any(p.startswith("ZeRO stage") for p in prompts)


def test_the_wizard_asks_for_fsdp_and_offers_the_current_answers(tmp_path, monkeypatch, capsys):
    target = tmp_path / "fsdp.yaml"
    answer_with(monkeypatch, ["cpu", "", "2", "", "", "fsdp", "2", "SIZE_BASED_WRAP", "1000", "no", "", "", "", "no"])
    assert run_config(["--config_file", str(target)], capsys)[0] == 0
    data = yaml.safe_load(target.read_text())
    assert data["distributed_type"] == "FSDP"
    assert data["fsdp_config"] == {"fsdp_version": 2, "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP", "fsdp_min_num_params": 1000,
                                   "fsdp_reshard_after_forward": False, "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                                   "fsdp_offload_params": False, "fsdp_activation_checkpointing": False,
                                   "fsdp_cpu_ram_efficient_loading": False}
    prompts = answer_with(monkeypatch, [""] * 20)  # again, taking every default: the file's answers come back
    assert run_config(["--config_file", str(target)], capsys)[0] == 0
    assert yaml.safe_load(target.read_text())["fsdp_config"] == data["fsdp_config"]
    assert any(p.startswith("Which training strategy") and p.endswith("[fsdp]: ") for p in prompts)
