"""AcceleratedScheduler on one process: OneCycleLR is not stepped past its total_steps (it would raise)."""

import torch

from accel import Accelerator


def test_one_cycle_is_not_stepped_past_its_total_on_one_process():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=2)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    for _ in range(4):  # more optimizer steps than the schedule has: the extra ones leave it at its end
        optimizer.step()
        scheduler.step()
    assert scheduler.scheduler._step_count == 3  # the construction's step, then total_steps
