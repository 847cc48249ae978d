"""The data layout under a device mesh: the rules, which strategy follows which, and that the Accelerator asks its strategy."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from accel import Accelerator
from accel.data_loader.layout import data_parallel_layout, tensor_parallel_layout
from accel.state import AcceleratorState, GradientState
from accel.strategies.base import Strategy
from accel.strategies.deepspeed.strategy import DeepSpeedStrategy


class _Dim:
    def __init__(self, size: int):
        self._size = size

    def size(self) -> int:
        return self._size


class _Mesh:
    """A stand-in DeviceMesh: named dimensions with sizes."""

    def __init__(self, **sizes: int):
        self.mesh_dim_names = tuple(sizes)
        self._sizes = sizes

    def __getitem__(self, name: str) -> _Dim:
        return _Dim(self._sizes[name])


@pytest.fixture(autouse=True)
def fresh_state():
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_data_parallel_ranks_sharing_tp_and_cp_coordinates_read_the_same_data():
    mesh = _Mesh(dp_replicate=2, dp_shard=2, cp=2, tp=2)  # 16 ranks
    assert data_parallel_layout(mesh, 16, 0) == (4, 0)
    assert data_parallel_layout(mesh, 16, 3) == (4, 0)  # same tp/cp group as rank 0
    assert data_parallel_layout(mesh, 16, 4) == (4, 1)
    assert data_parallel_layout(mesh, 16, 15) == (4, 3)


def test_under_deepspeed_only_tensor_parallelism_replicates_the_input():
    mesh = _Mesh(dp_shard=4, tp=2)
    assert tensor_parallel_layout(mesh, 8, 5) == (4, 2)
    assert tensor_parallel_layout(_Mesh(dp_shard=8), 8, 5) == (8, 5)  # no tp: every rank its own shard


def test_each_strategy_gives_its_rule():
    mesh = _Mesh(dp_shard=2, cp=2, tp=2)
    assert Strategy.data_layout(object(), mesh, 8, 6) == (2, 1)
    assert DeepSpeedStrategy.data_layout(object(), mesh, 8, 6) == (4, 3)


def test_the_accelerator_shards_by_its_strategys_layout(monkeypatch):
    accelerator = Accelerator(cpu=True)
    asked = []

    def layout(mesh, num_processes, process_index):
        asked.append((mesh, num_processes, process_index))
        return 2, 1  # as if this single process were the second of two data-parallel shards

    mesh = _Mesh(dp_shard=2)
    monkeypatch.setattr(type(accelerator), "torch_device_mesh", property(lambda self: mesh))
    monkeypatch.setattr(accelerator.strategy, "data_layout", layout)
    loader = accelerator.prepare_data_loader(DataLoader(list(range(8)), batch_size=2))
    assert asked == [(mesh, 1, 0)]
    assert [batch.tolist() for batch in loader] == [[2, 3], [6, 7]]


def test_without_a_mesh_the_strategy_is_not_asked(monkeypatch):
    accelerator = Accelerator(cpu=True)
    monkeypatch.setattr(accelerator.strategy, "data_layout", lambda *a: pytest.fail("asked without a mesh"))
    loader = accelerator.prepare_data_loader(DataLoader(list(range(4)), batch_size=2))
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]
