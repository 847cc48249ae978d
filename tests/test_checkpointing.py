"""accel.checkpointing: save_state/load_state round trips, crashes (killed runs, killed saves), rotation,
refusal of pickled code, corrupt files, save_model sharding, fp16 scaler state, per-rank RNG files."""

from __future__ import annotations

import copy
import json
import os
import pickle
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel import checkpointing as C
from accel.checkpointing import CheckpointError
from accel.state import AcceleratorState, GradientState
from accel.utils import GradScalerKwargs, ProjectConfiguration
from tests.dist_utils import run_distributed
from tests.scripts import ckpt_train
from _waits import SAFETY_NET_S

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- helpers
class Counter:
    """A registered object: its value tells which checkpoint was loaded."""

    def __init__(self, value: int = 0):
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value, "history": [self.value, "x"], "t": torch.tensor([self.value])}

    def load_state_dict(self, state: dict) -> None:
        self.value = int(state["value"])


class Setup:
    def __init__(self, accelerator, model, optimizer, scheduler, loader, counter):
        self.accelerator, self.model, self.optimizer = accelerator, model, optimizer
        self.scheduler, self.loader, self.counter = scheduler, loader, counter

    def train(self, epochs: int = 1, max_steps: int | None = None) -> list[str]:
        losses: list[str] = []
        acc = self.accelerator
        for _ in range(epochs):
            for x, y in self.loader:
                with acc.autocast():
                    loss = torch.nn.functional.mse_loss(self.model(x), y)
                acc.backward(loss)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()
                losses.append(loss.float().item().hex())
                if max_steps is not None and len(losses) >= max_steps:
                    return losses
        return losses

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.accelerator.unwrap_model(self.model).state_dict().items()}


def make(n_models: int = 1, counter: int | None = 0, **accelerator_kwargs) -> Setup:
    accelerator = Accelerator(**accelerator_kwargs)
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1234)
    x = torch.randn(16, 4, generator=data)
    y = x.sum(dim=1, keepdim=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    for _ in range(n_models - 1):
        accelerator.prepare(torch.nn.Linear(2, 2))
    obj = None
    if counter is not None:
        obj = Counter(counter)
        accelerator.register_for_checkpointing(obj)
    return Setup(accelerator, model, optimizer, scheduler, loader, obj)


def auto(project: Path, total_limit: int | None = None) -> ProjectConfiguration:
    return ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True, total_limit=total_limit)


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------- round trip
def test_round_trip_is_bitwise_and_layout_is_accelerates(tmp_path):
    s = make()
    s.train(epochs=1)
    path = s.accelerator.save_state(tmp_path / "ck")
    assert path == str(tmp_path / "ck")
    assert sorted(os.listdir(path)) == sorted([
        "model.safetensors", "optimizer.bin", "scheduler.bin", "sampler.bin", "custom_checkpoint_0.pkl",
        "random_states_0.json", "random_states_0.pkl", C.MANIFEST_NAME,
    ])
    saved_weights, saved_opt = s.weights(), copy.deepcopy(s.optimizer.state_dict())
    s.counter.value = 1
    first = s.train(epochs=2)  # new shuffles, dropout masks, Adam moments and LR steps
    after_first = s.weights()
    assert not same_weights(after_first, saved_weights)

    s.accelerator.load_state(path)
    assert same_weights(s.weights(), saved_weights)
    assert torch.equal(s.optimizer.state_dict()["state"][0]["exp_avg"], saved_opt["state"][0]["exp_avg"])
    assert s.counter.value == 0
    assert s.loader.iteration == 1
    second = s.train(epochs=2)
    assert second == first  # float.hex: bitwise
    assert same_weights(s.weights(), after_first)
    assert s.scheduler.get_last_lr() == [0.01 * 0.5 ** 6]


def test_load_state_runs_in_place_with_strict_matching(tmp_path):
    s = make()
    s.accelerator.save_state(tmp_path / "ck")
    C.save(s.accelerator, {"0.weight": torch.zeros(8, 4)}, tmp_path / "ck" / "model.safetensors", safe_serialization=True)
    with pytest.raises(CheckpointError, match=r"(?s)model\.safetensors does not fit model 0.*Missing key"):
        s.accelerator.load_state(tmp_path / "ck", verify_checksums=False)  # the file was replaced on purpose


