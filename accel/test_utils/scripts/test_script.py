"""End-to-end checks of an accel run on 1..N real processes (``accel launch`` / ``debug_launcher(main)``).

What a user relies on, each verified against values every process can compute alone: the ranks
form 0..N-1, process control (``main_process_first``, ``on_main_process``, triggers), RNG
synchronisation, data-loader sharding (every sample seen once, ``gather_for_metrics`` drops the
padding, ``split_batches``), ``split_between_processes`` and training equivalence (N processes
with batch B train exactly like one process with batch N*B). A failure raises AssertionError naming
the check and the rank.
"""

from __future__ import annotations

import copy
import time

import torch
from torch.utils.data import DataLoader

from accel.accelerator import Accelerator
from accel.backends import is_host_device
from accel.state import AcceleratorState, GradientState, PartialState
from accel.test_utils.training import RegressionDataset, RegressionModel
from accel.utils import gather, gather_object
from accel.utils.dataclasses import DataLoaderConfiguration
from accel.utils.random import set_seed, synchronize_rng_states


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {PartialState().process_index}] {what}")


def _fresh_accelerator(**kwargs) -> Accelerator:
    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(**kwargs)


def check_process_state(accelerator: Accelerator) -> None:
    """Ranks are 0..N-1, exactly one main process, and the world size is what was launched."""
    indices = gather_object([accelerator.process_index])
    _check(indices == list(range(accelerator.num_processes)), f"process indices are {indices}")
    mains = gather_object([accelerator.is_main_process])
    _check(mains == [True] + [False] * (accelerator.num_processes - 1), f"is_main_process per rank: {mains}")


def check_process_control(accelerator: Accelerator) -> None:
    """main_process_first runs the main process's block before the others start theirs."""
    with accelerator.main_process_first():
        entered = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of a machine
        time.sleep(0.05)
        left = time.monotonic()
    times = gather_object([(entered, left)])
    main_left = times[0][1]
    _check(all(start >= main_left for start, _ in times[1:]),
           f"a process entered main_process_first's block before the main process left it: {times}")

    @accelerator.on_main_process
    def only_main() -> int:
        return accelerator.process_index + 100

    result = only_main()
    _check(result == (100 if accelerator.is_main_process else None), f"on_main_process returned {result}")

    _check(not accelerator.check_trigger(), "check_trigger is true before any process set it")
    if accelerator.process_index == accelerator.num_processes - 1:
        accelerator.set_trigger()
    _check(accelerator.check_trigger(), "a trigger set on the last process is not seen everywhere")
    _check(not accelerator.check_trigger(), "check_trigger did not reset the trigger")


def check_rng_synchronisation(accelerator: Accelerator) -> None:
    """synchronize_rng_states copies the main process's torch (host) RNG to every process, and on a device
    the device's own RNG (which draws on the device use) when asked by the device's name."""
    torch.manual_seed(1234 + accelerator.process_index)
    synchronize_rng_states(["torch"])
    draws = gather(torch.rand(4)[None].to(accelerator.device)).reshape(accelerator.num_processes, 4)
    _check(bool((draws == draws[0]).all()), f"torch RNG not synchronised: {draws.tolist()}")
    device_type = accelerator.device.type
    if not is_host_device(device_type):
        synchronize_rng_states([device_type])
        draws = gather(torch.rand(4, device=accelerator.device)[None]).reshape(accelerator.num_processes, 4)
        _check(bool((draws == draws[0]).all()), f"{device_type} RNG not synchronised: {draws.tolist()}")


