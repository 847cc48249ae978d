"""`accel launch` takes every option of `accelerate launch` (read from Accelerate's own parser at test time,
so the list cannot go stale), gives them Accelerate's values, hands the training options to the ranks
as the environment variables Accelerate's launcher sets, and refuses what cannot apply here."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel.commands import UsageError, cli
from accel.commands import launch as launch_command
from accel.utils import launch as launch_utils
from _waits import SAFETY_NET_S

accelerate_launch = pytest.importorskip("accelerate.commands.launch", reason="Accelerate is the behaviour reference")

REPO = Path(__file__).resolve().parents[4]
pytestmark = pytest.mark.usefixtures("clean_environment")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('ran')\n")
    return path


def reference_parser() -> argparse.ArgumentParser:
    return accelerate_launch.launch_command_parser()


def accel_parse(argv: list[str]) -> argparse.Namespace:
    return cli.build_parser(load="launch").parse_args(["launch", *argv])


def reference_options() -> list[argparse.Action]:
    return [a for a in reference_parser()._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def sample_value(action: argparse.Action) -> list[str]:
    """Words that give ``action`` a value different from its default (none for flags)."""
    if action.nargs == 0:
        return []
    if action.choices:
        choices = [str(c) for c in action.choices]
        return [next((c for c in choices if c != str(action.default)), choices[0])]
    if action.type is int:
        return ["3"]
    if action.type is float:
        return ["0.5"]
    if action.dest == "fp8_override_linear_precision":
        return ["false,false,true"]
    if action.type is bool:
        return ["1"]
    if getattr(action.type, "__name__", "") == "str_to_bool":
        return ["false"]
    return ["some_value"]


def test_the_reference_parser_still_has_many_options():
    # guards the test below against an empty list (e.g. a renamed parser function upstream)
    assert len(reference_options()) > 100


@pytest.mark.parametrize("spelling", ["underscore", "dash"])
def test_every_accelerate_launch_option_parses_to_the_same_value(spelling, script):
    missing, different = [], []
    for action in reference_options():
        flags = [f for f in action.option_strings if f.startswith("--")] or action.option_strings
        flag = flags[0] if spelling == "underscore" else next((f for f in flags if "-" in f[2:]), flags[0])
        argv = [flag, *sample_value(action), str(script)]
        expected = getattr(reference_parser().parse_args(argv), action.dest)
        try:
            got = getattr(accel_parse(argv), action.dest)
        except Exception as exc:  # a parse error raises in the CLI's parser
            missing.append(f"{flag}: {exc}")
            continue
        if got != expected:
            different.append(f"{flag}: accel {got!r} != accelerate {expected!r}")
    assert not missing, "options accel launch does not take:\n" + "\n".join(missing)
    assert not different, "\n".join(different)


def test_defaults_match_accelerates(script):
    expected = vars(reference_parser().parse_args([str(script)]))
    expected.pop("nondefault", None)  # Accelerate's record of what was given, not an option
    got = vars(accel_parse([str(script)]))
    assert {k: got.get(k, "<missing>") for k in expected} == expected


def test_help_lists_each_option_once_without_the_dashed_alias():
    text = cli.build_parser(load="launch")._subparsers._group_actions[0].choices["launch"].format_help()
    for action in reference_options():
        main = [f for f in action.option_strings if f.startswith("--") and "-" not in f[2:]]
        assert main and main[0] in text
    assert "--zero-stage" not in text and "--fsdp-version" not in text


@pytest.mark.parametrize("dest, reason", sorted({d: r for d, r in launch_command.REFUSED.items()}.items()))
def test_options_that_cannot_apply_are_refused_naming_option_and_reason(dest, reason, script, capsys):
    action = next(a for a in reference_options() if a.dest == dest)
    flag = launch_command._REFUSED_FLAG.get(dest, next(f for f in action.option_strings if f.startswith("--") and "-" not in f[2:]))
    code = cli.main(["launch", flag, *sample_value(action), str(script)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{flag} cannot be used with accel launch: {reason}" in err


def test_refused_config_file_settings_name_the_setting(tmp_path, script, capsys):
    for text, expected in [
        ("distributed_type: MEGATRON_LM\nnum_processes: 1\n", "distributed_type MEGATRON_LM (config file) cannot run here"),
        ("distributed_type: XLA\nnum_processes: 1\n", "distributed_type XLA (config file) cannot run here"),
    ]:
        config = tmp_path / "c.yaml"
        config.write_text(text)
        assert cli.main(["launch", "--config_file", str(config), str(script)]) == 2
        assert expected in capsys.readouterr().err


def test_a_sagemaker_config_starts_a_sagemaker_job_or_says_what_is_missing(tmp_path, script, capsys, monkeypatch):
    """Without the SDK, or without AWS credentials, the launch stops with the reason before any request."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    config = tmp_path / "c.yaml"
    config.write_text("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: 'NO'\nec2_instance_type: ml.p3.2xlarge\n"
                      "iam_role_name: accel-test-role\nregion: us-east-1\nnum_machines: 1\n")
    assert cli.main(["launch", "--config_file", str(config), str(script)]) == 2
    err = capsys.readouterr().err
    assert "compute_environment AMAZON_SAGEMAKER:" in err
    assert "pip install 'sagemaker<3'" in err or "aws_access_key_id" in err, err
    # with a profile named, the missing credentials are found out before any request
    config.write_text(config.read_text() + "profile: accel-test-missing-profile\n")
    assert cli.main(["launch", "--config_file", str(config), str(script)]) == 2
    err = capsys.readouterr().err
    assert "pip install 'sagemaker<3'" in err or "accel-test-missing-profile" in err, err