# ---------------------------------------------------------------------------------------------- crashes
def _train(project: Path, losses: Path, kill_at: int | None = None, resume: bool = False) -> int:
    """ckpt_train.py's run (32 steps, a checkpoint every 5) in a fresh forked process; the child's pid."""
    return ckpt_train.start_in_fork(str(project), str(losses), steps=32, save_every=5, kill_at=kill_at, resume=resume)


def _exit_status(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _losses(path: Path) -> dict[int, str]:
    return {int(step): value for step, value in (line.split() for line in path.read_text().splitlines())}


def test_sigkilled_run_resumes_identically(tmp_path):
    children = [_train(tmp_path / "ref", tmp_path / "ref.txt"), _train(tmp_path / "run", tmp_path / "run.txt", kill_at=23)]
    assert [_exit_status(pid) for pid in children] == [0, -signal.SIGKILL]  # the reference ran through; the run was killed
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_1", "checkpoint_2", "checkpoint_3"]  # total_limit=3

    assert _exit_status(_train(tmp_path / "run", tmp_path / "resumed.txt", resume=True)) == 0
    ref, run, res = _losses(tmp_path / "ref.txt"), _losses(tmp_path / "run.txt"), _losses(tmp_path / "resumed.txt")
    assert sorted(run) == list(range(1, 24)) and all(run[k] == ref[k] for k in run)
    # resumed from checkpoint_3 (step 20, mid-epoch: 4 of 8 batches seen) and continued bitwise
    assert sorted(res) == list(range(21, 33))
    assert [res[k] for k in res] == [ref[k] for k in res]
    # numbering continued after checkpoint_3 (steps 25 and 30), total_limit=3 still applies
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_3", "checkpoint_4", "checkpoint_5"]


def _die_in_child(action) -> int:
    """Run ``action`` in a forked child that may os._exit mid-way; return its exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            action()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _crash_at(point: str):
    """A patch that kills the process while writing files, or at the first or second rename."""
    real_replace, real_save = os.replace, C.serialization.torch_save
    calls = {"save": 0, "replace": 0}

    def save(obj, path):
        calls["save"] += 1
        if point == "writing" and calls["save"] == 2:
            os._exit(17)
        real_save(obj, path)

    def replace(src, dst):
        calls["replace"] += 1
        if point == f"replace-{calls['replace']}":
            os._exit(17)
        real_replace(src, dst)

    def install():
        C.serialization.torch_save = save
        os.replace = replace  # the os module itself: the child dies anyway

    return install


@pytest.mark.parametrize("point", ["writing", "replace-1"])  # replace-1: renaming the temp dir into place
def test_killed_mid_save_keeps_previous_checkpoint_automatic(tmp_path, point):
    s = make(counter=10, project_config=auto(tmp_path))
    s.accelerator.save_state()
    s.counter.value = 11

    def doomed():
        _crash_at(point)()
        s.accelerator.save_state()

    assert _die_in_child(doomed) == 17
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["checkpoint_0"]
    assert len(hidden(root)) == 1 and ".checkpoint_1.tmp-" in hidden(root)[0]

    s.counter.value = 99
    s.accelerator.load_state()  # the temp dir is not a candidate
    assert s.counter.value == 10
    assert s.accelerator.project_configuration.iteration == 1
    s.accelerator.save_state()
    assert hidden(root) == []  # cleaned up by the next save
    assert sorted(os.listdir(root)) == ["checkpoint_0", "checkpoint_1"]


# replace-1 moves the old directory aside, replace-2 renames the new one into place
@pytest.mark.parametrize("point", ["writing", "replace-1", "replace-2"])
def test_killed_while_replacing_an_existing_directory(tmp_path, point):
    s = make(counter=10)
    target = tmp_path / "ck"
    s.accelerator.save_state(target)
    s.counter.value = 11

    def doomed():
        _crash_at(point)()
        s.accelerator.save_state(target)

    assert _die_in_child(doomed) == 17
    s.counter.value = 99
    if point == "replace-2":  # old moved aside, new not yet renamed in: load finds the moved copy
        assert not target.exists()
        with pytest.warns(UserWarning, match="moved aside"):
            s.accelerator.load_state(target)
    else:
        s.accelerator.load_state(target)
    assert s.counter.value == 10

    s.counter.value = 12
    s.accelerator.save_state(target)
    assert hidden(tmp_path) == []
    s.counter.value = 99
    s.accelerator.load_state(target)
    assert s.counter.value == 12


def test_exception_mid_save_leaves_previous_and_no_temp(tmp_path, monkeypatch):
    s = make(counter=5)
    target = tmp_path / "ck"
    s.accelerator.save_state(target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    real = C.serialization.torch_save

    def failing(obj, path):
        if Path(path).name == "optimizer.bin":
            raise OSError(28, "No space left on device")
        real(obj, path)

    monkeypatch.setattr(C.serialization, "torch_save", failing)
    s.counter.value = 6
    with pytest.raises(OSError, match="No space left"):
        s.accelerator.save_state(target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert hidden(tmp_path) == []
    assert s.accelerator.project_configuration.iteration == 1  # only the successful save counted


def test_unloadable_state_is_refused_at_save_time(tmp_path):
    import numpy as np

    class NumpyState:
        def state_dict(self):
            return {"best": np.float64(0.5)}

        def load_state_dict(self, state):
            pass

    s = make(counter=None)
    s.accelerator.register_for_checkpointing(NumpyState())
    with pytest.raises(TypeError, match=r"registered object 0 \(NumpyState\).*\['best'\].*numpy"):
        s.accelerator.save_state(tmp_path / "ck")
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------------- rotation
def test_total_limit_keeps_newest_and_load_picks_highest_number(tmp_path):
    s = make(counter=0, project_config=auto(tmp_path, total_limit=2))
    for i in range(4):
        s.counter.value = i
        assert s.accelerator.save_state() == os.path.join(str(tmp_path), "checkpoints", f"checkpoint_{i}")
    root = tmp_path / "checkpoints"
    assert sorted(os.listdir(root)) == ["checkpoint_2", "checkpoint_3"]
    assert s.accelerator.save_iteration == 4
    s.counter.value = 99
    s.accelerator.load_state()
    assert s.counter.value == 3

    # by number, not by name or mtime; a temp dir or a directory without manifest is never picked
    s.accelerator.project_configuration.total_limit = None
    s.accelerator.project_configuration.iteration = 9
    s.counter.value = 9
    s.accelerator.save_state()
    s.counter.value = 10
    s.accelerator.save_state()
    os.utime(root / "checkpoint_9", (2**31, 2**31))
    (root / ".checkpoint_11.tmp-abc-123").mkdir()
    (root / "checkpoint_12").mkdir()
    s.counter.value = 99
    s.accelerator.load_state()
    assert s.counter.value == 10
    assert s.accelerator.save_iteration == 13  # numbering continues after the highest existing
    with pytest.raises(ValueError, match="already exists"):
        s.accelerator.project_configuration.iteration = 10
        s.accelerator.save_state()


# ---------------------------------------------------------------------------------------------- safety
class Payload:
    """Unpickling this writes a marker file: what a malicious checkpoint does."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


@pytest.mark.parametrize("name", ["optimizer.bin", "custom_checkpoint_0.pkl", "random_states_0.pkl", "sampler.bin"])
@pytest.mark.parametrize("container", ["torch.save", "pickle"])
def test_pickled_code_is_refused(tmp_path, name, container):
    s = make()
    folder = Path(s.accelerator.save_state(tmp_path / "ck"))
    marker = tmp_path / "PWNED"
    payload = {"state": Payload(str(marker))}
    if name == "random_states_0.pkl":
        (folder / "random_states_0.json").unlink()  # an Accelerate-style RNG file instead
    if container == "torch.save":
        torch.save(payload, folder / name)
    else:
        (folder / name).write_bytes(pickle.dumps(payload))
    weights = s.weights()
    s.train(max_steps=1)
    trained = s.weights()
    with pytest.raises(CheckpointError) as info:
        s.accelerator.load_state(folder, verify_checksums=False)  # the loader's own refusal, not the checksum's
    assert str(folder / name) in str(info.value)
    assert "refused" in str(info.value) or "corrupt" in str(info.value)
    assert not marker.exists()
    assert same_weights(s.weights(), trained) and not same_weights(trained, weights)  # nothing applied


@pytest.mark.parametrize(
    "name, damage, message",
    [
        ("model.safetensors", "truncate", "is corrupt or truncated"),
        ("optimizer.bin", "garbage", "is corrupt or truncated"),
        ("scheduler.bin", "truncate", "is corrupt or truncated"),
        ("scheduler.bin", "delete", "is missing: expected the state_dict of scheduler 0"),
        ("random_states_0.json", "truncate", "not valid JSON"),
        ("custom_checkpoint_0.pkl", "delete", "is missing"),
        (C.MANIFEST_NAME, "delete", "incomplete accel checkpoint"),
        (C.MANIFEST_NAME, "garbage", "not valid JSON"),
    ],
)
def test_corrupt_or_missing_files_are_named(tmp_path, name, damage, message):
    s = make()
    folder = Path(s.accelerator.save_state(tmp_path / "ck"))
    path = folder / name
    if damage == "delete":
        path.unlink()
    elif damage == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(b"\x00garbage\xff" * 7)
    s.train(max_steps=1)
    trained = s.weights()
    with pytest.raises(CheckpointError, match=message) as info:
        s.accelerator.load_state(folder, verify_checksums=False)  # each loader's own check, below the checksums
    assert str(path) in str(info.value)
    assert same_weights(s.weights(), trained)
    if name != C.MANIFEST_NAME:  # with verification (the default) the damaged file is named before anything is read
        with pytest.raises(CheckpointError, match="failed verification") as info:
            s.accelerator.load_state(folder)
        assert str(path) in str(info.value)
        assert same_weights(s.weights(), trained)


def test_checkpoint_must_fit_what_was_prepared(tmp_path):
    s = make()
    folder = s.accelerator.save_state(tmp_path / "ck")
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    two = make(n_models=2)
    with pytest.raises(CheckpointError, match="holds 1 model but 2 models were prepared"):
        two.accelerator.load_state(folder)
    two.accelerator._models.pop()
    two.accelerator.register_for_checkpointing(Counter())
    with pytest.raises(CheckpointError, match="holds 1 registered object but 2 registered objects were prepared"):
        two.accelerator.load_state(folder)


def test_path_errors(tmp_path):
    s = make()
    with pytest.raises(CheckpointError, match="does not exist"):
        s.accelerator.load_state(tmp_path / "missing")
    with pytest.raises(ValueError, match="needs an output_dir"):
        s.accelerator.save_state()
    with pytest.raises(ValueError, match="needs an input_dir"):
        s.accelerator.load_state()
    with pytest.raises(ValueError, match="weights_only=False"):
        s.accelerator.save_state(tmp_path / "ck")
        s.accelerator.load_state(tmp_path / "ck", load_kwargs={"weights_only": False})


def test_empty_checkpoints_folder(tmp_path):
    s = make(project_config=auto(tmp_path))
    with pytest.raises(CheckpointError, match="no checkpoint_<N> directory"):
        s.accelerator.load_state()


# ---------------------------------------------------------------------------------------------- hooks and dirs
def test_pre_hooks_see_the_checkpoint_and_can_be_removed(tmp_path):
    s = make()
    seen = []

    def save_hook(models, weights, output_dir):
        seen.append(("save", len(models), len(weights), output_dir))
        Path(output_dir, "extra.json").write_text(json.dumps({"n": len(models)}))

    def load_hook(models, input_dir):
        seen.append(("load", len(models), json.loads(Path(input_dir, "extra.json").read_text())["n"]))

    save_handle = s.accelerator.register_save_state_pre_hook(save_hook)
    s.accelerator.register_load_state_pre_hook(load_hook)
    folder = Path(s.accelerator.save_state(tmp_path / "ck"))
    assert (folder / "extra.json").exists()  # written into the temp dir, renamed with the rest
    assert seen[0][:3] == ("save", 1, 1) and ".ck.tmp-" in seen[0][3]
    s.accelerator.load_state(folder)
    assert seen[1] == ("load", 1, 1)
    save_handle.remove()
    s.accelerator.save_state(tmp_path / "ck2")
    assert len(seen) == 2 and not (tmp_path / "ck2" / "extra.json").exists()


def test_hook_that_saves_the_model_itself(tmp_path):
    s = make()
    s.accelerator.register_save_state_pre_hook(lambda models, weights, out: weights.pop())
    folder = Path(s.accelerator.save_state(tmp_path / "ck"))
    assert not (folder / "model.safetensors").exists()
    s.accelerator.register_load_state_pre_hook(lambda models, inp: models.pop())
    s.accelerator.load_state(folder)  # counts match once the load hook takes its model


def test_replacing_a_directory_keeps_user_files_and_drops_stale_state(tmp_path):
    s = make()
    target = tmp_path / "ck"
    s.accelerator.save_state(target)
    (target / "notes.txt").write_text("mine")
    (target / "model_1.safetensors").write_bytes(b"stale")
    s.accelerator.save_state(target, safe_serialization=False)
    names = sorted(os.listdir(target))
    assert "notes.txt" in names and (target / "notes.txt").read_text() == "mine"
    assert "model_1.safetensors" not in names and "model.safetensors" not in names
    assert "pytorch_model.bin" in names
    s.accelerator.load_state(target)


# ---------------------------------------------------------------------------------------------- save, save_model
def test_save_is_atomic_and_supports_safetensors(tmp_path):
    from safetensors.torch import load_file

    s = make()
    s.accelerator.save({"a": torch.arange(3), "step": 4}, tmp_path / "obj.pt")
    assert torch.load(tmp_path / "obj.pt", weights_only=True)["step"] == 4
    weight = torch.randn(3, 3)
    s.accelerator.save({"w": weight, "t": weight.t()}, tmp_path / "w.safetensors", safe_serialization=True)
    loaded = load_file(tmp_path / "w.safetensors")
    assert torch.equal(loaded["w"], weight) and torch.equal(loaded["t"], weight.t())
    with pytest.raises(TypeError, match=r"\['step'\] is a int"):
        s.accelerator.save({"w": weight, "step": 1}, tmp_path / "bad.safetensors", safe_serialization=True)
    assert sorted(os.listdir(tmp_path)) == ["obj.pt", "w.safetensors"]  # no temp files left


class Stack(torch.nn.Module):
    def __init__(self, tied: bool = False):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 16)
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)])
        self.head = torch.nn.Linear(16, 16, bias=False)
        if tied:
            self.head.weight = self.embed.weight


