"""Data loading across 1..N real processes (``accel launch`` / ``debug_launcher(main)``).

Checked: ``even_batches`` (every process gets the same number of batches, the short ones padded
from the start of the data), ``even_batches=False`` (processes get different numbers), and
``join_uneven_inputs`` letting DDP train through uneven inputs; ``skip_first_batches`` resuming
mid-epoch; a prepared loader surviving pickling; stateful loaders (torchdata) resuming on every
process from their own ``state_dict``. Failures raise AssertionError naming the rank.
"""

from __future__ import annotations

import pickle

import torch
from torch.utils.data import DataLoader

from accel.accelerator import Accelerator
from accel.state import AcceleratorState, GradientState, PartialState
from accel.utils import gather_object
from accel.utils.dataclasses import DataLoaderConfiguration
from accel.utils.imports import is_torchdata_stateful_dataloader_available


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {PartialState().process_index}] {what}")


def _fresh_accelerator(**config) -> Accelerator:
    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(dataloader_config=DataLoaderConfiguration(**config))


def _uneven_length(n: int) -> int:
    return 3 * n + 1  # batch size 1: the first process gets one batch more than the others


def check_even_batches(accelerator: Accelerator) -> None:
    n = accelerator.num_processes
    loader = accelerator.prepare(DataLoader(list(range(_uneven_length(n))), batch_size=1))
    counts = gather_object([len(list(loader))])
    _check(len(set(counts)) == 1, f"even_batches=True gave batch counts {counts}")


def check_uneven_batches(n_processes: int) -> None:
    accelerator = _fresh_accelerator(even_batches=False)
    loader = accelerator.prepare(DataLoader(list(range(_uneven_length(n_processes))), batch_size=1))
    counts = gather_object([len(list(loader))])
    expected = [4] + [3] * (n_processes - 1) if n_processes > 1 else [4]
    _check(counts == expected, f"even_batches=False gave batch counts {counts}, expected {expected}")


def check_join_uneven_inputs(n_processes: int) -> None:
    accelerator = _fresh_accelerator(even_batches=False)
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    loader = accelerator.prepare(DataLoader(list(range(_uneven_length(n_processes))), batch_size=1))
    steps = 0
    with accelerator.join_uneven_inputs([model]):
        for batch in loader:
            loss = model(batch.float()[:, None]).sum()
            accelerator.backward(loss)
            steps += 1
    _check(steps == len(loader), f"join_uneven_inputs stopped after {steps} of {len(loader)} batches")


def check_skip_first_batches(accelerator: Accelerator) -> None:
    n = accelerator.num_processes
    loader = accelerator.prepare(DataLoader(list(range(8 * n)), batch_size=2))
    everything = [b.tolist() for b in loader]
    resumed = [b.tolist() for b in accelerator.skip_first_batches(loader, 2)]
    _check(resumed == everything[2:], f"skip_first_batches(2) gave {resumed}, expected {everything[2:]}")


def check_pickling(accelerator: Accelerator) -> None:
    loader = accelerator.prepare(DataLoader(list(range(6 * accelerator.num_processes)), batch_size=2))
    clone = pickle.loads(pickle.dumps(loader))
    _check([b.tolist() for b in clone] == [b.tolist() for b in loader], "a pickled prepared loader yields other batches")


def check_stateful_resume(n_processes: int) -> None:
    if not is_torchdata_stateful_dataloader_available():
        return
    accelerator = _fresh_accelerator(use_stateful_dataloader=True)
    data = list(range(12 * n_processes))
    loader = accelerator.prepare(DataLoader(data, batch_size=2))
    seen = []
    for index, batch in enumerate(loader):
        seen.append(batch.tolist())
        if index == 1:
            state = loader.state_dict()
            break
    loader.end()
    again = accelerator.prepare(DataLoader(data, batch_size=2))
    again.load_state_dict(state)
    rest = [b.tolist() for b in again]
    full = [b.tolist() for b in accelerator.prepare(DataLoader(data, batch_size=2))]
    _check(seen + rest == full, f"stateful resume gave {seen} + {rest}, a full pass gives {full}")


def main() -> None:
    """Run every check on this process; raise AssertionError naming the first failure."""
    accelerator = _fresh_accelerator()
    n = accelerator.num_processes
    if accelerator.is_main_process:
        print(f"test_distributed_data_loop: {n} process(es)")
    check_even_batches(accelerator)
    check_skip_first_batches(accelerator)
    check_pickling(accelerator)
    check_uneven_batches(n)
    check_join_uneven_inputs(n)
    check_stateful_resume(n)
    PartialState().wait_for_everyone()
    AcceleratorState._reset_state()
    GradientState._reset_state()


def _mp_fn(index: int) -> None:
    """Entry point for launchers that pass the process index (xla_spawn)."""
    main()


if __name__ == "__main__":
    main()
