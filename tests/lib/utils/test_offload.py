"""accel.utils.offload: the .dat + index.json format, memory-mapped zero-copy reads, the loaders."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from safetensors.torch import save_file

from accel.utils.offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool]
DTYPES += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


def _sample(dtype: torch.dtype, shape=(3, 5)) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-100, 100, shape, generator=g).to(dtype)
    return (torch.randn(shape, generator=g) * 3).to(dtype)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    view = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(view), b.view(view))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_offload_weight_round_trips_every_dtype_bit_for_bit(tmp_path, dtype):
    weight = _sample(dtype)
    index = offload_weight(weight, "w", tmp_path, {})
    assert index == {"w": {"dtype": str(dtype).split(".")[1], "shape": [3, 5]}}
    assert os.path.getsize(tmp_path / "w.dat") == weight.numel() * weight.element_size()
    loaded = load_offloaded_weight(tmp_path / "w.dat", index["w"])
    assert _bits_equal(weight, loaded)


def test_scalar_weights_round_trip(tmp_path):
    index = offload_weight(torch.tensor(7, dtype=torch.int64), "steps", tmp_path, {})
    assert index["steps"]["shape"] == []
    loaded = load_offloaded_weight(tmp_path / "steps.dat", index["steps"])
    assert loaded.shape == () and int(loaded) == 7


def test_offload_state_dict_writes_index_and_files_the_loader_reads_back(tmp_path):
    state = {"a.weight": torch.randn(4, 3), "a.bias": torch.randn(4), "b.steps": torch.tensor(3)}
    offload_state_dict(tmp_path, state)
    index = json.loads((tmp_path / "index.json").read_text())
    assert set(index) == set(state) and index["a.weight"] == {"dtype": "float32", "shape": [4, 3]}
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    assert sorted(loader) == sorted(state) and len(loader) == 3
    for key, value in state.items():
        assert torch.equal(loader[key], value)


def test_loaded_weights_are_private_copy_on_write_mappings(tmp_path):
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    offload_state_dict(tmp_path, {"w": weight})
    loaded = OffloadedWeightsLoader(save_folder=tmp_path)["w"]
    loaded.mul_(10)  # writing into the tensor never reaches the file
    assert torch.equal(OffloadedWeightsLoader(save_folder=tmp_path)["w"], weight)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="[not-on-backend] reads /proc/self/maps")
def test_disk_weights_are_memory_mapped_not_read_whole(tmp_path):
    offload_state_dict(tmp_path, {"big": torch.randn(256, 1024)})
    path = str(tmp_path / "big.dat")

    def mapped() -> bool:
        with open("/proc/self/maps") as fh:
            return any(line.rstrip().endswith(path) for line in fh)

    tensor = OffloadedWeightsLoader(save_folder=tmp_path)["big"]
    assert mapped(), "the weight was read into fresh memory instead of being memory-mapped"
    del tensor
    assert not mapped(), "the mapping outlived the tensor"


def test_safetensors_index_entries_are_read_in_place_with_dtype_conversion(tmp_path):
    path = tmp_path / "shard.safetensors"
    tensors = {"x.weight": torch.randn(5, 7), "x.ids": torch.arange(6)}
    save_file(tensors, str(path), metadata={"format": "pt"})
    index = {
        "w": {"safetensors_file": str(path), "weight_name": "x.weight", "dtype": "float32"},
        "h": {"safetensors_file": str(path), "weight_name": "x.weight", "dtype": "float16"},
        "x.ids": {"safetensors_file": str(path)},
    }
    loader = OffloadedWeightsLoader(index=index)
    assert torch.equal(loader["w"], tensors["x.weight"])
    assert loader["h"].dtype == torch.float16 and torch.equal(loader["h"], tensors["x.weight"].half())
    assert torch.equal(loader["x.ids"], tensors["x.ids"])


def test_state_dict_has_priority_and_keys_are_not_duplicated(tmp_path):
    disk = {"a": torch.zeros(2), "b": torch.zeros(2)}
    offload_state_dict(tmp_path, disk)
    loader = OffloadedWeightsLoader(state_dict={"a": torch.ones(2)}, save_folder=tmp_path)
    assert list(loader) == ["a", "b"]
    assert torch.equal(loader["a"], torch.ones(2))
    with pytest.raises(KeyError, match="'c'"):
        loader["c"]


def test_loader_needs_a_source_and_an_existing_index(tmp_path):
    with pytest.raises(ValueError, match="state_dict"):
        OffloadedWeightsLoader()
    with pytest.raises(FileNotFoundError, match="index.json"):
        OffloadedWeightsLoader(save_folder=tmp_path)


def test_unwritable_offload_folder_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(PermissionError, match="file"):
        offload_state_dict(blocker / "offload", {"w": torch.zeros(2)})


def test_prefixed_dataset_and_submodule_extraction():
    data = {"a.1.w": 1, "a.10.w": 2, "a.2.w": 3, "b": 4}
    view = PrefixedDataset(data, "a.1.")
    assert view["w"] == 1 and list(view) == ["a.1.w"]
    assert extract_submodules_state_dict(data, ["a.1", "a.2"]) == {"a.1.w": 1, "a.2.w": 3}
    assert extract_submodules_state_dict(data, ["b"]) == {"b": 4}