def test_save_model_shards_with_hf_index(tmp_path):
    from safetensors.torch import load_file

    s = make()
    model = Stack()
    expected = model.state_dict()
    out = tmp_path / "export"
    s.accelerator.save_model(model, out, max_shard_size="2KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert sorted(p.name for p in out.glob("*.safetensors")) == shards
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in expected.values())
    merged = {}
    for shard in shards:
        part = load_file(out / shard)
        sizes = sum(t.numel() * t.element_size() for t in part.values())
        assert sizes <= 2000 or len(part) == 1
        assert all(index["weight_map"][k] == shard for k in part)
        merged.update(part)
    assert same_weights(merged, expected)

    s.accelerator.save_model(model, out, max_shard_size="5KB")  # fewer shards: the old ones go
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(p.name for p in out.glob("*.safetensors")) == sorted(set(index["weight_map"].values()))
    s.accelerator.save_model(model, out)  # one file: shards and index go
    assert sorted(os.listdir(out)) == ["model.safetensors"]
    assert same_weights(load_file(out / "model.safetensors"), expected)

    s.accelerator.save_model(model, out, max_shard_size=3000, safe_serialization=False)
    bins = sorted(p.name for p in out.glob("pytorch_model-*.bin"))
    assert len(bins) > 1 and (out / "pytorch_model.bin.index.json").exists() and (out / "model.safetensors").exists()
    merged = {}
    for name in bins:
        merged.update(torch.load(out / name, weights_only=True))
    assert same_weights(merged, expected)


