"""What the loader keeps of the model suite's records: which tests they are, and the run's checked figures.

The model suite (``suites/test_models.py``) trains real architectures to a target and carries the run's
figures in ``extra["model_run"]`` (steps and time to target, throughput, peak memory, the loss curve and
the host reference's). Every value is checked on the way in; the section drawn from them is
:mod:`accel_reports.render.models_view`.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MODEL_TEST", "MODEL_TESTS", "is_model_id", "model_run_detail"]

#: the model suite's test functions (one process; two ranks)
MODEL_TEST = "suites/test_models.py::test_model_trains_to_target_like_the_host_reference"
MODEL_TESTS = (MODEL_TEST, "suites/test_models.py::test_model_trains_to_target_at_two_ranks")
#: at most this many loss values of a curve are read from a record (the suite keeps at most 100)
CURVE_LIMIT = 1000


def is_model_id(test_id: Any) -> bool:
    """Whether ``test_id`` is one of the model suite's tests."""
    return isinstance(test_id, str) and test_id.startswith(tuple(t + "[" for t in MODEL_TESTS))


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _curve(block: dict[str, Any]) -> tuple[list[float | None], int]:
    losses = block.get("losses")
    every = block.get("loss_every")
    every = every if isinstance(every, int) and not isinstance(every, bool) and every >= 1 else 1
    if not isinstance(losses, list):
        return [], every
    return [_number(v) for v in losses[:CURVE_LIMIT]], every


def _figures(block: Any) -> dict[str, Any] | None:
    if not isinstance(block, dict):
        return None
    losses, every = _curve(block)
    out: dict[str, Any] = {key: _number(block.get(key)) for key in (
        "steps", "steps_to_target", "seconds_to_target", "final_accuracy", "samples_per_second", "peak_memory_bytes",
        "seconds")}
    out.update(losses=losses, loss_every=every)
    return out


def model_run_detail(extra: Any) -> dict[str, Any] | None:
    """The figures of a model suite record's ``extra["model_run"]``, every value checked (numbers finite or
    None, curves lists of such numbers, with the reference's under ``reference``); None when absent."""
    block = extra.get("model_run") if isinstance(extra, dict) else None
    run = _figures(block)
    if run is None:
        return None
    run["mode"] = block.get("mode") if isinstance(block.get("mode"), str) else None
    run["reference"] = _figures(block.get("reference"))
    return run
