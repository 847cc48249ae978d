"""accel.utils.modeling: sizes, budgets, device maps, tied weights, checkpoint loading, bad input."""

from __future__ import annotations

import json
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

from _fake_backend import NoDevice

from accel.big_modeling import init_empty_weights
from accel.backends import Backend
from accel.utils import modeling
from accel.utils.modeling import placement
from accel.utils.modeling import memory_map
from accel.utils.modeling import (
    check_device_map,
    clean_device_map,
    compute_module_sizes,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
    load_checkpoint_in_model,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)

    def forward(self, x):
        return self.linear2(self.batchnorm(self.linear1(x)))


def _stack(n: int, width: int = 8) -> nn.Sequential:
    return nn.Sequential(OrderedDict((f"l{i}", nn.Linear(width, width)) for i in range(n)))


class FakeAcceleratorBackend(NoDevice, Backend):
    """Two 'xpu' devices with fixed free memory: enough to check ids and budgets come from the backend."""

    name = "fakexpu"
    device_type = "xpu"

    def __init__(self, free=(1000, 2000)):
        super().__init__()
        self.free = free

    def _probe(self):
        from accel.backends import Availability

        return Availability(True, "fake")

    def device_count(self):
        return len(self.free)

    def mem_get_info(self, index=None):
        return self.free[index], 10 * self.free[index]


def test_sizes_dtypes_and_file_sizes():
    sizes = compute_module_sizes(Small())
    assert sizes[""] == 236 and sizes["linear1"] == 64 and sizes["batchnorm.num_batches_tracked"] == 8
    half = compute_module_sizes(Small(), dtype=torch.float16)
    assert half["linear2"] == 50 and half["batchnorm.num_batches_tracked"] == 8  # ints never converted
    assert dtype_byte_size(torch.bfloat16) == 2 and dtype_byte_size(torch.bool) == 1 / 8
    assert convert_file_size_to_int("1.5GB") == 1_500_000_000 and convert_file_size_to_int("2GiB") == 2 * 2**30
    assert convert_file_size_to_int("8Mb") == 1_000_000
    for bad in ("5MBB", "-1GB", "GB", "5k0MB"):
        with pytest.raises(ValueError, match="not in a valid format"):
            convert_file_size_to_int(bad)


def test_named_module_tensors_leave_the_module_untouched():
    model = Small()
    model.register_buffer("scratch", torch.zeros(2), persistent=False)
    names = [n for n, _ in named_module_tensors(model, recurse=True, remove_non_persistent=True)]
    assert "scratch" not in names and "batchnorm.running_mean" in names
    assert "scratch" in model._non_persistent_buffers_set and "scratch" not in model.state_dict()


def test_set_module_tensor_to_device_meta_round_trip_and_errors():
    model = Small()
    set_module_tensor_to_device(model, "linear1.weight", "meta")
    assert model.linear1.weight.device.type == "meta" and isinstance(model.linear1.weight, nn.Parameter)
    with pytest.raises(ValueError, match="meta device"):
        set_module_tensor_to_device(model, "linear1.weight", "cpu")
    value = torch.randn(4, 3)
    set_module_tensor_to_device(model, "linear1.weight", "cpu", value=value)
    assert torch.equal(model.linear1.weight, value) and model.linear1.weight.requires_grad
    with pytest.raises(ValueError, match=r'shape torch.Size\(\[2, 2\]\) in "weight"'):
        set_module_tensor_to_device(model, "linear1.weight", "cpu", value=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="nope"):
        set_module_tensor_to_device(model, "linear1.nope", "cpu")
    set_module_tensor_to_device(model, "linear1.weight", "cpu", value=value, dtype=torch.float16)
    assert model.linear1.weight.dtype == torch.float16


def test_tied_parameters_found_and_retied():
    model = _stack(4)
    model.l2.weight = model.l0.weight
    assert find_tied_parameters(model) == [["l0.weight", "l2.weight"]]
    set_module_tensor_to_device(model, "l2.weight", "meta")  # breaks the tie, as loading does
    assert model.l2.weight is not model.l0.weight
    retie_parameters(model, [["l0.weight", "l2.weight"]])
    assert model.l2.weight is model.l0.weight


def test_cpu_disk_device_map_keeps_room_for_the_largest_layer():
    model = _stack(6)  # 6 x 288 bytes
    device_map = infer_auto_device_map(model, max_memory={"cpu": 288 * 4})
    # the CPU keeps one layer's room free for onloading a disk layer: 3 layers fit, 3 go to disk
    assert device_map == {"l0": "cpu", "l1": "cpu", "l2": "cpu", "l3": "disk", "l4": "disk", "l5": "disk"}
    assert infer_auto_device_map(model, max_memory={"cpu": 10**6}) == {"": "cpu"}


