"""The model suite's learning-rate decay: a row with ``decay_from`` ends on its plateau (t5), the others keep a constant rate."""

from __future__ import annotations

import dataclasses

import torch

from accel_harness.models import train as train_module
from accel_harness.models.zoo import MODELS


class _Recording(torch.optim.AdamW):
    """AdamW that records the learning rate each step was taken with."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.seen: list[float] = []

    def step(self, closure=None):
        self.seen.append(self.param_groups[0]["lr"])
        return super().step(closure)


def _rates(monkeypatch, decay_from):
    made: list[_Recording] = []
    spec = dataclasses.replace(MODELS["cnn"], steps=6, decay_from=decay_from)
    monkeypatch.setitem(MODELS, "cnn", spec)

    def factory(params, lr):
        made.append(_Recording(params, lr))
        return made[-1]

    train_module.train("cnn", optimizer_factory=factory, eval_every=6)
    return [round(lr / spec.lr, 6) for lr in made[0].seen]


def test_the_rate_falls_linearly_from_decay_from_and_never_reaches_zero(monkeypatch):
    assert _rates(monkeypatch, 4) == [1.0, 1.0, 1.0, 1.0, round(2 / 3, 6), round(1 / 3, 6)]


def test_without_decay_the_rate_is_constant(monkeypatch):
    assert _rates(monkeypatch, None) == [1.0] * 6


def test_every_decaying_row_decays_within_its_budget():
    """A row that decays starts after its first step and before its last (else the decay would do nothing)."""
    for name, spec in MODELS.items():
        if spec.decay_from is not None:
            assert 1 < spec.decay_from < spec.steps, name
