"""Train one zoo model on its task for a fixed number of steps and record how it learned.

Why: the model suite's verdict compares *learning*, not weights: the run on the backend under test
(one process, or DDP over the harness's ranks, through accel's Accelerator) against the host's
fp32 run of the same model, data and schedule (a plain torch loop in one process, the whole global
batch per step). :func:`train` does both, so the two differ only in what is under test.

Both runs see the same samples in the same order: the task's training split holds ``steps x batch``
samples; a step takes the next ``batch`` of them (split over the ranks by the prepared DataLoader,
``batch / world_size`` each). Every ``eval_every`` steps and after the last step the model is
evaluated, in eval mode, on the task's evaluation split; the first evaluated step whose accuracy
reaches the model's target is its steps-to-target. What comes back is a :class:`RunRecord`: the
loss curve (the global batch's mean loss at every step), the evaluations, steps and time to target,
final accuracy and loss, training throughput and the peak device memory where the backend reports
one. Time excludes evaluation. Every rank returns the same record (the loss is averaged over the
ranks; the weights, hence the evaluations, agree).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset

from .tasks import TaskData, correct_and_count, make_task
from .zoo import DROPOUT, MODELS, build_model

__all__ = ["CURVE_POINTS", "RunRecord", "downsample", "train"]

#: gradient clipping norm of every run (a part of real training a backend must get right)
MAX_NORM = 1.0
EVAL_SIZE = 128
#: at most this many points of a loss curve go into a test's record
CURVE_POINTS = 100


@dataclass
class RunRecord:
    """What one training run did. ``steps_to_target`` is None when the target was never reached."""

    model: str
    task: str
    backend: str
    mode: str
    world_size: int
    steps: int
    batch: int
    target: float
    losses: list[float] = field(default_factory=list)
    #: (step, eval loss, eval accuracy), in step order
    evals: list[tuple[int, float, float]] = field(default_factory=list)
    steps_to_target: float | None = None
    seconds_to_target: float | None = None
    final_accuracy: float = 0.0
    final_loss: float = math.inf
    seconds: float = 0.0
    samples_per_second: float = 0.0
    peak_memory_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def figures(self) -> dict[str, Any]:
        """What a test's record keeps of the run (JSON-ready): the gates' inputs, time to target,
        throughput, peak memory, the evaluations and the loss curve (every ``loss_every``-th step's
        loss, at most :data:`CURVE_POINTS` of them)."""
        every, curve = downsample(self.losses, CURVE_POINTS)
        return {"model": self.model, "mode": self.mode, "backend": self.backend, "world_size": self.world_size,
                "steps": self.steps, "batch": self.batch, "target": self.target,
                "steps_to_target": self.steps_to_target, "seconds_to_target": self.seconds_to_target,
                "final_accuracy": self.final_accuracy,
                "final_loss": self.final_loss if math.isfinite(self.final_loss) else None,
                "seconds": self.seconds, "samples_per_second": self.samples_per_second,
                "peak_memory_bytes": self.peak_memory_bytes, "evals": [list(e) for e in self.evals],
                "loss_every": every, "losses": [loss if math.isfinite(loss) else None for loss in curve]}


def downsample(values: list[float], points: int) -> tuple[int, list[float]]:
    """(stride, every ``stride``-th value starting with the first) with at most ``points`` values; the
    stride is the smallest that fits, so a short curve is kept whole (stride 1)."""
    if points < 1:
        raise ValueError(f"points must be at least 1, got {points}")
    stride = max(1, math.ceil(len(values) / points))
    return stride, list(values[::stride])


class _Split(Dataset):
    """A dict of equally long tensors as a map-style dataset (the default collate stacks it back)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors["labels"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[index] for k, v in self.tensors.items()}


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


@torch.no_grad()
def _evaluate(model: torch.nn.Module, data: TaskData, device: torch.device) -> tuple[float, float]:
    """(mean loss, accuracy) over the evaluation split, in eval mode (no dropout)."""
    was_training = model.training
    model.eval()
    try:
        out = model(**_to(data.eval, device))
        correct, count = correct_and_count(data.kind, out.logits.float(), data.eval["labels"].to(device))
        return float(out.loss), correct / count
    finally:
        model.train(was_training)


def _peak_memory(backend: Any, reset: bool) -> int | None:
    """The backend's peak allocated memory (after ``reset``: start counting now); None where unsupported."""
    if backend is None:
        return None
    from accel.backends.base import UnsupportedFeatureError

    try:
        if reset:
            backend.reset_peak_memory_stats()
            return None
        return int(backend.max_memory_allocated())
    except (UnsupportedFeatureError, OSError, RuntimeError):
        return None


