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


def _counting_scheduler(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def test_accumulation_holds_the_scheduler_on_every_step_not_only_the_first():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, _counting_scheduler(optimizer))
    steps = []
    for _ in range(9):  # three optimizer steps; the scheduler steps with them and never in between
        with accelerator.accumulate(model):
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        steps.append(scheduler.scheduler.last_epoch)
    assert steps == [0, 0, 1, 1, 1, 2, 2, 2, 3]


class _SkippingOptimizer:
    """Stands in for an optimizer whose step an fp16 scaler skipped (inf/NaN gradients)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.step_was_skipped = False


def test_a_skipped_optimizer_step_holds_the_scheduler_after_the_first_step_too():
    from accel.optimizer import AcceleratedOptimizer
    from accel.scheduler import AcceleratedScheduler

    Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    skipping = _SkippingOptimizer(inner)
    scheduler = AcceleratedScheduler(_counting_scheduler(inner), [AcceleratedOptimizer(inner), skipping])
    epochs = []
    for skipped in (False, False, True, False, True, True, False):
        skipping.step_was_skipped = skipped
        scheduler.step()
        epochs.append(scheduler.scheduler.last_epoch)
    assert epochs == [1, 2, 2, 3, 3, 3, 4]


def test_an_optimizer_wrapper_that_overrides_step_was_skipped_is_asked_every_step():
    from accel.optimizer import AcceleratedOptimizer
    from accel.scheduler import AcceleratedScheduler

    class Flagged(AcceleratedOptimizer):
        skip = False

        @property
        def step_was_skipped(self) -> bool:
            return self.skip

    Accelerator(cpu=True)
    inner = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    flagged = Flagged(inner)
    scheduler = AcceleratedScheduler(_counting_scheduler(inner), flagged)
    scheduler.step()
    flagged.skip = True
    scheduler.step()
    scheduler.step()
    flagged.skip = False
    scheduler.step()
    assert scheduler.scheduler.last_epoch == 2


def test_arguments_to_step_reach_the_wrapped_scheduler_after_the_first_step():
    from accel.scheduler import AcceleratedScheduler

    Accelerator(cpu=True)
    inner = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(inner, patience=0, factor=0.5)
    scheduler = AcceleratedScheduler(plateau, inner)
    for loss in (1.0, 1.0, 2.0, 3.0):  # no improvement after the first: the rate halves each time
        scheduler.step(loss)
    assert inner.param_groups[0]["lr"] == 0.1 * 0.5 ** 3


def test_an_overflow_flag_set_by_hand_holds_the_scheduler_as_in_accelerate():
    # Accelerate's own scheduler test marks a skipped step this way, on an optimizer without a scaler
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda n: 1 - n / 10)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    optimizer._is_overflow = False
    scheduler.step()
    optimizer._is_overflow = True
    scheduler.step()
    assert scheduler.get_last_lr()[0] == 0.9
    optimizer._is_overflow = False
    scheduler.step()
    assert scheduler.get_last_lr()[0] == 0.8
