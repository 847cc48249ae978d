"""DDP communication hooks on 2+ real processes (``accel launch`` / ``debug_launcher(main)``).

For every ``DistributedDataParallelKwargs(comm_hook=...)`` (none, fp16 and bf16 compression,
PowerSGD, batched PowerSGD) one training step must leave identical gradients on every process,
close to the exact average (compression loses precision, so the tolerance is the hook's).
"""

from __future__ import annotations

import copy

import torch

from accel.accelerator import Accelerator
from accel.state import AcceleratorState, GradientState, PartialState
from accel.utils import gather
from accel.utils.dataclasses import DDPCommunicationHookType, DistributedDataParallelKwargs

#: hook -> (relative tolerance against the exact mean gradient)
_HOOKS = {
    DDPCommunicationHookType.NO: 1e-5,
    DDPCommunicationHookType.FP16: 1e-2,
    DDPCommunicationHookType.BF16: 5e-2,
    DDPCommunicationHookType.POWER_SGD: None,  # low-rank approximation: only agreement between ranks is checked
    DDPCommunicationHookType.BATCHED_POWER_SGD: None,
}


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {PartialState().process_index}] {what}")


def _data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)


def check_hook(hook: DDPCommunicationHookType, tolerance: float | None) -> None:
    AcceleratorState._reset_state()
    GradientState._reset_state()
    accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=hook)])
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    reference = copy.deepcopy(model)
    ddp = accelerator.prepare(model)
    x, y = _data(accelerator.process_index)
    accelerator.backward(torch.nn.functional.mse_loss(ddp(x.to(accelerator.device)), y.to(accelerator.device)))
    grads = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()]).cpu()
    everyone = gather(grads[None].to(accelerator.device)).cpu()
    _check(torch.allclose(everyone, everyone[0].expand_as(everyone)), f"{hook}: gradients differ between processes")
    if tolerance is None:
        return
    for rank in range(accelerator.num_processes):
        rx, ry = _data(rank)
        (torch.nn.functional.mse_loss(reference(rx), ry) / accelerator.num_processes).backward()
    exact = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    _check(torch.allclose(grads, exact, rtol=tolerance, atol=tolerance),
           f"{hook}: gradients {grads[:4].tolist()}... differ from the exact mean {exact[:4].tolist()}...")


def main() -> None:
    """Check every hook; raise AssertionError naming the first failure."""
    state = PartialState()
    if state.num_processes < 2:
        raise RuntimeError("test_ddp_comm_hook needs at least 2 processes (DDP hooks only run across processes)")
    for hook, tolerance in _HOOKS.items():
        if state.is_main_process:
            print(f"test_ddp_comm_hook: {hook} on {state.num_processes} processes")
        try:
            check_hook(hook, tolerance)
        except TypeError as exc:
            # torch refuses the bf16 hook without NCCL >= 2.10 or XCCL (e.g. on gloo): a capability of the
            # collective backend, reported, not a wrong result
            if hook is not DDPCommunicationHookType.BF16 or "BF16" not in str(exc):
                raise
            if state.is_main_process:
                print(f"test_ddp_comm_hook: {hook} not supported by this collective backend: {exc}")
    AcceleratorState._reset_state()
    GradientState._reset_state()


if __name__ == "__main__":
    main()