def check_data_loader_sharding(accelerator: Accelerator) -> None:
    """Every sample goes to exactly one process; gather_for_metrics returns the dataset, padding dropped."""
    n = accelerator.num_processes
    length = 6 * n + 1  # not a multiple of the global batch: the last batch is padded
    loader = accelerator.prepare(DataLoader(list(range(length)), batch_size=2))
    mine, collected = [], []
    for batch in loader:
        mine.extend(batch.tolist())
        collected.extend(accelerator.gather_for_metrics(batch).tolist())
    everyone = gather_object([mine])
    per_rank = [everyone[r] for r in range(n)]
    _check(len({len(ids) for ids in per_rank}) == 1, f"processes got different numbers of samples: {per_rank}")
    _check(set().union(*map(set, per_rank)) == set(range(length)), f"samples missing: {per_rank}")
    _check(sorted(collected) == list(range(length)), f"gather_for_metrics returned {collected}")

    config = DataLoaderConfiguration(split_batches=True)
    splitter = _fresh_accelerator(dataloader_config=config)
    loader = splitter.prepare(DataLoader(list(range(4 * n * 3)), batch_size=4 * n))
    sizes = [len(batch) for batch in loader]
    _check(sizes == [4] * 3, f"split_batches gave batch sizes {sizes}, expected [4, 4, 4]")


def check_split_between_processes(accelerator: Accelerator) -> None:
    """Inputs are cut into contiguous, nearly equal parts (equal with apply_padding) in rank order."""
    n = accelerator.num_processes
    items = list(range(2 * n + 1))
    with accelerator.split_between_processes(items) as part:
        parts = gather_object([part])
    _check([x for p in parts for x in p] == items, f"split_between_processes parts {parts}")
    _check(max(map(len, parts)) - min(map(len, parts)) <= 1, f"uneven parts {parts}")
    with accelerator.split_between_processes(items, apply_padding=True) as part:
        padded = gather_object([part])
    _check(len({len(p) for p in padded}) == 1 and padded[-1][-1] == items[-1], f"padded parts {padded}")
    with accelerator.split_between_processes({"a": items, "b": [str(i) for i in items]}) as part:
        dict_parts = gather_object([part])
    _check([x for p in dict_parts for x in p["a"]] == items, f"dict parts {dict_parts}")
    tensor = torch.arange(2 * n, device=accelerator.device)
    with accelerator.split_between_processes(tensor) as part:
        _check(part.tolist() == [2 * accelerator.process_index, 2 * accelerator.process_index + 1],
               f"tensor part {part.tolist()}")


def _train(model: torch.nn.Module, loader, optimizer, step, backward) -> None:
    for batch in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        backward(loss)
        step(optimizer)


def check_training_equivalence(accelerator: Accelerator) -> None:
    """N processes with per-process batch B end with the weights one process gets with batch N*B."""
    n = accelerator.num_processes
    set_seed(42)
    data = RegressionDataset(length=16 * n, seed=42)
    model = RegressionModel(a=0.5, b=-0.5)
    reference = copy.deepcopy(model).to(accelerator.device)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    ref_loader = DataLoader(data, batch_size=4 * n)

    def place(batch):
        return {k: v.to(accelerator.device) for k, v in batch.items()}

    for epoch in range(2):
        _train(reference, map(place, ref_loader), ref_optimizer, lambda o: o.step(), lambda loss: loss.backward())

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4))
    for epoch in range(2):
        _train(model, loader, optimizer, lambda o: o.step(), accelerator.backward)
    trained = accelerator.unwrap_model(model)
    got = torch.stack([trained.a.detach(), trained.b.detach()]).cpu()
    want = torch.stack([reference.a.detach(), reference.b.detach()]).cpu()
    _check(torch.allclose(got, want, atol=1e-5), f"weights after training {got.tolist()} != single process {want.tolist()}")
    _check(_same(got), "weights differ between processes after training")


def _same(values: torch.Tensor) -> bool:
    everyone = gather_object([values.tolist()])
    return all(v == everyone[0] for v in everyone)


CHECKS = (check_process_state, check_process_control, check_rng_synchronisation, check_data_loader_sharding,
          check_split_between_processes, check_training_equivalence)


def main() -> None:
    """Run every check on this process; raise AssertionError naming the first failure."""
    for check in CHECKS:
        accelerator = _fresh_accelerator()
        if accelerator.is_main_process:
            print(f"test_script: {check.__name__} on {accelerator.num_processes} process(es)")
        check(accelerator)
        accelerator.wait_for_everyone()
    AcceleratorState._reset_state()
    GradientState._reset_state()


def _mp_fn(index: int) -> None:
    """Entry point for launchers that pass the process index (xla_spawn)."""
    main()


if __name__ == "__main__":
    main()