# ---------------------------------------------------------------------------- the environment contract
def reference_env(argv: list[str], kind: str) -> dict[str, str]:
    """The variables Accelerate's own launcher functions set for ``argv`` (minus what was already there)."""
    from accelerate.utils import launch as ref

    args = reference_parser().parse_args(argv)
    args, _, _ = accelerate_launch._validate_launch_command(args)
    args.main_process_port = 0
    if kind == "deepspeed":
        args.deepspeed_fields_from_accelerate_config = ""
        _, env = ref.prepare_deepspeed_cmd_env(args)
    else:
        env = ref.prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if os.environ.get(k) != v}


CONTRACT_CASES = {
    "deepspeed": ["--use_deepspeed", "--zero_stage", "3", "--offload_optimizer_device", "CPU", "--offload_param_device", "cpu",
                  "--deepspeed_config_file", "ds.json", "--zero3_init_flag", "True", "--zero3_save_16bit_model", "true",
                  "--gradient_accumulation_steps", "4", "--gradient_clipping", "1.5", "--deepspeed_moe_layer_cls_names", "Block",
                  "--mixed_precision", "bf16"],
    "fsdp": ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
             "--fsdp_transformer_layer_cls_to_wrap", "Block", "--fsdp_state_dict_type", "SHARDED_STATE_DICT",
             "--fsdp_reshard_after_forward", "False", "--fsdp_activation_checkpointing", "true", "--fsdp_backward_prefetch",
             "BACKWARD_PRE", "--mixed_precision", "fp16"],
    "dynamo": ["--multi_gpu", "--num_processes", "2", "--dynamo_backend", "inductor", "--dynamo_mode", "max-autotune",
               "--dynamo_use_fullgraph", "--dynamo_use_regional_compilation", "--enable_cpu_affinity"],
    "parallelism": ["--use_fsdp", "--fsdp_version", "2", "--use_parallelism_config", "--parallelism_config_dp_shard_size", "2",
                    "--parallelism_config_cp_size", "2", "--num_processes", "4"],
}