def test_tied_weights_save_and_reload(tmp_path):
    from safetensors.torch import load_file

    s = make()
    model = Stack(tied=True)
    s.accelerator.save_model(model, tmp_path / "export")
    loaded = load_file(tmp_path / "export" / "model.safetensors")
    assert torch.equal(loaded["head.weight"], loaded["embed.weight"])
    fresh = Stack(tied=True)
    fresh.load_state_dict(loaded, strict=True)
    assert fresh.head.weight is fresh.embed.weight and torch.equal(fresh.head.weight, model.embed.weight)

    AcceleratorState._reset_state(reset_partial_state=True)
    acc = Accelerator()
    prepared = acc.prepare(Stack(tied=True))
    reference = {k: v.clone() for k, v in prepared.state_dict().items()}
    acc.save_state(tmp_path / "ck")
    with torch.no_grad():
        prepared.embed.weight.add_(1.0)
    acc.load_state(tmp_path / "ck")
    assert same_weights(prepared.state_dict(), reference)
    assert prepared.head.weight is prepared.embed.weight


def test_parse_size_and_bad_max_shard_size(tmp_path):
    assert C.parse_size("10GB") == 10**10
    assert C.parse_size("200MB") == 200 * 10**6
    assert C.parse_size("5KB") == 5000
    assert C.parse_size("2GiB") == 2 * 2**30
    assert C.parse_size(" 1.5 mb ") == 1_500_000
    assert C.parse_size(1234) == 1234
    s = make()
    with pytest.raises(ValueError, match="max_shard_size='10 gigs'"):
        s.accelerator.save_model(Stack(), tmp_path / "x", max_shard_size="10 gigs")
    for bad in ("", "GB", "-5MB", "0"):
        with pytest.raises(ValueError, match="max_shard_size"):
            C.parse_size(bad)
    with pytest.raises(TypeError):
        C.parse_size(2.5)
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------------------------- fp16
def test_fp16_scaler_state_is_saved_and_restored(tmp_path):
    s = make(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0, growth_interval=2)])
    scaler = s.accelerator.scaler
    assert s.accelerator.mixed_precision == "fp16" and scaler is not None
    s.train(epochs=1)
    saved = scaler.state_dict()
    assert saved["scale"] != 1024.0 or saved["_growth_tracker"] != 0  # training moved it
    folder = Path(s.accelerator.save_state(tmp_path / "ck"))
    assert (folder / "scaler.pt").exists()
    scaler.update(new_scale=3.0)
    assert scaler.get_scale() == 3.0
    first = s.train(epochs=1)
    s.accelerator.load_state(folder)
    assert scaler.state_dict() == saved
    assert s.train(epochs=1) == first

    (folder / "scaler.pt").unlink()
    with pytest.raises(CheckpointError, match="scaler.pt is missing"):
        s.accelerator.load_state(folder)


