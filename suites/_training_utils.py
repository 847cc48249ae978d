"""Shared pieces of the training-level suites: data, a tiny model, a plain-torch reference loop, state resets.

Everything here is device-neutral: tensors are built on the host with fixed seeds and moved to the
device a test runs on, so every backend (and every world size) starts from the same numbers.

Single-process tests run in the pytest process itself; :func:`on_backend` points ``accel`` at the
backend of the test instance (``ACCEL_DEVICE``) and resets the shared state around the test.
Multi-process tests (``@pytest.mark.world_size``) run inside the harness's ranks, where the backend
is already selected and the state is reset before every test; they call :func:`fresh_state` only
when they build a second Accelerator.
"""

from __future__ import annotations

from typing import Iterable

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from accel.state import AcceleratorState, GradientState

#: samples per optimizer step over all processes (divisible by 1, 2 and 4 ranks times 2 micro-batches)
GLOBAL_BATCH = 16
#: samples per epoch: six optimizer steps
LENGTH = 96
FEATURES = 4
HIDDEN = 8
LR = 0.05

# fp32 reference vs distributed run: the gradient all-reduce averages per-rank means instead of
# taking one mean over the global batch, and device kernels may sum in another order for another
# batch shape. That reassociation costs a few ULPs per step; after a dozen SGD steps the weights
# agree to ~1e-6. 1e-4 relative / 1e-5 absolute leaves room for backends whose fp32 kernels differ
# from the host's, while a wrong step count, a missed all-reduce or a double-scaled loss moves the
# weights by 1e-2 or more and fails.
FP32_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}

_ENV_TO_CLEAR = (
    "ACCEL_USE_CPU", "ACCELERATE_USE_CPU", "ACCEL_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION",
    "ACCEL_GRADIENT_ACCUMULATION_STEPS", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
)


def fresh_state() -> None:
    """Forget every Accelerator/PartialState/GradientState of this process (an existing group is kept)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture
def on_backend(backend, monkeypatch):
    """For single-process tests: ``accel`` in this process selects the instance's backend."""
    monkeypatch.setenv("ACCEL_DEVICE", backend.name)
    for name in _ENV_TO_CLEAR:
        monkeypatch.delenv(name, raising=False)
    fresh_state()
    yield backend
    fresh_state()


def make_dataset(length: int = LENGTH, seed: int = 0) -> TensorDataset:
    """``y = x @ w + noise`` on the host, the same numbers on every backend."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(length, FEATURES, generator=g)
    w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    y = x @ w + 0.1 * torch.randn(length, 1, generator=g)
    return TensorDataset(x, y)


def make_model(seed: int = 0, dropout: float = 0.0) -> torch.nn.Module:
    """A two-layer MLP with weights drawn from its own generator (the global RNG is left alone)."""
    layers: list[torch.nn.Module] = [torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh()]
    if dropout:
        layers.append(torch.nn.Dropout(dropout))
    layers.append(torch.nn.Linear(HIDDEN, 1))
    model = torch.nn.Sequential(*layers)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.empty_like(p).uniform_(-0.5, 0.5, generator=g))
    return model


def host_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached host copy of ``model``'s state_dict (unwrap DDP first)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def flat_grads(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1) for p in params])


def flat_params(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def reference_training(device: torch.device, epochs: int,
                       max_norm: float | None = None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Plain torch on ``device``: one process, the whole global batch per step, SGD.

    Returns the final weights (on the host) and, with ``max_norm``, the gradient norm of each step
    before clipping.
    """
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = (t.to(device) for t in make_dataset().tensors)
    norms: list[float] = []
    for _ in range(epochs):
        for start in range(0, LENGTH, GLOBAL_BATCH):
            xb, yb = x[start:start + GLOBAL_BATCH], y[start:start + GLOBAL_BATCH]
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            if max_norm is not None:
                norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
            optimizer.step()
            optimizer.zero_grad()
    return host_weights(model), norms


def assert_weights_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str,
                         **tolerance: float) -> None:
    assert actual.keys() == expected.keys(), f"{what}: different parameters {sorted(actual)} vs {sorted(expected)}"
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], **(tolerance or FP32_TOLERANCE),
                                   msg=lambda m, key=key: f"{what}: parameter {key!r}: {m}")


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bitwise equality of two state dicts."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