@pytest.mark.parametrize("case", sorted(CONTRACT_CASES))
def test_training_options_reach_the_ranks_under_accelerates_variable_names(case, script):
    argv = [*CONTRACT_CASES[case], str(script)]
    expected = reference_env(argv, "deepspeed" if case == "deepspeed" else "multi")
    expected = {k: v for k, v in expected.items() if k.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_"))}
    expected.pop("ACCELERATE_USE_CPU", None)  # accel decides the device itself (a CPU here)
    args = accel_parse(argv)
    args, defaults, _ = launch_command._validate_launch_command(args)
    args.deepspeed_fields_from_accelerate_config = ""
    got = launch_utils.launch_env(args)
    assert len(expected) >= 6
    assert {k: got.get(k) for k in expected} == expected


def test_accel_sets_gradient_options_on_every_path_and_fp8_only_for_fp8(script):
    args, _, _ = launch_command._validate_launch_command(
        accel_parse(["--gradient_accumulation_steps", "8", "--gradient_clipping", "0.5", "--fp8_backend", "ao", str(script)]))
    env = launch_utils.launch_env(args)
    assert env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == "8" and env["ACCELERATE_GRADIENT_CLIPPING"] == "0.5"
    assert "ACCELERATE_FP8_BACKEND" not in env and "ACCELERATE_USE_DEEPSPEED" not in env and "ACCELERATE_USE_FSDP" not in env
    args.mixed_precision = "fp8"
    env = launch_utils.launch_env(args)
    assert env["ACCELERATE_FP8_BACKEND"] == "ao" and env["ACCELERATE_FP8_OVERRIDE_WGRAD"] == "False"


def test_fsdp_cpu_ram_efficient_loading_needs_sync_module_states(script, capsys):
    code = cli.main(["launch", "--use_fsdp", "--fsdp_sync_module_states", "false", str(script)])
    assert code == 2 and "set `--fsdp_sync_module_states` to `True`" in capsys.readouterr().err


def test_a_debug_mode_given_in_the_environment_is_kept(script, monkeypatch):
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "0")
    args = accel_parse(["--cpu", "--debug", str(script)])
    plan = launch_command.build_plan(args)
    assert "ACCELERATE_DEBUG_MODE" not in plan.env  # the user's "0" reaches the ranks untouched
    assert plan.env["ACCEL_DEBUG_MODE"] == "0"  # and accel's name says the same
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE")
    plan = launch_command.build_plan(accel_parse(["--cpu", "--debug", str(script)]))
    assert plan.env["ACCEL_DEBUG_MODE"] == plan.env["ACCELERATE_DEBUG_MODE"] == "true"
    plan = launch_command.build_plan(accel_parse(["--cpu", str(script)]))
    assert "ACCEL_DEBUG_MODE" not in plan.env and "ACCELERATE_DEBUG_MODE" not in plan.env


def test_a_missing_accel_config_file_is_an_error_naming_it(tmp_path, script, monkeypatch, capsys):
    missing = tmp_path / "nowhere" / "cfg.yaml"
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(missing))
    assert cli.main(["launch", "--cpu", str(script)]) == 2
    assert f"ACCEL_CONFIG_FILE names a config file that does not exist: {missing}" in capsys.readouterr().err


