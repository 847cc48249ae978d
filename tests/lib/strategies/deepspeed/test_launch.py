"""A script written for Accelerate's DeepSpeed integration runs under ``accel launch`` on 2 ranks.

The script (tests/scripts/deepspeed_user_script.py) is the docs' pattern: ``Accelerator()``,
``prepare``, ``backward``, ``step``, ``save_state``; DeepSpeed comes from the launch, either an
accel/Accelerate config file naming a DeepSpeed JSON with "auto" values, or launch flags.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "deepspeed_user_script.py"


def _launch(args: list[str], out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "ACCEL_", "RANK", "WORLD_SIZE",
                                                                      "LOCAL_RANK", "MASTER_"))}
    env["OMP_NUM_THREADS"] = "1"
    env["ACCEL_DEVICE"] = "cpu"  # the project's CI machine; on a GPU host this stays a CPU test
    proc = subprocess.run([sys.executable, "-m", "accel.commands.cli", "launch", *args, str(SCRIPT), str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "result.json").read_text())


def _check_checkpoint(folder: Path) -> None:
    manifest = json.loads((folder / "accel_checkpoint.json").read_text())
    assert manifest["strategy"]["name"] == "deepspeed" and manifest["num_processes"] == 2
    assert (folder / "pytorch_model").is_dir() and (folder / "latest").read_text().strip() == "pytorch_model"
    assert {"random_states_0.json", "random_states_1.json", "scheduler.bin"} <= set(os.listdir(folder))


def test_config_file_with_a_deepspeed_json_of_auto_values(tmp_path):
    ds_json = tmp_path / "ds_config.json"
    ds_json.write_text(json.dumps({
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "zero_optimization": {"stage": 2}, "bf16": {"enabled": True},
    }))
    config = tmp_path / "accel_config.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_processes: 2\nuse_cpu: true\n"
        f"deepspeed_config:\n  deepspeed_config_file: {ds_json}\n  zero3_init_flag: false\n"
    )
    result = _launch(["--config_file", str(config)], tmp_path)
    assert result["distributed_type"] == "DEEPSPEED" and result["num_processes"] == 2
    assert result["zero_stage"] == 2 and result["mixed_precision"] == "bf16"
    assert len(result["losses"]) == 8 and all(0 < loss < 10 for loss in result["losses"])
    _check_checkpoint(tmp_path / "ckpt")


# slow (nightly): tests/lib/commands/launch/test_options.py::test_training_options_reach_the_ranks_under_accelerates_variable_names[deepspeed]
# covers the flags reaching the ranks as Accelerate's variables, suites/test_deepspeed.py ZeRO-3 training at 2 ranks
# from them, and test_config_file_with_a_deepspeed_json_of_auto_values this script under accel launch
@pytest.mark.slow
def test_launch_flags_turn_on_zero3(tmp_path):
    result = _launch(["--num_processes", "2", "--use_deepspeed", "--zero_stage", "3",
                      "--gradient_accumulation_steps", "1"], tmp_path)
    assert result["distributed_type"] == "DEEPSPEED" and result["zero_stage"] == 3
    assert result["mixed_precision"] == "no" and result["num_processes"] == 2
    assert sum(result["losses"][-2:]) < sum(result["losses"][:2]), result["losses"]
    _check_checkpoint(tmp_path / "ckpt")
