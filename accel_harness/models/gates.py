"""The model gates: did the run under test learn as well and as fast as the host's fp32 reference?

Why: mechanics tests (same weights after a step, collectives agree) pass on a backend that, say,
drops every other optimizer step or computes a layer norm slightly wrong; such a backend still
trains, only worse or slower. Two gates catch that, each against the reference run of the same
model, task, seed and schedule:

* quality: the run's final evaluation accuracy is at least ``quality_factor`` (default 0.99) times
  the reference's;
* steps-to-target: the run reaches the model's target accuracy in at most ``steps_factor``
  (default 1.05) times the reference's steps.

Both factors are parameters: the suite takes them per mode from ``accel.facts.model_gates`` (reduced
precision gets room in the steps gate), and a device profile's ``models: gates:`` section may set its
own. A loss that is not finite fails
at once; a reference that itself never reached the target makes the comparison meaningless and
fails with a reason naming the reference. :func:`judge` returns a :class:`Verdict` whose reasons
each start with the gate's name, so a report can say which gate failed and by how much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .train import RunRecord

__all__ = ["QUALITY_FACTOR", "STEPS_FACTOR", "Verdict", "judge"]

QUALITY_FACTOR = 0.99
STEPS_FACTOR = 1.05
#: the gate names a reason starts with
GATES = ("reference", "loss", "quality", "steps-to-target")


@dataclass(frozen=True)
class Verdict:
    """Passed, or the reasons it did not (each ``"<gate>: <what>"``); ``checks`` says what each gate saw."""

    passed: bool
    reasons: tuple[str, ...] = ()
    checks: dict[str, str] = field(default_factory=dict)

    def failed_gates(self) -> set[str]:
        return {reason.split(":", 1)[0] for reason in self.reasons}

    def __str__(self) -> str:
        return "passed: " + "; ".join(self.checks.values()) if self.passed else "failed: " + "; ".join(self.reasons)


def judge(run: RunRecord, reference: RunRecord, quality_factor: float = QUALITY_FACTOR,
          steps_factor: float = STEPS_FACTOR) -> Verdict:
    """Compare ``run`` with ``reference`` (same model and task) under the two gates."""
    if not 0 < quality_factor <= 1:
        raise ValueError(f"quality_factor must be in (0, 1], got {quality_factor!r}")
    if steps_factor < 1:
        raise ValueError(f"steps_factor must be at least 1, got {steps_factor!r}")
    if (run.model, run.task) != (reference.model, reference.task):
        raise ValueError(f"run {run.model}/{run.task} compared with reference {reference.model}/{reference.task}")
    what = f"{run.model} on {run.task}"
    reasons: list[str] = []
    checks: dict[str, str] = {}
    if reference.steps_to_target is None:
        reasons.append(f"reference: the host fp32 reference of {what} never reached accuracy {reference.target} in "
                       f"{reference.steps} steps (final {reference.final_accuracy:.3f}); nothing to compare with")
    bad = next((i for i, loss in enumerate(run.losses, start=1) if not math.isfinite(loss)), None)
    if bad is not None:
        reasons.append(f"loss: not finite ({run.losses[bad - 1]}) at step {bad}")
    floor = quality_factor * reference.final_accuracy
    checks["quality"] = (f"final accuracy {run.final_accuracy:.4f} vs {quality_factor:g} x reference "
                         f"{reference.final_accuracy:.4f} = {floor:.4f}")
    if run.final_accuracy < floor:
        reasons.append(f"quality: {checks['quality']}")
    if reference.steps_to_target is not None:
        limit = steps_factor * reference.steps_to_target
        if run.steps_to_target is None:
            checks["steps-to-target"] = (f"never reached accuracy {run.target} in {run.steps} steps; the reference "
                                         f"did at step {reference.steps_to_target}")
            reasons.append(f"steps-to-target: {checks['steps-to-target']}")
        else:
            checks["steps-to-target"] = (f"{run.steps_to_target:.1f} steps vs {steps_factor:g} x reference "
                                         f"{reference.steps_to_target:.1f} = {limit:.1f}")
            if run.steps_to_target > limit:
                reasons.append(f"steps-to-target: {checks['steps-to-target']}")
    return Verdict(not reasons, tuple(reasons), checks)
