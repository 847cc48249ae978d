"""Checkpoints on the backend under test: exact resumption, naming and rotation, interrupted saves,
several processes, and sharded model export.

A resumed run must continue *bitwise*: the same losses (compared as ``float.hex``) and the same
weights as the run that never stopped, with the model and optimizer state on the device, the device
RNG (dropout) restored and the data order reproduced. Checkpoints are saved at epoch boundaries,
where that promise holds for any sampler (see ``accel.checkpointing``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from _training_utils import (
    host_weights,
    make_dataset,
    make_model,
    on_backend,  # noqa: F401 - fixture
    same_weights,
)
from accel import Accelerator
from accel import checkpointing as C
from accel.utils import ProjectConfiguration, set_seed


class Counter:
    """A registered object whose value tells which checkpoint was loaded."""

    def __init__(self, value: int = 0):
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = int(state["value"])


class Run:
    """Model (with dropout, so the device RNG matters), Adam, a step schedule and a shuffling loader."""

    def __init__(self, accelerator: Accelerator, batch_size: int = 8):
        self.accelerator = accelerator
        model = make_model(dropout=0.2)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        loader = DataLoader(make_dataset(length=48), batch_size=batch_size, shuffle=True)
        self.model, self.optimizer, self.scheduler, self.loader = accelerator.prepare(model, optimizer, scheduler, loader)

    def train(self, epochs: int = 1) -> list[str]:
        losses = []
        for _ in range(epochs):
            for x, y in self.loader:
                loss = F.mse_loss(self.model(x), y)
                self.accelerator.backward(loss)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()
                losses.append(float(loss.detach()).hex())
        return losses

    def weights(self) -> dict[str, torch.Tensor]:
        return host_weights(self.accelerator.unwrap_model(self.model))


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_round_trip_continues_bitwise_on_the_device(on_backend, device, tmp_path):
    run = Run(Accelerator())
    run.train(epochs=1)
    path = Path(run.accelerator.save_state(tmp_path / "ck"))
    assert sorted(os.listdir(path)) == sorted([
        "model.safetensors", "optimizer.bin", "scheduler.bin", "sampler.bin", "random_states_0.json",
        "random_states_0.pkl", C.MANIFEST_NAME,
    ])
    rng = json.loads((path / "random_states_0.json").read_text())
    if on_backend.device_type != "cpu":
        assert rng["device"]["backend"] == on_backend.name, "the device RNG state was not saved"
    saved = run.weights()

    first = run.train(epochs=2)  # new shuffles, dropout masks, Adam moments and LR steps
    after_first = run.weights()
    assert not same_weights(after_first, saved)

    run.accelerator.load_state(path)
    assert same_weights(run.weights(), saved)
    inner = run.accelerator.unwrap_model(run.model)
    assert all(p.device == device for p in inner.parameters())
    assert all(t.device == device for s in run.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)
               and t.dim() > 0), "optimizer state was not put back on the device"
    second = run.train(epochs=2)
    assert second == first, "the resumed run's losses differ from the uninterrupted run's"
    assert same_weights(run.weights(), after_first)
    steps = len(first) // 2 + len(second)  # one epoch before the save, two after it
    assert run.scheduler.get_last_lr() == [0.01 * 0.5 ** (steps // 3)]


def test_automatic_naming_rotation_and_newest_is_loaded(on_backend, device, tmp_path):
    config = ProjectConfiguration(project_dir=str(tmp_path / "project"), automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(project_config=config)
    run = Run(accelerator)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    root = tmp_path / "project" / "checkpoints"
    for i in range(4):
        counter.value = i
        run.train(epochs=1)
        assert accelerator.save_state() == str(root / f"checkpoint_{i}")
    assert sorted(os.listdir(root)) == ["checkpoint_2", "checkpoint_3"]  # the two newest
    newest = run.weights()

    counter.value = 99
    run.train(epochs=1)
    accelerator.load_state()  # no directory given: the highest number
    assert counter.value == 3 and same_weights(run.weights(), newest)
    assert accelerator.save_iteration == 4  # numbering continues after the newest
    accelerator.save_state()
    assert sorted(os.listdir(root)) == ["checkpoint_3", "checkpoint_4"]


@pytest.mark.parametrize("point", ["writing-files", "renaming-into-place"])
def test_interrupted_save_leaves_the_previous_checkpoint_loadable(on_backend, device, tmp_path, monkeypatch, point):
    accelerator = Accelerator()
    run = Run(accelerator)
    counter = Counter(10)
    accelerator.register_for_checkpointing(counter)
    target = tmp_path / "ck"
    run.train(epochs=1)
    accelerator.save_state(target)
    saved_weights = run.weights()
    saved_files = {p.name: p.read_bytes() for p in target.iterdir()}
    run.train(epochs=1)
    counter.value = 11

    with monkeypatch.context() as patch:
        if point == "writing-files":
            real_save = C.serialization.torch_save

            def failing_save(obj, path):
                if Path(path).name == "optimizer.bin":
                    raise OSError(28, "No space left on device")
                real_save(obj, path)

            patch.setattr(C.serialization, "torch_save", failing_save)
            error = "No space left"
        else:  # the old directory is already moved aside when the new one fails to take its place
            real_replace = os.replace

            def failing_replace(src, dst, *args, **kwargs):
                if Path(src).name.startswith(f".{target.name}.tmp-") and Path(dst) == target:
                    raise OSError(5, "Input/output error while renaming")
                return real_replace(src, dst, *args, **kwargs)

            patch.setattr(os, "replace", failing_replace)
            error = "Input/output error"
        with pytest.raises(OSError, match=error):
            accelerator.save_state(target)

    counter.value = 99
    if point == "writing-files":
        assert {p.name: p.read_bytes() for p in target.iterdir()} == saved_files
        assert _hidden(tmp_path) == []
        accelerator.load_state(target)
    else:
        assert not target.exists()
        with pytest.warns(UserWarning, match="moved aside"):
            accelerator.load_state(target)
    assert counter.value == 10 and same_weights(run.weights(), saved_weights)

    counter.value = 12  # the next save repairs what the interrupted one left behind
    accelerator.save_state(target)
    assert _hidden(tmp_path) == []
    counter.value = 99
    accelerator.load_state(target)
    assert counter.value == 12


@pytest.mark.world_size(2, 4)
def test_multi_process_save_and_load(device, world_size, rank, tmp_path):
    folder = tmp_path / "multi_process_save_and_load" / "ck"  # tmp_path is shared by the ranks
    accelerator = Accelerator()
    set_seed(0, device_specific=True)  # every rank draws different numbers
    run = Run(accelerator, batch_size=4)
    run.train(epochs=1)

    writes: list[str] = []
    real_save = C.serialization.safetensors_save

    def counting_save(tensors, path, metadata=None):
        writes.append(Path(path).name)
        real_save(tensors, path, metadata)

    C.serialization.safetensors_save = counting_save
    try:
        path = Path(accelerator.save_state(folder))
    finally:
        C.serialization.safetensors_save = real_save
    assert path == folder
    assert writes == (["model.safetensors"] if rank == 0 else []), "only the main process writes the model"
    assert sorted(os.listdir(path)) == sorted(
        ["model.safetensors", "optimizer.bin", "scheduler.bin", "sampler.bin", C.MANIFEST_NAME]
        + [f"random_states_{r}.{ext}" for r in range(world_size) for ext in ("json", "pkl")]
    )
    assert json.loads((path / C.MANIFEST_NAME).read_text())["num_processes"] == world_size
    assert _hidden(path.parent) == []

    draws = torch.cat([torch.rand(3), torch.rand(3, device=device).cpu()])
    first = run.train(epochs=1)
    after_first = run.weights()
    accelerator.load_state(path)
    again = torch.cat([torch.rand(3), torch.rand(3, device=device).cpu()])
    assert torch.equal(draws, again), "this rank's host or device RNG state was not restored"
    second = run.train(epochs=1)
    assert second == first and same_weights(run.weights(), after_first)

    from accel.utils import gather_object

    everyone = gather_object([draws.tolist()])
    assert len(everyone) == world_size and everyone[0] != everyone[1], "ranks were seeded alike"
    weights = torch.cat([w.reshape(-1) for w in run.weights().values()]).to(device)
    rows = accelerator.gather(weights[None])
    assert all(torch.equal(rows[0], rows[r]) for r in range(world_size)), "ranks disagree on the weights"


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 16)
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)])
        self.head = torch.nn.Linear(16, 4)


def test_save_model_sharding_round_trip(on_backend, device, tmp_path):
    from safetensors.torch import load_file

    accelerator = Accelerator()
    model = accelerator.prepare(Stack())
    assert next(model.parameters()).device == device
    expected = host_weights(accelerator.unwrap_model(model))
    out = tmp_path / "export"

    accelerator.save_model(model, out, max_shard_size="2KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert sorted(p.name for p in out.glob("*.safetensors")) == shards
    assert set(index["weight_map"]) == set(expected)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in expected.values())
    merged: dict[str, torch.Tensor] = {}
    for shard in shards:
        part = load_file(out / shard)
        assert sum(t.numel() * t.element_size() for t in part.values()) <= 2000 or len(part) == 1
        merged.update(part)
    assert same_weights(merged, expected)

    fresh = Stack().to(device)
    fresh.load_state_dict(merged)  # the export loads back into a model on the device
    assert same_weights(host_weights(fresh), expected)

    accelerator.save_model(model, out)  # one file now: the shards and the index go
    assert sorted(os.listdir(out)) == ["model.safetensors"]
    assert same_weights(load_file(out / "model.safetensors"), expected)