# ---------------------------------------------------------------------------------------------- two ranks
def _two_rank_round_trip(folder: str) -> dict:
    from accel import Accelerator
    from accel.data_loader import get_sampler
    from accel.utils import set_seed

    accelerator = Accelerator()
    set_seed(0, device_specific=True)  # ranks draw different numbers
    data = torch.Generator().manual_seed(3)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(16, 4, generator=data)), batch_size=2, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for (x,) in loader:
        accelerator.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    path = accelerator.save_state(folder)
    files = sorted(os.listdir(path))
    generator = get_sampler(loader).generator
    first = torch.rand(3).tolist() + torch.randint(0, 10**6, (2,), generator=generator).tolist()
    accelerator.load_state(path)
    again = torch.rand(3).tolist() + torch.randint(0, 10**6, (2,), generator=generator).tolist()
    weight = accelerator.unwrap_model(model).weight.detach().clone().tolist()
    return {"path": path, "files": files, "first": first, "again": again, "weight": weight}


def test_two_ranks_write_one_rng_file_each(tmp_path):
    rank0, rank1 = run_distributed(_two_rank_round_trip, 2, str(tmp_path / "ck"))
    assert rank0["path"] == rank1["path"]
    assert rank0["files"] == sorted([
        "model.safetensors", "optimizer.bin", "sampler.bin", "random_states_0.json", "random_states_1.json",
        "random_states_0.pkl", "random_states_1.pkl", C.MANIFEST_NAME,
    ])
    for rank in (rank0, rank1):
        assert rank["again"] == rank["first"]  # this rank's torch and sampler generator states came back
    assert rank0["first"][:3] != rank1["first"][:3]
    assert rank0["weight"] == rank1["weight"]
    manifest = json.loads((tmp_path / "ck" / C.MANIFEST_NAME).read_text())
    assert manifest["num_processes"] == 2 and hidden(tmp_path) == []


