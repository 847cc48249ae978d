"""Training equivalence on the backend under test, at 1, 2 and 4 processes.

Every multi-process test computes its own reference inside the rank: a plain torch loop on the
rank's device that trains the same model on the whole global batch in one process (no process
group involved). The Accelerator run must reach the same weights within
``_training_utils.FP32_TOLERANCE`` (1e-4 relative, 1e-5 absolute; the reason is given there), and
every rank must hold bitwise the same weights afterwards (DDP applies the same averaged gradient
everywhere).

Also checked: split_batches, gradient accumulation against the larger batch, clip_grad_norm_ on the
synchronised gradients, Accelerate's scheduler stepping rule (``num_processes`` scheduler steps per
optimizer step without split_batches, one with it, none while accumulating), gather_for_metrics
dropping the samples the sampler repeated to even out the last batch, and no_sync / accumulate
(gradients differ across ranks while not synchronising and agree after the synchronising step).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from _training_utils import (
    FEATURES,
    GLOBAL_BATCH,
    LENGTH,
    LR,
    FP32_TOLERANCE,
    assert_weights_close,
    flat_grads,
    flat_params,
    host_weights,
    make_dataset,
    make_model,
    reference_training,
    same_weights,
)
from accel import Accelerator
from accel.utils import DataLoaderConfiguration

EPOCHS = 2
STEPS_PER_EPOCH = LENGTH // GLOBAL_BATCH

CONFIGS = [
    pytest.param(False, 1, id="per-process-batches"),
    pytest.param(True, 1, id="split-batches"),
    pytest.param(False, 2, id="accumulate-2"),
    pytest.param(True, 2, id="split-batches-accumulate-2"),
]


def _train(device, world_size, split_batches=False, accumulation=1, max_norm=None, scheduler_factory=None):
    """GLOBAL_BATCH samples per optimizer step over all processes, whatever the configuration."""
    accelerator = Accelerator(
        dataloader_config=DataLoaderConfiguration(split_batches=split_batches),
        gradient_accumulation_steps=accumulation,
    )
    assert accelerator.num_processes == world_size
    assert accelerator.device == device
    per_loader = GLOBAL_BATCH // accumulation if split_batches else GLOBAL_BATCH // (world_size * accumulation)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    if scheduler_factory is None:  # constant LR, so the weights compare across process counts
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=1.0)
    else:
        scheduler = scheduler_factory(optimizer)
    loader = DataLoader(make_dataset(), batch_size=per_loader)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    assert next(accelerator.unwrap_model(model).parameters()).device == device
    optimizer_steps, norms = 0, []
    for _ in range(EPOCHS):
        for x, y in loader:
            assert x.device == device and len(x) == (per_loader // world_size if split_batches else per_loader)
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    optimizer_steps += 1
                    if max_norm is not None:
                        norms.append(float(accelerator.clip_grad_norm_(model.parameters(), max_norm)))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    return accelerator, model, scheduler, optimizer_steps, norms


def _assert_same_on_every_rank(accelerator, tensor: torch.Tensor, what: str) -> None:
    rows = accelerator.gather(tensor.detach()[None])
    for rank in range(1, rows.shape[0]):
        assert torch.equal(rows[rank], rows[0]), f"{what} differs between rank 0 and rank {rank}"


@pytest.mark.world_size(1, 2, 4)
@pytest.mark.parametrize("split_batches, accumulation", CONFIGS)
def test_training_matches_single_process_reference(device, world_size, split_batches, accumulation):
    expected, _ = reference_training(device, EPOCHS)
    accelerator, model, scheduler, steps, _ = _train(device, world_size, split_batches, accumulation)
    inner = accelerator.unwrap_model(model)
    weights = host_weights(inner)

    assert steps == EPOCHS * STEPS_PER_EPOCH
    assert not same_weights(weights, host_weights(make_model())), "training did not change the weights"
    assert_weights_close(weights, expected, f"world size {world_size}, split_batches={split_batches}, "
                                            f"accumulation={accumulation} vs one process on {device}")
    _assert_same_on_every_rank(accelerator, flat_params(inner.parameters()), "the trained weights")
    # the stepping rule, counted on the constant schedule used here (see the dedicated test below)
    assert scheduler.scheduler.last_epoch == steps * (1 if split_batches else world_size)


@pytest.mark.world_size(1, 2, 4)
@pytest.mark.parametrize("split_batches", [False, True], ids=["per-process-batches", "split-batches"])
def test_scheduler_stepping_rule(device, world_size, split_batches):
    """A schedule is written for one process seeing every batch: without split_batches each optimizer
    step covers ``num_processes`` loader batches, so the scheduler steps that often; with split_batches
    once. While gradients accumulate it does not step at all."""
    def decaying(optimizer):
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)

    accelerator, _, scheduler, steps, _ = _train(device, world_size, split_batches, accumulation=2,
                                                 scheduler_factory=decaying)
    per_step = 1 if split_batches else world_size
    assert steps == EPOCHS * STEPS_PER_EPOCH
    assert scheduler.scheduler.last_epoch == steps * per_step
    assert scheduler.get_last_lr() == [LR * 0.5 ** ((steps * per_step) // 4)]


@pytest.mark.world_size(1, 2, 4)
def test_clip_grad_norm_matches_reference(device, world_size):
    max_norm = 1.0
    expected, reference_norms = reference_training(device, EPOCHS, max_norm=max_norm)
    accelerator, model, _, _, norms = _train(device, world_size, max_norm=max_norm)

    assert max(reference_norms) > max_norm, "the test must actually clip"
    assert len(norms) == len(reference_norms)
    # the norm is taken over the all-reduced gradient: the same on every rank and as in one process
    torch.testing.assert_close(torch.tensor(norms), torch.tensor(reference_norms), **FP32_TOLERANCE)
    assert_weights_close(host_weights(accelerator.unwrap_model(model)), expected,
                         f"clipped training at world size {world_size}")
    _assert_same_on_every_rank(accelerator, torch.tensor(norms, device=device), "the gradient norm")


@pytest.mark.world_size(1, 2, 4)
@pytest.mark.parametrize("split_batches", [False, True], ids=["per-process-batches", "split-batches"])
def test_gather_for_metrics_drops_duplicates_at_uneven_sizes(device, world_size, split_batches):
    n = 13  # leaves a short last batch at every world size: the sampler repeats samples to even it out
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=split_batches))
    batch = 2 * world_size if split_batches else 2
    indices = torch.arange(n)
    loader = accelerator.prepare(DataLoader(TensorDataset(indices, indices.float() / 2), batch_size=batch))
    seen, tensors, halves, objects = 0, [], [], []
    for idx, half in loader:
        assert idx.device == device
        seen += len(idx)
        tensors.append(accelerator.gather_for_metrics(idx).cpu())
        halves.append(accelerator.gather_for_metrics({"half": half})["half"].cpu())
        objects.extend(accelerator.gather_for_metrics([int(i) for i in idx.tolist()], use_gather_object=True))

    total_seen = int(accelerator.reduce(torch.tensor(seen, device=device), reduction="sum"))
    if world_size > 1:
        assert total_seen > n, "the sampler should have repeated samples to even out the last batch"
    assert torch.cat(tensors).tolist() == list(range(n))
    assert torch.cat(halves).tolist() == [i / 2 for i in range(n)]
    assert objects == list(range(n))


def _rank_batch(device, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(4, FEATURES, generator=g)
    return x.to(device), x.sum(dim=1, keepdim=True).to(device)


@pytest.mark.world_size(2, 4)
def test_no_sync_keeps_local_gradients_until_the_next_synchronised_backward(device, world_size, rank):
    accelerator = Accelerator()
    model = accelerator.prepare(make_model())
    params = list(accelerator.unwrap_model(model).parameters())

    x1, y1 = _rank_batch(device, rank, 1)
    with accelerator.no_sync(model):
        accelerator.backward(F.mse_loss(model(x1), y1))
    local_first = flat_grads(params).clone()
    rows = accelerator.gather(local_first[None])
    assert not any(torch.equal(rows[0], rows[r]) for r in range(1, world_size)), \
        "inside no_sync each rank must keep its own gradient"

    # what this rank's second batch contributes on its own, from a plain copy of the model
    x2, y2 = _rank_batch(device, rank, 2)
    plain = copy.deepcopy(accelerator.unwrap_model(model))
    plain.zero_grad(set_to_none=True)
    F.mse_loss(plain(x2), y2).backward()
    local_second = flat_grads(plain.parameters())

    accelerator.backward(F.mse_loss(model(x2), y2))  # synchronised: all-reduces what accumulated
    synced = flat_grads(params)
    _assert_same_on_every_rank(accelerator, synced, "the gradient after the synchronised backward")
    expected = accelerator.gather((local_first + local_second)[None]).mean(dim=0)
    torch.testing.assert_close(synced, expected, **FP32_TOLERANCE)


@pytest.mark.world_size(2, 4)
def test_accumulate_synchronises_and_steps_only_on_the_last_micro_batch(device, world_size, rank):
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = accelerator.prepare(make_model())
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=LR))
    params = list(accelerator.unwrap_model(model).parameters())
    for step in range(1, 5):
        before = flat_params(params).clone()
        x, y = _rank_batch(device, rank, step)
        with accelerator.accumulate(model):
            accelerator.backward(F.mse_loss(model(x), y))
            grads = accelerator.gather(flat_grads(params)[None])
            differs = [not torch.equal(grads[0], grads[r]) for r in range(1, world_size)]
            if step % 2:
                assert not accelerator.sync_gradients
                assert all(differs), f"micro-step {step}: gradients must stay local while accumulating"
            else:
                assert accelerator.sync_gradients
                assert not any(differs), f"micro-step {step}: gradients must agree on the synchronising step"
            optimizer.step()
            optimizer.zero_grad()
        moved = not torch.equal(flat_params(params), before)
        assert moved == (step % 2 == 0), f"micro-step {step}: the optimizer stepped={moved}"
        _assert_same_on_every_rank(accelerator, flat_params(params), f"the weights after micro-step {step}")