def test_device_map_splits_unless_told_not_to_and_ties_stay_together():
    model = nn.Sequential(Small(), Small(), Small())
    assert infer_auto_device_map(model, max_memory={0: 500, 1: 500}) == {
        "0": 0, "1.linear1": 0, "1.batchnorm": 0, "1.linear2": 1, "2": 1,
    }
    assert infer_auto_device_map(model, max_memory={0: 500, 1: 500}, no_split_module_classes={"Small"}) == {
        "0": 0, "1": 1, "2": 1,
    }
    tied = nn.Sequential(OrderedDict([("a", Small()), ("b", Small()), ("c", Small())]))
    tied.c.linear2.weight = tied.a.linear2.weight
    device_map = infer_auto_device_map(tied, max_memory={0: 400, 1: 500})
    assert device_map["c.linear2"] == device_map["a"] == 0


def test_device_map_works_on_meta_models():
    with init_empty_weights():
        model = _stack(3, width=1000)
    assert model.l0.weight.device.type == "meta"
    device_map = infer_auto_device_map(model, max_memory={"cpu": "9MB"})
    assert set(device_map.values()) == {"cpu", "disk"}


def test_integer_ids_and_free_memory_come_from_the_active_backend(monkeypatch):
    fake = FakeAcceleratorBackend(free=(1000, 2000))
    monkeypatch.setattr(memory_map, "_backend", lambda: fake)
    monkeypatch.setattr(placement, "_backend", lambda: fake)  # what a device-map integer means
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: None)  # no real xpu to initialise
    budget = get_max_memory()
    assert budget[0] == 1000 and budget[1] == 2000 and "cpu" in budget
    assert list(budget)[:2] == [0, 1]
    assert modeling._as_torch_device(1) == torch.device("xpu", 1)
    with pytest.raises(ValueError, match="out of range"):
        modeling._as_torch_device(2)


def test_balanced_memory_spreads_over_devices(monkeypatch):
    monkeypatch.setattr(memory_map, "_backend", lambda: FakeAcceleratorBackend())
    model = Small()
    assert get_balanced_memory(model, max_memory={0: 300, 1: 300}) == {0: 215, 1: 300}
    assert get_balanced_memory(model, max_memory={0: 0, 1: 300, 2: 300}) == {0: 0, 1: 215, 2: 300}
    assert get_balanced_memory(model, max_memory={"cpu": 1000}) == {"cpu": 1000}


def test_clean_device_map_merges_children():
    assert clean_device_map({"a.x": 0, "a.y": 0, "b.x": 1, "b.y": "cpu"}) == {"a": 0, "b.x": 1, "b.y": "cpu"}
    assert clean_device_map({"a": "cpu", "b": "cpu"}) == {"": "cpu"}


@pytest.mark.filterwarnings("ignore:The following device_map keys")
def test_check_device_map_names_missing_and_doubled_modules():
    model = Small()
    check_device_map(model, {"linear1": "cpu", "batchnorm": "cpu", "linear2": "disk"})
    with pytest.raises(ValueError, match="batchnorm.weight"):
        check_device_map(model, {"linear1": "cpu", "linear2": "cpu"})
    with pytest.raises(ValueError, match="'linear1.weight'.*two devices"):
        check_device_map(model, {"linear1": "cpu", "linear1.weight": "disk", "batchnorm": "cpu", "linear2": "cpu"})
    with pytest.raises(ValueError, match="two devices"):
        check_device_map(model, {"": "cpu", "linear2": "disk"})
    with pytest.warns(UserWarning, match="typo"):
        check_device_map(model, {"": "cpu", "typo": "cpu"})


def _sharded(tmp_path, model: nn.Module, fmt: str) -> str:
    """Shard ``model`` one top-level module per file, with an index JSON."""
    weight_map = {}
    groups: dict[str, dict] = {}
    for key, tensor in model.state_dict().items():
        groups.setdefault(key.split(".")[0], {})[key] = tensor.clone()
    for i, (name, tensors) in enumerate(groups.items()):
        fname = f"shard-{i}.{'safetensors' if fmt == 'safetensors' else 'bin'}"
        if fmt == "safetensors":
            save_file(tensors, str(tmp_path / fname), metadata={"format": "pt"})
        else:
            torch.save(tensors, tmp_path / fname)
        weight_map.update({k: fname for k in tensors})
    index = tmp_path / f"model.{fmt}.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return str(index)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("via", ["index", "folder"])
def test_sharded_checkpoint_loads_into_an_empty_model(tmp_path, fmt, via):
    reference = Small()
    reference.batchnorm.running_mean.uniform_()
    index = _sharded(tmp_path, reference, fmt)
    with init_empty_weights():
        model = Small()
    load_checkpoint_in_model(model, index if via == "index" else str(tmp_path), device_map={"": "cpu"})
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def test_disk_entries_of_a_device_map_stay_on_meta_and_point_into_the_checkpoint(tmp_path):
    reference = Small()
    index = _sharded(tmp_path, reference, "safetensors")
    offload = tmp_path / "offload"
    with init_empty_weights():
        model = Small()
    load_checkpoint_in_model(
        model, index, device_map={"linear1": "cpu", "batchnorm": "cpu", "linear2": "disk"}, offload_folder=offload
    )
    assert model.linear2.weight.device.type == "meta" and model.linear1.weight.device.type == "cpu"
    entries = json.loads((offload / "index.json").read_text())
    assert set(entries) == {"linear2.weight", "linear2.bias"}
    assert entries["linear2.weight"]["safetensors_file"].endswith("shard-2.safetensors")
    assert not list(offload.glob("*.dat")), "safetensors weights were copied instead of referenced"


