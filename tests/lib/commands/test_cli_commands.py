"""The commands and modules added for Accelerate parity: config update/default --force/value flags/wizard
defaults, config files of every Accelerate version, tpu-config, to-fsdp2, merge-weights, completion,
estimate-memory registration and the accelerate_cli entry module."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from accel.commands import cli
from accel.commands.config import config as config_command
from accel.commands.config.config_args import ClusterConfig, SageMakerConfig, load_config_from_file
from accel.launch.config_file import ConfigError, default_config_path, load_config
from _waits import SAFETY_NET_S

pytestmark = pytest.mark.usefixtures("clean_environment")
REPO = Path(__file__).resolve().parents[3]


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---------------------------------------------------------------------------- config files of every version
#: the keys each Accelerate version's `accelerate config` wrote (same shapes as its tests/test_configs)
OLD_CONFIGS = {
    "0.11": "compute_environment: LOCAL_MACHINE\ndeepspeed_config: {}\ndistributed_type: 'NO'\nfsdp_config: {}\nmachine_rank: 0\n"
            "main_process_ip: null\nmain_process_port: null\nmain_training_function: main\nmixed_precision: 'no'\n"
            "num_machines: 1\nnum_processes: 1\nuse_cpu: false\n",
    "0.12 (downcast_bf16 'no')": "compute_environment: LOCAL_MACHINE\ndeepspeed_config: {}\ndistributed_type: 'NO'\ndowncast_bf16: 'no'\n"
                                 "fsdp_config: {}\nmachine_rank: 0\nmixed_precision: 'no'\nnum_machines: 1\nnum_processes: 1\nuse_cpu: false\n",
    "fp16 flag (pre 0.8)": "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nfp16: true\nnum_processes: 1\n",
    "top-level dynamo_backend": "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\ndynamo_backend: INDUCTOR\nnum_processes: 1\n",
    "tpu keys + command": "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\ngpu_ids: all\nmegatron_lm_config: {}\n"
                          "num_processes: 1\nrdzv_backend: static\nsame_network: true\ntpu_name: test-tpu\ntpu_zone: us-central1-a\n"
                          "command: null\ncommand_file: cmds.sh\n",
    "0.28 mpi + ipex": "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: MULTI_CPU\nipex_config:\n  ipex: true\n"
                       "main_process_ip: 127.0.0.1\nmain_process_port: 29500\nmpirun_config:\n  mpirun_ccl: '1'\n"
                       "  mpirun_hostfile: /home/user/hostfile\nnum_machines: 4\nnum_processes: 16\ntpu_env: []\n"
                       "tpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: true\n",
    "0.30 sagemaker, repeated key": "compute_environment: AMAZON_SAGEMAKER\ndebug: false\ndistributed_type: NO\nmixed_precision: fp16\n"
                                    "debug: false\nuse_cpu: false\nec2_instance_type: MY_TYPE\niam_role_name: MY_ROLE\n",
    "0.34 fp8": "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nenable_cpu_affinity: false\nfp8_config:\n"
                "  amax_compute_algo: max\n  backend: TE\n  fp8_format: E4M3\n  override_linear_precision: (false, false, false)\n"
                "mixed_precision: fp8\nnum_processes: 2\n",
    "fsdp1": "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
             "  fsdp_backward_prefetch: BACKWARD_PRE\n  fsdp_use_orig_params: true\n  fsdp_sync_module_states: true\n"
             "  fsdp_state_dict_type: SHARDED_STATE_DICT\nnum_processes: 2\n",
    "megatron": "compute_environment: LOCAL_MACHINE\ndistributed_type: MEGATRON_LM\nnum_processes: 1\nmegatron_lm_config:\n"
                "  megatron_lm_recompute_activations: false\n",
    "unquoted NO": "compute_environment: LOCAL_MACHINE\ndistributed_type: NO\nmixed_precision: no\nnum_processes: 1\n",
}


@pytest.mark.parametrize("version", sorted(OLD_CONFIGS))
def test_config_files_of_every_accelerate_version_load(version, tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(OLD_CONFIGS[version])
    config = load_config_from_file(str(path))
    expected_class = SageMakerConfig if "sagemaker" in version else ClusterConfig
    assert type(config) is expected_class
    data = yaml.safe_load(OLD_CONFIGS[version].replace("NO\n", "'NO'\n").replace("no\n", "'no'\n"))
    assert config.distributed_type == str(data["distributed_type"])
    if "fp16: true" in OLD_CONFIGS[version]:
        assert config.mixed_precision == "fp16"
    if "dynamo_backend" in OLD_CONFIGS[version]:
        assert config.dynamo_config == {"dynamo_backend": "INDUCTOR"}
    if "fsdp_sharding_strategy" in OLD_CONFIGS[version]:
        assert config.fsdp_config["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"


def test_unknown_keys_still_fail_naming_file_line_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(OLD_CONFIGS["0.11"] + "invalid_key: 1\n")
    with pytest.raises(ConfigError, match=r"line 13: unknown key 'invalid_key'"):
        load_config_from_file(str(path))
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_config_from_file(str(tmp_path / "nope.yaml"))


def test_cluster_config_round_trip_keeps_sections(tmp_path):
    path = tmp_path / "fsdp.yaml"
    path.write_text(OLD_CONFIGS["fsdp1"])
    config = load_config_from_file(str(path))
    config.to_yaml_file(tmp_path / "again.yaml")
    again = load_config_from_file(str(tmp_path / "again.yaml"))
    assert again.fsdp_config == config.fsdp_config and again.num_processes == 2
    assert "deepspeed_config" not in yaml.safe_load((tmp_path / "again.yaml").read_text())  # empty sections left out


# ---------------------------------------------------------------------------- accel config
def test_value_flags_change_only_what_they_name(capsys):
    assert run_cli(["config", "--num_processes", "2", "--cpu"], capsys)[0] == 0
    assert run_cli(["config", "--mixed_precision", "bf16"], capsys)[0] == 0
    config = load_config(default_config_path())
    assert (config.num_processes, config.mixed_precision, config.use_cpu, config.distributed_type) == (2, "bf16", True, "MULTI_CPU")
    assert run_cli(["config", "--num_processes", "1"], capsys)[0] == 0
    config = load_config(default_config_path())
    assert (config.num_processes, config.mixed_precision, config.distributed_type) == (1, "bf16", "NO")


def test_value_flags_keep_sections_and_a_chosen_distributed_type(capsys):
    path = default_config_path()
    path.parent.mkdir(parents=True)
    path.write_text(OLD_CONFIGS["fsdp1"])
    assert run_cli(["config", "--mixed_precision", "fp16"], capsys)[0] == 0
    config = load_config(path)
    assert config.distributed_type == "FSDP" and config.extra["fsdp_config"]["fsdp_sharding_strategy"] == "FULL_SHARD"
    assert (config.mixed_precision, config.num_processes) == ("fp16", 2)


def test_force_is_listed_in_accel_config_help(capsys):
    code, out, _ = run_cli(["config", "--help"], capsys)
    assert code == 0 and "--force" in out and "update" in out
    path = default_config_path()
    path.parent.mkdir(parents=True)
    path.write_text("num_processes: 3\nuse_cpu: true\n")
    assert run_cli(["config", "--force", "default"], capsys)[0] == 0  # --force before the action works too
    assert load_config(path).num_processes == 1


def test_the_wizard_offers_the_current_values(monkeypatch, capsys):
    assert run_cli(["config", "--cpu", "--num_processes", "3", "--mixed_precision", "fp16", "--debug"], capsys)[0] == 0
    prompts: list[str] = []

    def answer(prompt: str = "") -> str:
        prompts.append(prompt)
        return ""  # take every default offered

    monkeypatch.setattr("builtins.input", answer)
    monkeypatch.setattr(config_command, "_stdin_is_tty", lambda: True)
    assert run_cli(["config"], capsys)[0] == 0
    assert prompts[0].endswith("[cpu]: ")
    assert any(p.startswith("How many processes") and p.endswith("[3]: ") for p in prompts)
    assert any(p.startswith("Mixed precision") and p.endswith("[fp16]: ") for p in prompts)
    assert any(p.startswith("Enable debug mode") and p.endswith("[yes]: ") for p in prompts)
    config = load_config(default_config_path())
    assert (config.num_processes, config.mixed_precision, config.debug) == (3, "fp16", True)


def test_config_update_rewrites_old_keys_and_says_what_changed(tmp_path, capsys):
    path = tmp_path / "old.yaml"
    path.write_text(OLD_CONFIGS["fp16 flag (pre 0.8)"])
    code, out, err = run_cli(["config", "update", "--config_file", str(path)], capsys)
    assert code == 0, err
    assert "removed fp16" in out and "added mixed_precision: 'fp16'" in out and f"accel config updated {path}" in out
    assert yaml.safe_load(path.read_text())["mixed_precision"] == "fp16"
    code, out, _ = run_cli(["config", "update", "--config_file", str(path)], capsys)
    assert code == 0 and "already up to date" in out
    code, _, err = run_cli(["config", "update", "--config_file", str(tmp_path / "none.yaml")], capsys)
    assert code == 2 and "no config file at" in err


def test_write_basic_config_and_update_config_functions(tmp_path):
    import argparse

    from accel.commands.config.default import write_basic_config
    from accel.commands.config.update import update_config

    target = tmp_path / "basic.yaml"
    assert write_basic_config("bf16", target) == target
    assert load_config(target).mixed_precision == "bf16"
    assert write_basic_config("no", target) is False  # an existing file is kept
    with pytest.raises(ValueError, match="mixed_precision"):
        write_basic_config("fp64", tmp_path / "other.yaml")
    assert update_config(argparse.Namespace(config_file=str(target))) == str(target)
    with pytest.raises(ValueError, match="doesn't exist"):
        update_config(argparse.Namespace(config_file=str(tmp_path / "none.yaml")))


# ---------------------------------------------------------------------------- tpu-config
def test_tpu_config_builds_the_gcloud_command(tmp_path, capsys):
    commands = tmp_path / "cmds.sh"
    commands.write_text('echo "hello world"\necho "second"\n')
    config = tmp_path / "tpu.yaml"
    config.write_text(f"distributed_type: 'NO'\nnum_processes: 1\ntpu_name: my-tpu\ntpu_zone: europe-west4-a\ncommand_file: {commands}\n")
    code, out, _ = run_cli(["tpu-config", "--config_file", str(config), "--install_accelerate", "--accelerate_version", "1.2.0", "--debug"], capsys)
    assert code == 0
    assert out.strip() == ('Running gcloud compute tpus tpu-vm ssh my-tpu --zone europe-west4-a --command cd /usr/share; '
                           'pip install accelerate==1.2.0; echo "hello world"; echo "second" --worker all')
    code, out, _ = run_cli(["tpu-config", "--tpu_name", "t", "--tpu_zone", "z", "--command", "ls", "--command", "pwd", "--use_alpha", "--debug"], capsys)
    assert "Running gcloud alpha compute tpus tpu-vm ssh t --zone z --command cd /usr/share; ls; pwd --worker all" in out


def test_tpu_config_without_gcloud_says_so(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    code, _, err = run_cli(["tpu-config", "--tpu_name", "t", "--tpu_zone", "z", "--command", "ls"], capsys)
    assert code == 2 and "gcloud is not installed" in err and "gcloud compute tpus tpu-vm ssh t" in err
    code, _, err = run_cli(["tpu-config", "--tpu_name", "t", "--tpu_zone", "z"], capsys)
    assert code == 2 and "either a command file or a command" in err


# ---------------------------------------------------------------------------- to-fsdp2
def test_to_fsdp2_rewrites_the_fsdp_section_and_lists_the_changes(tmp_path, capsys):
    source, target = tmp_path / "fsdp1.yaml", tmp_path / "fsdp2.yaml"
    source.write_text(OLD_CONFIGS["fsdp1"])
    code, out, err = run_cli(["to-fsdp2", "--config_file", str(source), "--output_file", str(target)], capsys)
    assert code == 0, err
    fsdp = load_config_from_file(str(target)).fsdp_config
    assert fsdp == {"fsdp_reshard_after_forward": True, "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_version": 2}
    assert "fsdp_sharding_strategy: 'FULL_SHARD' -> fsdp_reshard_after_forward: True" in out
    assert "dropped fsdp_backward_prefetch: 'BACKWARD_PRE' (removed in FSDP2)" in out and "fsdp_version: 1 -> 2" in out
    code, _, err = run_cli(["to-fsdp2", "--config_file", str(source), "--output_file", str(target)], capsys)
    assert code == 2 and "already exists and --overwrite is not set" in err
    code, _, err = run_cli(["to-fsdp2", "--config_file", str(source)], capsys)
    assert code == 2 and "--output_file must be provided" in err
    code, out, _ = run_cli(["to-fsdp2", "--config_file", str(target), "--overwrite"], capsys)
    assert code == 0 and "nothing to change" in out


# ---------------------------------------------------------------------------- merge-weights
def _write_dcp_checkpoint(folder: Path) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving in one process" is what we want
        dcp.save({"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(str(folder)), no_dist=True)
    return state


def test_merge_fsdp_weights_turns_a_dcp_checkpoint_into_safetensors(tmp_path):
    import torch
    from safetensors.torch import load_file

    from accel.utils.fsdp_utils import merge_fsdp_weights

    state = _write_dcp_checkpoint(tmp_path / "ckpt" / "pytorch_model_fsdp_0")
    with pytest.raises(ValueError, match="pass one of those instead"):  # the save_state folder, not the model's
        merge_fsdp_weights(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    written = merge_fsdp_weights(str(tmp_path / "ckpt" / "pytorch_model_fsdp_0"), str(tmp_path / "out"))
    assert written == tmp_path / "out" / "model.safetensors"
    merged = load_file(written)
    assert merged.keys() == state.keys() and all(torch.equal(merged[k], state[k]) for k in state)

    bin_path = merge_fsdp_weights(str(tmp_path / "ckpt" / "pytorch_model_fsdp_0"), str(tmp_path / "bin"),
                                  safe_serialization=False, remove_checkpoint_dir=True)
    assert bin_path.name == "pytorch_model.bin" and not (tmp_path / "ckpt" / "pytorch_model_fsdp_0").exists()
    assert all(torch.equal(torch.load(bin_path, weights_only=True)[k], state[k]) for k in state)


def test_merge_weights_command(tmp_path, capsys):
    _write_dcp_checkpoint(tmp_path / "ckpt")
    code, out, err = run_cli(["merge-weights", str(tmp_path / "ckpt"), str(tmp_path / "out")], capsys)
    assert code == 0, err
    assert f"wrote {tmp_path / 'out' / 'model.safetensors'}" in out
    code, _, err = run_cli(["merge-weights", str(tmp_path / "empty"), str(tmp_path / "out2")], capsys)
    assert code == 2 and "couldn't find a valid metadata file" in err and "does not exist" in err


# ---------------------------------------------------------------------------- completion, registration
@pytest.mark.parametrize("shell, marker", [("bash", "complete"), ("zsh", "compdef"), ("fish", "complete --command accel")])
def test_completion_scripts(shell, marker, capsys):
    pytest.importorskip("argcomplete", reason="shell completion uses argcomplete")
    code, out, _ = run_cli(["completion", shell], capsys)
    assert code == 0 and marker in out and "accel" in out


def test_completion_offers_a_commands_options(tmp_path):
    pytest.importorskip("argcomplete", reason="shell completion uses argcomplete")
    line = "accel launch --zero_st"
    env = {**os.environ, "_ARGCOMPLETE": "1", "_ARGCOMPLETE_IFS": "\n", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "PYTHONPATH": str(REPO)}
    # argcomplete answers on file descriptor 8, as the shell script it generates arranges
    command = f'"{sys.executable}" -c "import sys; from accel.commands.cli import main; sys.exit(main())" 8>&1 9>/dev/null'
    proc = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=SAFETY_NET_S, stdin=subprocess.DEVNULL)
    assert "--zero_stage" in proc.stdout


def test_every_registered_command_has_help(capsys):
    for name in cli.COMMANDS:
        code, out, err = run_cli([name, "--help"], capsys)
        assert code == 0, (name, err)
        assert "usage: accel " + name in out


def test_a_missing_optional_command_module_is_named(monkeypatch, capsys):
    monkeypatch.setitem(cli.COMMANDS, "ghost", ("accel.commands.no_such_module", "not installed here"))
    code, _, err = run_cli(["ghost"], capsys)
    assert code == 2 and "`accel ghost` is not available in this installation (accel.commands.no_such_module is missing)" in err


def test_accelerate_cli_module_runs_accel(monkeypatch, capsys):
    from accel.commands import accelerate_cli

    monkeypatch.setattr(sys, "argv", ["accelerate", "config", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        accelerate_cli.main()
    assert exit_info.value.code == 0 and "usage: accel config" in capsys.readouterr().out


def test_accelerate_named_parser_functions_exist():
    from accel.commands.config import get_config_parser
    from accel.commands.env import env_command_parser
    from accel.commands.launch import launch_command_parser
    from accel.commands.merge import merge_command_parser
    from accel.commands.test import test_command_parser
    from accel.commands.to_fsdp2 import to_fsdp2_command_parser
    from accel.commands.tpu import tpu_command_parser

    import argparse

    root = argparse.ArgumentParser()
    subparsers = root.add_subparsers()
    for build in (get_config_parser, env_command_parser, launch_command_parser, merge_command_parser, test_command_parser,
                  to_fsdp2_command_parser, tpu_command_parser):
        parser = build(subparsers=subparsers)
        assert parser.get_default("func") is not None
    args = root.parse_args(["to-fsdp2", "--config_file", "x.yaml", "--overwrite"])
    assert args.func.__name__ == "to_fsdp2_command"


# ---------------------------------------------------------------------------- typos
@pytest.mark.parametrize("argv, wrong, right", [
    (["launch", "--num_proceses", "2", "train.py"], "--num_proceses", "--num_processes"),
    (["launch", "--cpu", "--mixed-precison=bf16", "train.py"], "--mixed-precison=bf16", "--mixed_precision"),
    (["test", "--num_proceses", "2"], "--num_proceses", "--num_processes"),
    (["env", "--jsn"], "--jsn", "--json"),
    (["config", "--mixed_precison", "bf16"], "--mixed_precison", "--mixed_precision"),  # bf16 is not taken for an action
    (["config", "default", "--forse"], "--forse", "--force"),
    (["report", "results", "--outptu", "x"], "--outptu", "--output"),  # not "-o/--output is required"
    (["qualify", "--quik"], "--quik", "--quick"),
    (["bench", "--quik"], "--quik", "--quick"),
], ids=lambda v: v[0] if isinstance(v, list) else None)
def test_an_unknown_flag_is_named_with_the_closest_one(argv, wrong, right, capsys):
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert err.startswith(f"accel {argv[0]}: error: unrecognized argument {wrong}; did you mean {right}?"), err


def test_typos_without_a_close_flag_and_stray_words(capsys):
    code, _, err = run_cli(["launch", "--zzzzzzzz", "train.py"], capsys)
    assert code == 2 and "unrecognized argument --zzzzzzzz (see 'accel launch --help')" in err and "did you mean" not in err
    code, _, err = run_cli(["env", "stray", "words"], capsys)
    assert code == 2 and "accel env: error: unrecognized arguments: stray words" in err
    code, _, err = run_cli(["--verison"], capsys)
    assert code == 2 and "did you mean --version?" in err
    code, _, err = run_cli(["lanch", "x.py"], capsys)
    assert code == 2 and "invalid choice: 'lanch'" in err and "); did you mean launch? (see 'accel --help')" in err


def test_accel_launch_passes_the_scripts_own_flags_through():
    """Only flags before the script are the launcher's: a script's misspelt-looking flag is its own business."""
    parser = cli.build_parser(load="launch")
    args, extra = parser.parse_known_args(["launch", "--cpu", "train.py", "--num_proceses", "2"])
    assert extra == [] and args.training_script == "train.py" and args.training_script_args == ["--num_proceses", "2"]
    assert cli.COMMAND_PARSERS["launch"].unknown_flags(["--num_proceses"]) == []  # never rescanned for typos


def test_suggest_compares_dashes_and_underscores_alike():
    known = ["--num_processes", "--num-processes", "--num_machines", "--cpu"]
    assert cli.suggest("--num-proceses", known) == "--num_processes"
    assert cli.suggest("--num_machins", known) == "--num_machines"
    assert cli.suggest("--gpu", ["--cpu", "--gpu_ids"]) in ("--cpu", "--gpu_ids")
    assert cli.suggest("--completely-different", known) is None and cli.suggest("-x", known) is None


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_long_flag_takes_both_spellings(command):
    """Accelerate's commands take ``--num_processes`` and ``--num-processes`` alike; so does every accel command."""
    cli.build_parser(load=command)
    parser = cli.COMMAND_PARSERS[command]
    lookup = parser._option_string_actions
    for action in parser._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and len(flag) > 3:
                for spelling in ("--" + flag[2:].replace("-", "_"), "--" + flag[2:].replace("_", "-")):
                    assert spelling in lookup, f"accel {command}: {flag} has no {spelling}"


