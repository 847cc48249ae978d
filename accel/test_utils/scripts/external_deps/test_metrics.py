"""gather_for_metrics on 1..N real processes (``accel launch`` / ``debug_launcher(main)``).

Evaluation must see every sample exactly once however the data was spread: predictions gathered
with ``gather_for_metrics`` are compared with a single-process pass over the same data, for
sharded and dispatched loaders, with and without ``split_batches``, for lengths that do and do not
divide evenly, for iterable datasets, for non-tensor objects and with ``drop_last``. Needs no
network and no extra package (Accelerate's version of this script needs a GLUE model and data).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, IterableDataset

from accel.accelerator import Accelerator
from accel.state import AcceleratorState, GradientState, PartialState
from accel.test_utils.training import RegressionDataset, RegressionModel
from accel.utils.dataclasses import DataLoaderConfiguration


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {PartialState().process_index}] {what}")


def _fresh_accelerator(**config) -> Accelerator:
    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(dataloader_config=DataLoaderConfiguration(**config))


def check_predictions(length: int, split_batches: bool, dispatch_batches: bool) -> None:
    accelerator = _fresh_accelerator(split_batches=split_batches, dispatch_batches=dispatch_batches)
    data = RegressionDataset(length=length, seed=42)
    model = RegressionModel(a=1.5, b=-0.5)
    expected = torch.from_numpy(data.x) * 1.5 - 0.5
    batch_size = 4 * accelerator.num_processes if split_batches else 4
    prepared_model, loader = accelerator.prepare(model, DataLoader(data, batch_size=batch_size))
    predictions = []
    with torch.no_grad():
        for batch in loader:
            predictions.append(accelerator.gather_for_metrics(prepared_model(batch["x"])).cpu())
    got = torch.cat(predictions)
    label = f"length={length}, split_batches={split_batches}, dispatch_batches={dispatch_batches}"
    _check(got.shape == (length,), f"{label}: gathered {tuple(got.shape)} predictions, expected {length}")
    _check(torch.allclose(got, expected), f"{label}: gathered predictions are not the dataset's, in order")


class _Stream(IterableDataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        yield from self.items


def check_iterable_dataset() -> None:
    accelerator = _fresh_accelerator()
    loader = accelerator.prepare(DataLoader(_Stream(torch.arange(21).tolist()), batch_size=2))
    gathered = torch.cat([accelerator.gather_for_metrics(batch) for batch in loader]).tolist()
    _check(gathered == list(range(21)), f"iterable dataset: gathered {gathered}")


def check_non_tensor_objects() -> None:
    accelerator = _fresh_accelerator()
    items = [{"id": i, "text": f"sample {i}"} for i in range(11)]
    loader = accelerator.prepare(DataLoader(items, batch_size=2, collate_fn=list))
    gathered = []
    for batch in loader:
        gathered.extend(accelerator.gather_for_metrics(batch, use_gather_object=True))
    _check(sorted(gathered, key=lambda item: item["id"]) == items and len(gathered) == len(items),
           f"objects: gathered {gathered}")


def check_drop_last() -> None:
    accelerator = _fresh_accelerator()
    n = accelerator.num_processes
    loader = accelerator.prepare(DataLoader(list(range(5 * n + 3)), batch_size=5, drop_last=True))
    gathered = torch.cat([accelerator.gather_for_metrics(batch) for batch in loader])
    _check(gathered.numel() == len(loader) * 5 * n, f"drop_last: gathered {gathered.numel()} samples")


def main() -> None:
    """Run every check on this process; raise AssertionError naming the first failure."""
    for length in (99, 512):
        for split_batches in (False, True):
            for dispatch_batches in (False, True):
                check_predictions(length, split_batches, dispatch_batches)
    check_iterable_dataset()
    check_non_tensor_objects()
    check_drop_last()
    PartialState().wait_for_everyone()
    AcceleratorState._reset_state()
    GradientState._reset_state()


def _mp_fn(index: int) -> None:
    """Entry point for launchers that pass the process index (xla_spawn)."""
    main()


if __name__ == "__main__":
    main()
