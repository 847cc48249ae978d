"""accel.checkpointing: save_state/load_state round trips, refusal of pickled code, corrupt files, hooks,
save_model sharding, fp16 scaler state, per-rank RNG files, Accelerate's checkpoints, checksums.
Crashes, rotation and replacing a checkpoint: test_crashes.py."""

from __future__ import annotations

import copy
import json
import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel import checkpointing as C
from accel.checkpointing import CheckpointError
from accel.state import AcceleratorState, GradientState
from accel.utils import GradScalerKwargs
from dist_utils import run_distributed
from _checkpoint_helpers import Counter, auto, hidden, make, same_weights


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


# ---------------------------------------------------------------------------------------------- checksums
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