def test_checkpoint_problems_name_the_key(tmp_path):
    path = tmp_path / "model.safetensors"
    state = Small().state_dict()
    save_file({k: v for k, v in state.items() if k != "linear2.bias"}, str(path), metadata={"format": "pt"})
    with init_empty_weights():
        model = Small()
    with pytest.raises(ValueError, match="linear2.bias"):
        load_checkpoint_in_model(model, str(path), device_map={"": "cpu"})

    bad = dict(state, **{"linear1.weight": torch.zeros(2, 2)})
    save_file(bad, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="linear1.weight"):
        load_checkpoint_in_model(Small(), str(path), device_map={"": "cpu"})

    save_file(dict(state, extra=torch.zeros(1)), str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="extra"):
        load_checkpoint_in_model(Small(), str(path), strict=True)

    with pytest.raises(ValueError, match="offload_folder"):
        load_checkpoint_in_model(Small(), str(path), device_map={"": "disk"})
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(PermissionError, match="blocker"):
        load_checkpoint_in_model(Small(), str(path), device_map={"": "disk"}, offload_folder=blocker / "x")


def test_missing_keys_on_a_materialised_model_only_warn(tmp_path, caplog):
    path = tmp_path / "model.bin"
    torch.save({k: v for k, v in Small().state_dict().items() if k != "linear2.bias"}, path)
    model = Small()
    before = model.linear2.bias.clone()
    load_checkpoint_in_model(model, str(path))
    assert torch.equal(model.linear2.bias, before)
    assert "linear2.bias" in caplog.text


def _broadcast_rank(checkpoint: str, empty_on_others: bool, bad_shape_on_rank1: bool, extra: dict) -> dict:
    """One rank of a broadcast_from_rank0 load: rank 0 alone gets the real path; returns the loaded tensors."""
    import torch.distributed as dist

    rank = dist.get_rank()
    torch.manual_seed(100 + rank)  # every rank starts from different weights
    if rank and empty_on_others:
        with init_empty_weights():
            model = Small()
    else:
        model = Small()
    if rank == 1 and bad_shape_on_rank1:
        model.linear2 = nn.Linear(4, 6)
    path = checkpoint if rank == 0 else "/nonexistent/only-rank-0-reads-the-checkpoint"
    try:
        load_checkpoint_in_model(model, path, broadcast_from_rank0=True, **extra)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_broadcast_from_rank0_only_rank0_reads_and_every_rank_gets_the_weights(tmp_path, fmt):
    from dist_utils import run_distributed

    reference = Small()
    reference.batchnorm.running_mean.uniform_()
    index = _sharded(tmp_path, reference, fmt)
    for empty in (False, True):  # other ranks with real weights, or still on the meta device
        results = run_distributed(_broadcast_rank, 2, index, empty, False, {})
        for rank, loaded in enumerate(results):
            assert "error" not in loaded, loaded
            assert set(loaded) == set(reference.state_dict())
            for key, value in reference.state_dict().items():
                assert loaded[key].device.type == "cpu" and torch.equal(loaded[key], value), (rank, key)
    halves = run_distributed(_broadcast_rank, 2, index, True, False, {"dtype": torch.float16})
    assert all(r["linear1.weight"].dtype == torch.float16 and r["batchnorm.num_batches_tracked"].dtype == torch.int64
               for r in halves)


def test_broadcast_from_rank0_failures_reach_every_rank_instead_of_hanging(tmp_path):
    from dist_utils import run_distributed

    missing = run_distributed(_broadcast_rank, 2, str(tmp_path / "absent.safetensors"), False, False, {})
    assert all("absent.safetensors" in r["error"] for r in missing), missing  # rank 0's listing error, everywhere

    path = tmp_path / "model.safetensors"
    save_file(Small().state_dict(), str(path), metadata={"format": "pt"})
    mismatch = run_distributed(_broadcast_rank, 2, str(path), False, True, {})
    assert "rank(s) 1" in mismatch[0]["error"] and "linear2." in mismatch[0]["error"], mismatch
    assert "Shape mismatch" in mismatch[1]["error"], mismatch


def test_broadcast_from_rank0_needs_a_process_group_and_no_device_map(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(Small().state_dict(), str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="process group"):
        load_checkpoint_in_model(Small(), str(path), broadcast_from_rank0=True)
