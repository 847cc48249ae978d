"""Training steps per second: a hand-written torch loop against the same loop through accel.

Two small models, fp32, AdamW, one process:

* ``mlp``: 64 -> 256 -> 256 -> 10 with ReLU, batch 64, cross-entropy;
* ``transformer``: one ``nn.TransformerEncoderLayer`` (d_model 128, 4 heads, feed-forward 512,
  no dropout), batch 8 x 32 tokens, MSE against a fixed target.

A step is what a training loop does per batch: take the next batch of a shuffling ``DataLoader``
over host tensors (starting a new epoch when one ends), move it to the device, zero the
gradients, forward, loss, backward, optimizer step. The ``torch`` variant writes that by hand
(``.to(device)``, ``loss.backward()``, ``optimizer.step()``); the ``accel`` variant is the
Accelerate-style loop (``accelerator.prepare`` of model, optimizer and loader,
``accelerator.backward``), with the prepared loader doing the device placement.

The ``accel`` instance also takes the step's kernel census (``census.py``: operators, device-side
events and allocations per step, from a profiled step outside the timed rounds) into
``extra_info["census"]``, which ``accel_reports.analyse.census`` compares between runs. It also times the hand-written loop, round by round in alternating order, and
records ``overhead_ratio``: the median over rounds of (accel round time / hand-written round time
of the same round pair), 1.00 = no overhead, > 1 = accel is slower. Pairing rounds cancels drift
on a shared machine; ``overhead_ratio_of_medians`` (ratio of the two median round times) is kept
too, and the hand-written loop's steps/s as ``baseline_throughput`` (its raw round times in
``baseline_samples_s``).

Methodology against run-to-run noise: the process is pinned to one core while it measures
(:func:`timing.pinned_to_core`, recorded in ``extra_info["cpu_pinning"]``). On the CPU backend these
small steps follow the host's memory probe, not its compute probe (measured: docs/benchmarks.md,
"Why the benchmarks are built this way"), so they declare ``host_bound="memory"`` and time the
memory probe in rounds interleaved with their own (``host_reference.py``).
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import census
import host_reference
import timing

MODELS = {
    "mlp": {"features": 64, "hidden": 256, "classes": 10, "batch": 64, "batches_per_epoch": 32},
    "transformer": {"d_model": 128, "heads": 4, "ffn": 512, "batch": 8, "seq": 32, "batches_per_epoch": 16},
}


def build(name: str) -> tuple[torch.nn.Module, TensorDataset, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    cfg = MODELS[name]
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    n = cfg["batch"] * cfg["batches_per_epoch"]
    if name == "mlp":
        model = torch.nn.Sequential(
            torch.nn.Linear(cfg["features"], cfg["hidden"]), torch.nn.ReLU(),
            torch.nn.Linear(cfg["hidden"], cfg["hidden"]), torch.nn.ReLU(),
            torch.nn.Linear(cfg["hidden"], cfg["classes"]),
        )
        data = TensorDataset(torch.randn(n, cfg["features"], generator=gen),
                             torch.randint(0, cfg["classes"], (n,), generator=gen))
        return model, data, F.cross_entropy
    model = torch.nn.TransformerEncoderLayer(cfg["d_model"], cfg["heads"], dim_feedforward=cfg["ffn"],
                                             dropout=0.0, batch_first=True)
    data = TensorDataset(torch.randn(n, cfg["seq"], cfg["d_model"], generator=gen),
                         torch.randn(n, cfg["seq"], cfg["d_model"], generator=gen))
    return model, data, F.mse_loss


def _cycle(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def torch_step(name: str, device: torch.device) -> Callable[[], torch.Tensor]:
    model, data, loss_fn = build(name)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=MODELS[name]["batch"], shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    batches = _cycle(loader)

    def step() -> torch.Tensor:
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def accel_step(name: str) -> Callable[[], torch.Tensor]:
    from accel import Accelerator

    accelerator = Accelerator()
    model, data, loss_fn = build(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=MODELS[name]["batch"], shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches = _cycle(loader)

    def step() -> torch.Tensor:
        x, y = next(batches)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        return loss

    return step


def _params(name: str) -> int:
    return sum(p.numel() for p in build(name)[0].parameters())


@pytest.mark.parametrize("variant", ["torch", "accel"])
@pytest.mark.parametrize("model", list(MODELS))
def test_train_step(benchmark, backend, accel_on_backend, bench_settings, model, variant):
    device = backend.device(0)
    hand_written = torch_step(model, device)
    extra: dict[str, Any] = {}
    pinned = timing.pinned_to_core()
    if variant == "torch":
        with pinned as pinning:
            m = host_reference.measure_with_memory_probe(benchmark, backend, hand_written, bench_settings)
        last = hand_written()
    else:
        through_accel = accel_step(model)
        with pinned as pinning:
            both = host_reference.interleave_with_memory_probe(
                benchmark, backend, {"torch": hand_written, "accel": through_accel}, bench_settings)
        m, base = both["accel"], both["torch"]
        extra = {
            "overhead_ratio": statistics.median(a / b for a, b in zip(m.samples, base.samples)),
            "overhead_ratio_of_medians": m.median / base.median,
            "baseline_throughput": base.iterations / base.median,
            "baseline_samples_s": base.samples,
            "comparison": "accel loop vs hand-written torch loop, rounds interleaved",
            census.CENSUS_KEY: census.take_census(backend, through_accel),
        }
        last = through_accel()
    cfg = MODELS[model]
    info = timing.extra_info(
        backend, m, metric=f"train_step_{model}", unit="steps/s", work_per_round=float(m.iterations),
        work_unit="steps", dtype="float32", settings=bench_settings,
        sizes={**cfg, "parameters": _params(model)}, variant=variant, host_bound=timing.on_host(backend, "memory"), optimizer="AdamW", cpu_pinning=pinning, **extra,
    )
    timing.record(benchmark, m, info)
    assert torch.isfinite(last.detach()).all()
