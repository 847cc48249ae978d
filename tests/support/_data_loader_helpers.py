"""Shared by the accel.data_loader tests: the Accelerate reference fixture, datasets whose samples
show their index, and reading indices back from a batch."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset


@pytest.fixture(scope="module")
def ref():
    """Hugging Face Accelerate's data_loader: the behaviour reference."""
    return pytest.importorskip("accelerate.data_loader", reason="Hugging Face accelerate (the reference) is not installed")


class MapData(Dataset):
    """Sample i is {"idx": i, "x": [i, i]}, so a batch shows which samples it holds."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"idx": torch.tensor(i), "x": torch.full((2,), float(i))}


class StreamData(IterableDataset):
    def __init__(self, n: int, sized: bool = True):
        self.n, self.sized = n, sized

    def __iter__(self):
        for i in range(self.n):
            yield {"idx": torch.tensor(i), "x": torch.full((2,), float(i))}

    def __len__(self) -> int:
        if not self.sized:
            raise TypeError("unsized stream")
        return self.n


def _idx(batch) -> list[int]:
    if isinstance(batch, dict):
        assert torch.equal(batch["x"][:, 0], batch["idx"].float()), "sample fields got out of step"
        return batch["idx"].tolist()
    return batch.tolist() if isinstance(batch, torch.Tensor) else list(batch)
