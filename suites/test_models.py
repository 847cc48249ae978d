"""Validated models: real architectures trained to a target on the backend under test.

Each test trains one zoo model (accel_harness.models.zoo) on its learnable task through accel's
Accelerator, in one process and as DDP over two ranks, and judges the run against the host's fp32
run of the same model, data and schedule (a plain torch loop in the pytest process, computed once
per model and session): final accuracy at least 0.99x the reference's, steps to the target
accuracy at most 1.05x (accel_harness.models.gates). A backend that runs every op yet trains worse
or slower (a skipped optimizer step, an imprecise normalisation) fails here with the gate's reason.

The quick set (the zoo's ``quick`` rows) runs by default; every other model is ``slow`` and needs
``RUN_SLOW=1``. Select the suite with ``-m models`` (or ``-k models``), e.g.
``pytest suites/test_models.py -m cpu`` or ``pytest suites/test_models.py -m emu --backend emu``.
"""

from __future__ import annotations

import pytest
import torch

from accel_harness.models.gates import judge
from accel_harness.models.train import RunRecord, train
from accel_harness.models.zoo import MODELS

pytestmark = pytest.mark.models


def _marks(spec) -> list:
    marks = [] if spec.quick else [pytest.mark.slow, pytest.mark.require_opt_in("RUN_SLOW")]
    if "untuned" in spec.extra:  # strict: a row that starts to learn must lose this mark
        marks.append(pytest.mark.xfail(strict=True, reason=f"{spec.name} is not tuned yet: {spec.extra['untuned']}"))
    return marks


MODEL_PARAMS = [pytest.param(name, id=name, marks=_marks(spec)) for name, spec in MODELS.items()]

#: the gated runs train without dropout: dropout masks drawn by a device's generator (or split over
#: ranks) differ from the host's, and on models this small that alone moves steps-to-target by more
#: than the 1.05x gate (docs/models.md has the measurements); the layers stay, at probability 0
GATED_DROPOUT = 0.0

_REFERENCES: dict[str, RunRecord] = {}


@pytest.fixture
def reference(model_name: str) -> RunRecord:
    """The host fp32 run of ``model_name``, trained once per session in the pytest process (one thread,
    as the ranks run), then sent to the ranks with the test's other arguments."""
    if model_name not in _REFERENCES:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            _REFERENCES[model_name] = train(model_name, dropout=GATED_DROPOUT)
        finally:
            torch.set_num_threads(threads)
    return _REFERENCES[model_name]


@pytest.mark.world_size(1, 2)
@pytest.mark.parametrize("model_name", MODEL_PARAMS)
def test_model_trains_to_target_like_the_host_reference(device, world_size, model_name, reference):
    from accel import Accelerator

    accelerator = Accelerator()
    assert accelerator.num_processes == world_size and accelerator.device == device
    run = train(model_name, accelerator, dropout=GATED_DROPOUT)

    assert run.steps == reference.steps == len(run.losses), "the run and the reference took different step counts"
    assert run.losses[-1] < run.losses[0], f"{model_name}: the loss did not fall ({run.losses[0]} -> {run.losses[-1]})"
    verdict = judge(run, reference)
    assert verdict.passed, (f"{model_name} at world size {world_size} on {run.backend}: {verdict}\n"
                            f"run evals {run.evals}\nreference evals {reference.evals}")
