"""Merging a sharded FSDP checkpoint into one file, on 2..N real processes.

Run as ``accel launch --num_processes 2 test_merge_weights.py`` (Accelerate's multi-device test runs
its own script of this name this way). The processes train a small model under FSDP with a sharded
state dict, write the sharded checkpoint with ``save_fsdp_model``, then merge it four ways:
``merge_fsdp_weights`` and the ``accel merge-weights`` command, each to safetensors and to a pickle file.
Every merged file must load into a plain, unwrapped model and give back exactly the trained weights;
a fresh model must differ from them first, so a merge that wrote the initial weights (or nothing)
fails. Each failure raises AssertionError naming the check and the rank.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from accel import Accelerator, FullyShardedDataParallelPlugin
from accel.facts.checkpoint import SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from accel.state import AcceleratorState
from accel.test_utils.training import RegressionDataset
from accel.utils import merge_fsdp_weights, save_fsdp_model
from accel.utils.operations import broadcast_object_list

SHARDED_FOLDER = "pytorch_model_fsdp_0"
# a rank's variables: the merge command runs as a plain single process
_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                   "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


class TinyModel(torch.nn.Module):
    """Two 16x16 linear layers: big enough for each rank to hold a shard of every weight."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(16, 16)
        self.activation = torch.nn.ReLU()
        self.linear2 = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layers in order; ``x`` is (batch, 16)."""
        return self.linear2(self.activation(self.linear1(x)))


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {AcceleratorState().process_index}] {what}")


def _regression_batches() -> DataLoader:
    # RegressionDataset yields scalar x/y; the model reads 16 features, so repeat them
    data = RegressionDataset(length=64, seed=42)
    rows = [{"x": torch.full((16,), float(item["x"])), "y": torch.full((16,), float(item["y"]))} for item in data]
    return DataLoader(rows, batch_size=8, shuffle=False)


def train_sharded(accelerator: Accelerator) -> torch.nn.Module:
    """A few SGD steps of TinyModel under FSDP, so the merged weights are not the initial ones."""
    torch.manual_seed(0)
    model = TinyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, _regression_batches())
    for _ in range(2):
        for batch in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            accelerator.backward(loss)
            optimizer.step()
    return model


def _host_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu", torch.float32) for name, tensor in state.items()}


def check_merged(expected: dict[str, torch.Tensor], merged: dict[str, torch.Tensor], how: str) -> None:
    """The merged state has the trained model's names and values, and loads into a plain TinyModel."""
    _check(sorted(merged) == sorted(expected), f"{how}: merged names {sorted(merged)} != {sorted(expected)}")
    fresh = TinyModel()
    differs = any(not torch.equal(fresh.state_dict()[name], expected[name]) for name in expected)
    _check(differs, f"{how}: the trained weights equal a fresh model's, so the check could not fail")
    fresh.load_state_dict(merged)
    for name, value in fresh.state_dict().items():
        _check(torch.allclose(value, expected[name]), f"{how}: {name} differs from the trained weights")


def _load(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def _merge_command(checkpoint: Path, target: Path, safe: bool) -> None:
    """``accel merge-weights`` as a user runs it (a fresh process, outside the process group)."""
    argv = [sys.executable, "-m", "accel.commands.cli", "merge-weights", str(checkpoint), str(target)]
    if not safe:
        argv.append("--unsafe_serialization")
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARIABLES}
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    _check(result.returncode == 0, f"accel merge-weights failed ({result.returncode}): {result.stderr[-3000:]}")


def merge_four_ways(accelerator: Accelerator, checkpoint: Path, out_root: Path,
                    expected: dict[str, torch.Tensor] | None) -> None:
    """Merge ``checkpoint`` with the function and the command, to safetensors and to a pickle file.

    Every rank takes part in the function (it waits for all of them); the main process runs the
    command and checks each result.
    """
    cases = (
        ("merge_fsdp_weights, safetensors", "function-safe", True, SAFE_WEIGHTS_NAME),
        ("merge_fsdp_weights, pickle", "function-bin", False, WEIGHTS_NAME),
        ("accel merge-weights, safetensors", "command-safe", True, SAFE_WEIGHTS_NAME),
        ("accel merge-weights, pickle", "command-bin", False, WEIGHTS_NAME),
    )
    for how, folder, safe, filename in cases:
        target = out_root / folder
        if how.startswith("merge_fsdp_weights"):
            merge_fsdp_weights(str(checkpoint), str(target), safe_serialization=safe)
        elif accelerator.is_main_process:
            _merge_command(checkpoint, target, safe)
        accelerator.wait_for_everyone()
        if expected is not None:
            written = target / filename
            _check(written.is_file(), f"{how}: {written.name} was not written (found {sorted(p.name for p in target.iterdir())})")
            check_merged(expected, _load(written), how)


def main() -> None:
    """Train, save sharded, merge four ways and check every merge; needs two or more processes."""
    if AcceleratorState._shared_state:
        AcceleratorState._reset_state()
    plugin = FullyShardedDataParallelPlugin(sharding_strategy="FULL_SHARD", state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(fsdp_plugin=plugin)
    if accelerator.num_processes < 2:
        raise SystemExit("test_merge_weights.py needs two or more processes (accel launch --num_processes 2)")
    model = train_sharded(accelerator)
    accelerator.wait_for_everyone()
    expected = _host_state(accelerator.get_state_dict(model))  # full weights (on the main process)

    # one folder for all processes: the main process makes it and tells the others
    holder = [tempfile.mkdtemp(prefix="accel-merge-weights-") if accelerator.is_main_process else None]
    broadcast_object_list(holder)
    root = Path(holder[0])
    try:
        gc.collect()  # FSDP keeps references to freed flat parameters until collected
        save_fsdp_model(plugin, accelerator, model, root)
        accelerator.wait_for_everyone()
        checkpoint = root / SHARDED_FOLDER
        _check(checkpoint.is_dir(), f"save_fsdp_model wrote no {SHARDED_FOLDER} folder in {root}")
        merge_four_ways(accelerator, checkpoint, root / "merged", expected if accelerator.is_main_process else None)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            print(f"test_merge_weights: 4 merges checked on {accelerator.num_processes} processes")
    finally:
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            shutil.rmtree(root, ignore_errors=True)
        accelerator.end_training()


if __name__ == "__main__":
    main()