def _crossing(evals: list[tuple[int, float, float]], target: float) -> float:
    """The step at which accuracy reached ``target``: linear between the last two evaluations.

    Evaluating every step would cost a forward pass of the evaluation split per step; reading the
    crossing off the evaluation grid instead would round it up to a multiple of ``eval_every``, a
    rounding as large as the steps-to-target gate's margin. The interpolation removes it."""
    step, _, accuracy = evals[-1]
    if len(evals) == 1:
        return float(step)
    before, _, previous = evals[-2]
    if previous >= accuracy:
        return float(step)
    return before + (step - before) * (target - previous) / (accuracy - previous)


def _decay(step: int, start: int, steps: int) -> float:
    """The learning rate's share at ``step`` (1-based): 1 before ``start``, then falling linearly to
    ``1 / (steps - start + 1)`` at the last step (it never reaches zero: every step still moves)."""
    if step < start:
        return 1.0
    return (steps - step + 1) / (steps - start + 1)


def _set_lr(optimizer: Any, lr: float) -> None:
    """Set every parameter group's learning rate: set by hand rather than by a prepared scheduler, which
    Accelerate steps once per rank per step (a two-rank run would decay twice as fast as the host's)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def train(name: str, accelerator: Any = None, *, steps: int | None = None, seed: int = 0, eval_every: int = 4,
          dropout: float = DROPOUT, mode: str | None = None,
          optimizer_factory: Callable[[Any, float], torch.optim.Optimizer] | None = None) -> RunRecord:
    """Train zoo model ``name`` for ``steps`` (default: its budget) optimizer steps.

    Without ``accelerator``: the host fp32 reference (plain torch, one process, on the CPU). With
    one: the run under test, on ``accelerator.device`` over ``accelerator.num_processes`` ranks;
    ``mode`` names how it trains in the record (default ``single`` or ``ddp``).
    ``optimizer_factory(parameters, lr)`` replaces AdamW (a test double may pass a faulty one);
    ``dropout`` sets every dropout probability of the model.
    """
    spec = MODELS[name]
    steps = spec.steps if steps is None else steps
    data = make_task(spec.task, steps * spec.batch, EVAL_SIZE, seed=seed)
    model = build_model(name, seed=seed, dropout=dropout)
    make_optimizer = optimizer_factory or (lambda params, lr: torch.optim.AdamW(params, lr=lr))
    optimizer = make_optimizer(model.parameters(), spec.lr)
    world = 1 if accelerator is None else accelerator.num_processes
    if spec.batch % world:
        raise ValueError(f"{name}: global batch {spec.batch} does not split over {world} ranks")
    loader = DataLoader(_Split(data.train), batch_size=spec.batch // world, shuffle=False)
    if accelerator is None:
        device, backend_name, mode, backend = torch.device("cpu"), "host", "reference-fp32", None
        torch.manual_seed(seed)
    else:
        from accel.utils import set_seed

        set_seed(seed)  # every rank the same seed, as Accelerate scripts do (see docs/models.md on dropout noise)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        device, backend = accelerator.device, accelerator.backend
        backend_name, mode = backend.name, mode or ("single" if world == 1 else "ddp")
    inner = model if accelerator is None else accelerator.unwrap_model(model)
    record = RunRecord(name, spec.task, backend_name, mode, world, steps, spec.batch, spec.target)
    _peak_memory(backend, reset=True)
    elapsed = 0.0
    for step, batch in enumerate(loader, start=1):
        started = time.perf_counter()
        batch = _to(batch, device) if accelerator is None else batch
        loss = model(**batch).loss
        if accelerator is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        else:
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)
        if spec.decay_from is not None:
            _set_lr(optimizer, spec.lr * _decay(step, spec.decay_from, steps))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean = loss.detach() if accelerator is None else accelerator.reduce(loss.detach(), reduction="mean")
        record.losses.append(float(mean))  # .item() waits for the device: the step's time is complete
        elapsed += time.perf_counter() - started
        if step % eval_every == 0 or step == steps:
            eval_loss, accuracy = _evaluate(inner, data, device)
            record.evals.append((step, eval_loss, accuracy))
            if record.steps_to_target is None and accuracy >= spec.target:
                record.steps_to_target = _crossing(record.evals, spec.target)
                record.seconds_to_target = elapsed * record.steps_to_target / step
    record.steps = len(record.losses)
    record.seconds = elapsed
    record.samples_per_second = record.steps * spec.batch / elapsed if elapsed else 0.0
    if record.evals:
        _, record.final_loss, record.final_accuracy = record.evals[-1]
    record.peak_memory_bytes = _peak_memory(backend, reset=False)
    return record