def test_config_sections_become_options_and_flags_win(tmp_path, script):
    config = tmp_path / "fsdp.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 2\nuse_cpu: true\n"
        "fsdp_config:\n  fsdp_version: 2\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n  fsdp_offload_params: true\n"
        "dynamo_config:\n  dynamo_backend: INDUCTOR\n"
    )
    plan = launch_command.build_plan(accel_parse(["--config_file", str(config), "--fsdp_offload_params", "false", str(script)]))
    assert plan.env["ACCELERATE_USE_FSDP"] == "true" and plan.env["FSDP_VERSION"] == "2"
    assert plan.env["FSDP_STATE_DICT_TYPE"] == "SHARDED_STATE_DICT"
    assert plan.env["FSDP_OFFLOAD_PARAMS"] == "false"  # the flag beat the file
    assert plan.env["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR" and plan.nproc_per_node == 2


def test_exclusive_choices_and_bad_values_are_usage_errors(script, capsys):
    for argv, message in [
        (["--cpu", "--use_deepspeed"], "You can only use one of"),
        (["--multi_gpu", "--num_processes", "1"], "at least 2 processes to use `--multi_gpu`"),
        (["--use_parallelism_config"], "without `--use_fsdp` and `--fsdp_version=2`"),
        (["--env", "NOEQUALS"], "--env expects NAME=VALUE"),
        (["--rdzv_backend", "carrier-pigeon"], "--rdzv_backend must be one of"),
    ]:
        assert cli.main(["launch", *argv, str(script)]) == 2, argv
        assert message in capsys.readouterr().err


def test_mpirun_hostfile_needs_mpirun(tmp_path, script, monkeypatch, capsys):
    monkeypatch.setattr(launch_utils, "which", lambda name: None)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    assert cli.main(["launch", "--cpu", "--mpirun_hostfile", str(hostfile), str(script)]) == 2
    assert "--mpirun_hostfile: mpirun or mpiexec were not found" in capsys.readouterr().err


def test_mpirun_command_for_intel_and_open_mpi(tmp_path, script, monkeypatch):
    monkeypatch.setattr(launch_utils, "which", lambda name: f"/usr/bin/{name}")
    for banner, expected in [(b"Intel(R) MPI Library", ["mpirun", "-f", "hosts", "-ppn", "2", "-n", "4"]),
                             (b"mpirun (Open MPI) 4.1", ["mpirun", "--hostfile", "hosts", "--npernode", "2", "-n", "4", "--bind-to", "socket"])]:
        monkeypatch.setattr(launch_utils.subprocess, "check_output", lambda cmd, banner=banner: banner)
        args = accel_parse(["--cpu", "--mpirun_hostfile", "hosts", "--num_processes", "4", "--num_machines", "2",
                            "--main_process_ip", "10.0.0.1", "--main_process_port", "29500", str(script), "--lr", "1"])
        args, _, _ = launch_command._validate_launch_command(args)
        cmd, env = launch_utils.prepare_simple_launcher_cmd_env(args)
        assert cmd[:len(expected)] == expected
        assert cmd[len(expected):] == [sys.executable, str(script), "--lr", "1"]
        assert env["KMP_AFFINITY"] == "granularity=fine,compact,1,0" and env["MASTER_ADDR"] == "10.0.0.1"


def test_prepare_multi_gpu_env_picks_a_free_port_for_port_zero():
    args = argparse.Namespace(num_processes=2, num_machines=1, main_process_ip=None, main_process_port=0, machine_rank=0,
                              module=False, no_python=False, debug=False, gpu_ids="all", mixed_precision="no",
                              dynamo_backend="no", use_fsdp=False, use_deepspeed=False, num_cpu_threads_per_process=1)
    env = launch_utils.prepare_multi_gpu_env(args)
    assert args.master_port.isdigit() and args.master_port != "0" and args.nproc_per_node == "2"
    assert env["ACCELERATE_MIXED_PRECISION"] == "no" and env["OMP_NUM_THREADS"] == "1"


def test_prepare_deepspeed_cmd_env_builds_the_multinode_runner():
    args = argparse.Namespace(num_processes=4, num_machines=2, main_process_ip="10.0.0.1", main_process_port=None, machine_rank=0,
                              module=False, no_python=False, debug=False, gpu_ids="all", mixed_precision="bf16",
                              dynamo_backend="no", deepspeed_multinode_launcher=None, deepspeed_hostfile="hosts",
                              deepspeed_exclusion_filter=None, deepspeed_inclusion_filter=None, training_script="t.py",
                              training_script_args=["--x"], zero_stage=2)
    cmd, env = launch_utils.prepare_deepspeed_cmd_env(args)
    assert cmd == ["deepspeed", "--hostfile", "hosts", "--no_local_rank", "--launcher", "pdsh", "--num_gpus", "2",
                   "--master_addr", "10.0.0.1", "--master_port", "29500", "t.py", "--x"]
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "2"


def test_sagemaker_argument_conversion():
    assert launch_utils._convert_nargs_to_dict(["--lr", "0.1", "--epochs", "3", "--name", "x", "--flag", "True"]) == {
        "lr": 0.1, "epochs": 3, "name": "x", "flag": True}
    with pytest.raises(ValueError, match="store_true"):
        launch_utils._convert_nargs_to_dict(["--lr", "0.1", "--switch"])


def test_launch_command_raises_usage_errors_as_value_errors(script):
    args = launch_command.launch_command_parser().parse_args(["--tpu", str(script)])
    with pytest.raises(ValueError, match="--tpu cannot be used with accel launch"):
        launch_command.launch_command(args)
    assert issubclass(UsageError, ValueError)


# ---------------------------------------------------------------------------- end to end
def test_two_ranks_receive_the_variables(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, sys\n"
        "names = ['ACCELERATE_USE_FSDP', 'FSDP_VERSION', 'ACCELERATE_DYNAMO_BACKEND', 'ACCELERATE_GRADIENT_ACCUMULATION_STEPS',\n"
        "         'ACCELERATE_MIXED_PRECISION', 'ACCEL_MIXED_PRECISION', 'FOO', 'OMP_NUM_THREADS', 'WORLD_SIZE']\n"
        "out = os.path.join(sys.argv[1], 'rank' + os.environ['RANK'] + '.json')\n"
        "json.dump({n: os.environ.get(n) for n in names}, open(out, 'w'))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "accel.commands.cli", "launch", "--backend", "cpu", "--num_processes", "2", "--use_fsdp", "--fsdp_version", "2",
         "--dynamo_backend", "no", "--gradient_accumulation_steps", "2", "--mixed_precision", "bf16", "--env", "FOO=bar",
         "--num_cpu_threads_per_process", "1", "-q", "--tee", "0", str(probe), str(tmp_path)],
        capture_output=True, text=True, timeout=SAFETY_NET_S, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert seen[0] == seen[1] == {
        "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "ACCELERATE_DYNAMO_BACKEND": "NO",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "2", "ACCELERATE_MIXED_PRECISION": "bf16", "ACCEL_MIXED_PRECISION": "bf16",
        "FOO": "bar", "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2",
    }
