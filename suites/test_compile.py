"""torch.compile on the backend under test: training with the backend's compiler reaches eager's losses.

A tiny model is trained a few steps twice on the device, once eager and once compiled by
``Accelerator(dynamo_backend=backend.compile_backend)`` (as an Accelerate user compiles: ``prepare``
wraps the model in ``torch.compile``). The losses and the final weights must agree within
:data:`COMPILE_TOLERANCE`. Dynamo's graph breaks are counted and go into the test's record
(``extra["compile"]``: backend, graphs, graph breaks and their reasons) so a report shows them; the
model has no reason to break, so any break fails the test.

Cheap on purpose (the default run has it on every backend): three steps of the suites' two-layer MLP,
one graph for the forward and one for the backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from _training_utils import GLOBAL_BATCH, LR, fresh_state, host_weights, make_dataset, make_model, on_backend  # noqa: F401
from accel import Accelerator

STEPS = 3

# A compiled graph fuses operators into kernels of its own (Inductor's vectorised tanh, a reduction in
# another order), so the fp32 numbers may differ from eager's by a few ULPs per operator; over three
# SGD steps that stays below 1e-6, while a missing or doubled step, a gradient lost in the compiled
# backward or weights that were not updated moves the losses by 1e-2 or more.
COMPILE_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def _train(dynamo_backend: str | None) -> tuple[list[float], dict[str, torch.Tensor], torch.nn.Module]:
    accelerator = Accelerator(dynamo_backend=dynamo_backend)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = (t.to(accelerator.device) for t in make_dataset().tensors)
    losses = []
    for step in range(STEPS):
        xb, yb = x[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH], y[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH]
        loss = F.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach().cpu()))
    return losses, host_weights(accelerator.unwrap_model(model, keep_torch_compile=False)), model


def _graph_breaks() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {str(reason): int(n) for reason, n in counters["graph_break"].items()}


def test_compiled_training_matches_eager(on_backend, device, record_property):  # noqa: F811
    import torch._dynamo
    from torch._dynamo.utils import counters

    from accel.utils import is_compiled_module

    compiler = on_backend.compile_backend
    eager_losses, eager_weights, _ = _train(None)
    fresh_state()  # the compiled run gets an Accelerator of its own
    torch._dynamo.reset()
    counters.clear()
    try:
        losses, weights, model = _train(compiler)
        breaks = _graph_breaks()
        graphs = int(counters["stats"]["unique_graphs"])
        inductor_graphs = int(counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"])
    finally:
        torch._dynamo.reset()  # compiled code holds the model; later tests start from nothing
    record_property("accel_record_extra", {"compile": {
        "backend": compiler, "graphs": graphs, "graph_breaks": sum(breaks.values()), "break_reasons": breaks}})

    assert is_compiled_module(model), f"prepare did not compile the model with dynamo_backend={compiler!r}"
    assert graphs >= 1, f"torch.compile({compiler!r}) compiled no graph"
    if compiler == "inductor":
        assert inductor_graphs >= 2, f"Inductor generated code for {inductor_graphs} graphs (forward and backward expected)"
    assert not breaks, f"graph breaks in a two-layer MLP: {breaks}"
    assert losses[-1] < losses[0], f"the compiled run did not learn: {losses}"
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), **COMPILE_TOLERANCE,
                               msg=lambda m: f"losses compiled ({compiler}) {losses} vs eager {eager_losses}: {m}")
    for key, expected in eager_weights.items():
        torch.testing.assert_close(weights[key], expected, **COMPILE_TOLERANCE,
                                   msg=lambda m, key=key: f"weight {key!r} after {STEPS} compiled steps: {m}")
