"""Gradient synchronisation on 1..N real processes (``accel launch`` / ``debug_launcher(main)``).

Each rank feeds different data, so un-synchronised gradients differ between ranks and synchronised
ones are equal everywhere and equal to a single-process reference computed here from every rank's
data. Checked: a plain backward (synchronised), ``no_sync`` (local), ``accumulate`` with
``gradient_accumulation_steps=2`` (synchronised on every second step, with the loss scaled), and
``GradientAccumulationPlugin(sync_each_batch=True)`` (synchronised every step).
"""

from __future__ import annotations

import copy

import torch

from accel.accelerator import Accelerator
from accel.state import AcceleratorState, GradientState, PartialState
from accel.test_utils.training import RegressionModel
from accel.utils import gather
from accel.utils.dataclasses import GradientAccumulationPlugin


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {PartialState().process_index}] {what}")


def _batch(rank: int, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch rank ``rank`` uses at ``step``: different on every rank and step."""
    x = torch.linspace(-1.0, 1.0, 4, device=device) * (rank + 1) + step
    return x, 2.0 * x + 3.0


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def _grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.stack([p.grad.detach().reshape(()) if p.grad is not None else torch.tensor(0.0, device=p.device)
                        for p in model.parameters()])


def _same_on_every_rank(values: torch.Tensor) -> bool:
    everyone = gather(values[None].contiguous()).reshape(-1, values.numel())
    return bool(torch.allclose(everyone, everyone[0].expand_as(everyone)))


def _reference_grads(model: torch.nn.Module, steps: list[int], world: int, scale: float) -> torch.Tensor:
    """Gradients a single process gets: the mean over ranks of ``scale`` * the sum over ``steps``."""
    reference = copy.deepcopy(model)
    reference.zero_grad(set_to_none=True)
    for rank in range(world):
        for step in steps:
            x, y = _batch(rank, step, next(reference.parameters()).device)
            (_loss(reference, x, y) * scale / world).backward()
    return _grads(reference)


def _fresh_accelerator(**kwargs) -> Accelerator:
    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(**kwargs)


def check_plain_backward_synchronises(accelerator: Accelerator) -> None:
    state = accelerator.state
    model = RegressionModel(a=1.0, b=1.0)
    plain = copy.deepcopy(model).to(accelerator.device)
    ddp = accelerator.prepare(model)
    x, y = _batch(state.process_index, 0, accelerator.device)
    accelerator.backward(_loss(ddp, x, y))
    grads = _grads(ddp)
    _check(_same_on_every_rank(grads), f"gradients after a plain backward differ between ranks: {grads.tolist()}")
    expected = _reference_grads(plain, [0], state.num_processes, 1.0)
    _check(torch.allclose(grads, expected, atol=1e-5), f"synchronised gradients {grads.tolist()} != {expected.tolist()}")


def check_no_sync_keeps_gradients_local(accelerator: Accelerator) -> None:
    state = accelerator.state
    model = RegressionModel(a=1.0, b=1.0)
    plain = copy.deepcopy(model).to(accelerator.device)
    ddp = accelerator.prepare(model)
    x, y = _batch(state.process_index, 0, accelerator.device)
    with accelerator.no_sync(ddp):
        accelerator.backward(_loss(ddp, x, y))
    local = _grads(ddp)
    plain.zero_grad(set_to_none=True)
    _loss(plain, x, y).backward()
    _check(torch.allclose(local, _grads(plain), atol=1e-5), f"no_sync gradients {local.tolist()} are not this rank's own")
    if state.num_processes > 1:
        _check(not _same_on_every_rank(local), "gradients under no_sync are equal on every rank: they were synchronised")


def check_accumulate(accelerator: Accelerator, sync_each_batch: bool) -> None:
    state = accelerator.state
    model = RegressionModel(a=1.0, b=1.0)
    plain = copy.deepcopy(model).to(accelerator.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the gradients, not the weights, are checked
    ddp, optimizer = accelerator.prepare(model, optimizer)
    steps_since_sync: list[int] = []
    for step in range(4):
        x, y = _batch(state.process_index, step, accelerator.device)
        with accelerator.accumulate(ddp):
            accelerator.backward(_loss(ddp, x, y))
            steps_since_sync.append(step)
            should_sync = step % 2 == 1
            _check(accelerator.sync_gradients == should_sync,
                   f"step {step}: sync_gradients is {accelerator.sync_gradients}, expected {should_sync}")
            grads = _grads(ddp)
            if should_sync or sync_each_batch:
                _check(_same_on_every_rank(grads), f"step {step}: gradients differ between ranks after a synchronised step")
                if should_sync:
                    expected = _reference_grads(plain, steps_since_sync, state.num_processes, 0.5)
                    _check(torch.allclose(grads, expected, atol=1e-5),
                           f"step {step}: accumulated gradients {grads.tolist()} != {expected.tolist()}")
            elif state.num_processes > 1:
                _check(not _same_on_every_rank(grads), f"step {step}: gradients were synchronised on an accumulation step")
            optimizer.step()
            optimizer.zero_grad()
            if should_sync:
                steps_since_sync = []


def main() -> None:
    """Run every check on this process; raise AssertionError naming the first failure."""
    accelerator = _fresh_accelerator()
    if accelerator.is_main_process:
        print(f"test_sync: {accelerator.num_processes} process(es)")
    check_plain_backward_synchronises(accelerator)
    check_no_sync_keeps_gradients_local(accelerator)
    check_accumulate(_fresh_accelerator(gradient_accumulation_steps=2), sync_each_batch=False)
    plugin = GradientAccumulationPlugin(num_steps=2, sync_each_batch=True)
    check_accumulate(_fresh_accelerator(gradient_accumulation_plugin=plugin), sync_each_batch=True)
    accelerator.wait_for_everyone()
    AcceleratorState._reset_state()
    GradientState._reset_state()


def _mp_fn(index: int) -> None:
    """Entry point for launchers that pass the process index (xla_spawn)."""
    main()


if __name__ == "__main__":
    main()