# ---------------------------------------------------------------------------------------------- Accelerate's checkpoints
def test_reads_a_checkpoint_written_by_accelerate(tmp_path):
    accelerate = pytest.importorskip("accelerate", reason="Hugging Face accelerate (the reference) is not installed")

    def build(lib):
        acc = lib.Accelerator()
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.Adam(model.parameters())
        sched = torch.optim.lr_scheduler.StepLR(opt, 2)
        model, opt, sched = acc.prepare(model, opt, sched)
        counter = Counter(7)
        acc.register_for_checkpointing(counter)
        return acc, model, opt, sched, counter

    ref, model, opt, sched, _ = build(accelerate)
    for _ in range(3):
        ref.backward(model(torch.ones(1, 3)).sum())
        opt.step()
        sched.step()
        opt.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref.save_state(str(tmp_path / "acc"))
    expected_weight, expected_rand = model.weight.detach().clone(), torch.rand(2)
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)

    ours, model2, opt2, sched2, counter = build(__import__("accel"))
    counter.value = 0
    with pytest.warns(UserWarning, match="written by Accelerate"):
        ours.load_state(tmp_path / "acc")
    assert torch.equal(model2.weight, expected_weight) and counter.value == 7
    assert sched2.state_dict()["last_epoch"] == 3 and torch.equal(torch.rand(2), expected_rand)


