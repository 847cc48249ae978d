"""Collective operations on 1..N real processes (``accel launch`` / ``debug_launcher(main)``).

Every check compares against values each process can compute for itself, so a wrong rank order,
a missing process or a silent no-op fails with a message naming the operation. Run as
``accel launch --cpu --num_processes 2 test_ops.py`` or ``debug_launcher(test_ops.main)``.
"""

from __future__ import annotations

import torch

from accel.state import PartialState
from accel.utils import operations as ops


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {PartialState().process_index}] {what}")


def _rank_tensor(state: PartialState, length: int = 3) -> torch.Tensor:
    # rank r holds [r*length + 1, ..., r*length + length]
    return torch.arange(length, dtype=torch.float32, device=state.device) + state.process_index * length + 1.0


def check_gather(state: PartialState) -> None:
    """gather concatenates every rank's tensor in rank order, also for nested data and 0-d tensors."""
    n = state.num_processes
    gathered = ops.gather(_rank_tensor(state))
    _check(gathered.tolist() == [float(i + 1) for i in range(3 * n)], f"gather gave {gathered.tolist()}")
    nested = ops.gather({"a": _rank_tensor(state, 2), "b": [torch.tensor(state.process_index, device=state.device)]})
    # (on one process gather returns its input as it is, so the 0-d tensor stays 0-d there)
    _check(nested["b"][0].reshape(-1).tolist() == list(range(n)), f"gather of a nested 0-d tensor gave {nested['b'][0]}")
    _check(nested["a"].shape == (2 * n,), f"gather of a nested tensor has shape {tuple(nested['a'].shape)}")


def check_gather_requires_grad(state: PartialState) -> None:
    """A loss or a parameter (tensors that require grad) can be gathered; the result holds their values."""
    weight = torch.nn.Parameter(torch.full((2,), float(state.process_index + 1), device=state.device))
    loss = (weight * 3).sum()
    gathered_loss = ops.gather(loss)
    _check(gathered_loss.reshape(-1).tolist() == [6.0 * (r + 1) for r in range(state.num_processes)],
           f"gather of a loss that requires grad gave {gathered_loss.tolist()}")
    gathered_weight = ops.gather(weight)
    _check(gathered_weight.tolist() == [float(r + 1) for r in range(state.num_processes) for _ in range(2)],
           f"gather of a parameter gave {gathered_weight.tolist()}")


def check_gather_object(state: PartialState) -> None:
    """gather_object flattens every rank's list, in rank order."""
    mine = [f"rank{state.process_index}", {"index": state.process_index}]
    everyone = ops.gather_object(mine)
    expected = [item for r in range(state.num_processes) for item in (f"rank{r}", {"index": r})]
    _check(everyone == expected, f"gather_object gave {everyone}")


def check_broadcast(state: PartialState) -> None:
    """broadcast overwrites every rank's tensor with the source rank's, in place."""
    source = state.num_processes - 1
    tensor = _rank_tensor(state)
    result = ops.broadcast(tensor, from_process=source)
    expected = [float(source * 3 + i + 1) for i in range(3)]
    _check(result.tolist() == expected and tensor.tolist() == expected, f"broadcast gave {result.tolist()}")
    objects = [state.process_index, "payload"] if state.is_main_process else [None, None]
    ops.broadcast_object_list(objects)
    _check(objects == [0, "payload"], f"broadcast_object_list gave {objects}")


def check_pad_across_processes(state: PartialState) -> None:
    """Tensors of different lengths are padded to the longest, at the end or the front."""
    n = state.num_processes
    tensor = torch.ones(state.process_index + 1, device=state.device)
    padded = ops.pad_across_processes(tensor, pad_index=-1)
    _check(padded.shape == (n,), f"pad_across_processes gave shape {tuple(padded.shape)}")
    _check(padded.tolist() == [1.0] * (state.process_index + 1) + [-1.0] * (n - state.process_index - 1),
           f"pad_across_processes gave {padded.tolist()}")
    front = ops.pad_across_processes(tensor, pad_index=-1, pad_first=True)
    _check(front.tolist() == [-1.0] * (n - state.process_index - 1) + [1.0] * (state.process_index + 1),
           f"pad_across_processes(pad_first=True) gave {front.tolist()}")


def check_reduce(state: PartialState) -> None:
    """sum and mean over ranks; the input is left untouched."""
    n = state.num_processes
    tensor = _rank_tensor(state)
    total = ops.reduce(tensor, reduction="sum")
    expected = [float(sum(r * 3 + i + 1 for r in range(n))) for i in range(3)]
    _check(total.tolist() == expected, f"reduce(sum) gave {total.tolist()}, expected {expected}")
    mean = ops.reduce(tensor, reduction="mean")
    _check(torch.allclose(mean, torch.tensor(expected, device=state.device) / n), f"reduce(mean) gave {mean.tolist()}")
    _check(tensor.tolist() == _rank_tensor(state).tolist(), "reduce changed its input")


def check_copy_tensor_to_devices(state: PartialState) -> None:
    """A tensor only the main process has reaches every process with its shape and dtype."""
    tensor = torch.arange(6, dtype=torch.int64, device=state.device).reshape(2, 3) if state.is_main_process else None
    copied = ops.copy_tensor_to_devices(tensor)
    _check(copied.dtype == torch.int64 and copied.tolist() == [[0, 1, 2], [3, 4, 5]],
           f"copy_tensor_to_devices gave {copied}")


CHECKS = (check_gather, check_gather_requires_grad, check_gather_object, check_broadcast, check_pad_across_processes,
          check_reduce, check_copy_tensor_to_devices)


def main() -> None:
    """Run every check on this process; raise AssertionError naming the first failure."""
    state = PartialState()
    for check in CHECKS:
        if state.is_main_process:
            print(f"test_ops: {check.__name__} on {state.num_processes} process(es)")
        check(state)
    state.wait_for_everyone()


def _mp_fn(index: int) -> None:
    """Entry point for launchers that pass the process index (xla_spawn)."""
    main()


if __name__ == "__main__":
    main()