def test_the_other_spelling_parses_and_abbreviates_as_one_option():
    parser = cli.build_parser(load="ops")
    assert parser.parse_args(["ops", "--no_census"]).no_census is True
    assert parser.parse_args(["ops", "--no-cen"]).no_census is True  # one option under two names: not ambiguous
    assert parser.parse_args(["ops", "--known_issues", "k.yaml"]).known_issues == ["k.yaml"]


def test_the_process_command_freezes_what_it_imported_before_the_interpreter_exits(tmp_path):
    """``accel`` run as the process's command collects its garbage and freezes the rest when it is done, so
    the interpreter's last collections skip torch (about half a second of every command's exit); a call
    with explicit arguments (a caller that goes on) freezes nothing."""
    code = (
        "import atexit, gc, sys\n"
        "import torch\n"
        "from accel.commands import cli\n"
        "before = gc.get_freeze_count()\n"
        "cli.main(['--version'])\n"
        "print('in-process call froze', gc.get_freeze_count() - before)\n"
        "atexit.register(lambda: print('frozen at exit', gc.get_freeze_count() > 100_000))\n"
        "sys.argv = ['accel', '--version']\n"
        "sys.exit(cli.main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert done.returncode == 0, done.stderr
    assert "in-process call froze 0" in done.stdout
    assert "frozen at exit True" in done.stdout, done.stdout