# ---------------------------------------------------------------------------------------------- issue 20: faults
ROTATION_SCRIPT = REPO / "tests" / "scripts" / "rotation_fresh.py"


def _rotation_in_fresh_process(base: Path, *libs: str) -> dict[str, dict[str, dict]]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("ACCEL_DEVICE", None)
    done = subprocess.run([sys.executable, str(ROTATION_SCRIPT), str(base), *libs], env=env, capture_output=True,
                          text=True, timeout=SAFETY_NET_S)
    assert done.returncode == 0, done.stderr[-3000:]
    rows: dict[str, dict[str, dict]] = {lib: {} for lib in libs}
    for row in map(json.loads, done.stdout.splitlines()):
        rows[row.pop("lib")][row["scenario"]] = row
    return rows


def test_total_limit_in_a_fresh_process_keeps_the_checkpoint_it_wrote(tmp_path):
    """A new process (no load_state) saving into a project that already holds checkpoints: each save
    returns a folder that exists, and rotation retires the folders Accelerate retires, in its order."""
    with_reference = __import__("importlib").util.find_spec("accelerate") is not None
    rows = _rotation_in_fresh_process(tmp_path, "accel", *(["accelerate"] if with_reference else []))
    ours = rows["accel"]
    for row in ours.values():
        for path, exists in row["saves"]:
            assert path == "error" or exists, row
    # the case: checkpoint_5..7 exist; checkpoint_0 is written and kept (5, then 0, retired later)
    assert ours["gap"]["saves"] == [["checkpoints/checkpoint_0", True], ["checkpoints/checkpoint_1", True]]
    assert ours["gap"]["left"] == {"checkpoint_1": "new", "checkpoint_6": "old", "checkpoint_7": "old"}
    assert ours["over"]["left"] == {"checkpoint_1": "new", "checkpoint_3": "old", "checkpoint_4": "old"}
    # checkpoint_0..2 exist: the first save replaces checkpoint_0 (retired anyway); the second finds
    # checkpoint_1 in its way and raises before deleting anything (Accelerate deletes the new checkpoint_0 first)
    assert ours["full"]["saves"] == [["checkpoints/checkpoint_0", True], ["error", True]]
    assert ours["full"]["left"] == {"checkpoint_0": "new", "checkpoint_1": "old", "checkpoint_2": "old"}
    if with_reference:
        reference = rows["accelerate"]
        for name in ("gap", "over"):
            assert ours[name] == reference[name]
        assert ours["full"]["saves"] == reference["full"]["saves"]


def test_replacing_a_read_only_checkpoint_leaves_no_old_copy(tmp_path):
    s = make()
    folder = tmp_path / "ck"
    s.accelerator.save_state(folder)
    (folder / "notes.txt").write_text("mine")
    (folder / "sub").mkdir()
    (folder / "sub" / "kept.txt").write_text("mine too")
    for path in [folder / "sub", folder]:
        for entry in path.iterdir():
            entry.chmod(0o444) if entry.is_file() else None
        path.chmod(0o555)
    try:
        s.train(max_steps=1)
        s.accelerator.save_state(folder)
    finally:
        for path in [folder, folder / "sub"]:
            if path.exists():
                path.chmod(0o755)
    assert hidden(tmp_path) == []  # no .ck.old-* (nor .tmp-*) folder left behind
    assert (folder / "notes.txt").read_text() == "mine" and (folder / "sub" / "kept.txt").read_text() == "mine too"
    s.accelerator.load_state(folder)


def test_manifest_has_a_checksum_per_file(tmp_path):
    s = make()
    folder = Path(s.accelerator.save_state(tmp_path / "ck"))
    manifest = json.loads((folder / C.MANIFEST_NAME).read_text())
    files = sorted(p.name for p in folder.iterdir() if p.name != C.MANIFEST_NAME)
    assert sorted(manifest["checksums"]) == files
    import hashlib

    for name, entry in manifest["checksums"].items():
        data = (folder / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def test_a_flipped_bit_is_detected_and_named(tmp_path, monkeypatch):
    s = make()
    folder = Path(s.accelerator.save_state(tmp_path / "ck"))
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10  # one bit of the last weight: still a valid safetensors file, same size
    path.write_bytes(bytes(data))
    s.train(max_steps=1)
    trained = s.weights()
    with pytest.raises(CheckpointError, match="does not match its sha256 checksum") as info:
        s.accelerator.load_state(folder)
    assert str(path) in str(info.value) and "verify_checksums=False" in str(info.value)
    assert same_weights(s.weights(), trained)  # nothing applied
    # the escape hatches for very large checkpoints: the argument, or the environment variable
    s.accelerator.load_state(folder, verify_checksums=False)
    assert not same_weights(s.weights(), trained)
    monkeypatch.setenv(C.CHECKSUM_ENV, "0")
    s.accelerator.load_state(folder)
    monkeypatch.setenv(C.CHECKSUM_ENV, "0")
    s.accelerator.save_state(tmp_path / "unchecked")
    assert "checksums" not in json.loads((tmp_path / "unchecked" / C.MANIFEST_NAME).read_text())


def _two_ranks_load_a_damaged_checkpoint(folder: str) -> list[str]:
    from accel import Accelerator

    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(torch.nn.Linear(4, 1), torch.optim.SGD(torch.nn.Linear(4, 1).parameters(), lr=0.1))
    path = Path(accelerator.save_state(folder))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:  # only the verifying process could notice: every process must raise
        rng = path / "random_states_1.json"
        rng.write_text(rng.read_text().replace("1", "2", 1))
    accelerator.wait_for_everyone()
    errors = []
    try:
        accelerator.load_state(path)
    except CheckpointError as exc:
        errors.append(str(exc))
    accelerator.load_state(path, verify_checksums=False)  # the ranks are still in step afterwards
    return errors


def test_a_damaged_file_fails_the_load_on_every_rank(tmp_path):
    rank0, rank1 = run_distributed(_two_ranks_load_a_damaged_checkpoint, 2, str(tmp_path / "ck"))
    for errors in (rank0, rank1):
        assert len(errors) == 1 and str(tmp_path / "ck" / "random_states_1.json") in errors[0], errors
        assert "does not match its sha256 checksum" in errors[0]
