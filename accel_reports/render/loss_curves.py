"""Loss curves of the model suite as inline SVG: the run on the device against the host's reference.

Why: a model that learns more slowly on the device shows it at a glance as a curve above the
reference's, and a diverging run as one that leaves the chart. One small picture per model x mode in
the report's Validated models section, drawn here from the recorded curves (no plotting library):
both curves on the same axes (steps across, loss up, from 0 to the largest finite loss of either),
the reference in grey, the run in the report's colour, the target step of each as a tick.

Every number is formatted here from floats; the only text, the accessible label, is escaped.
Curves come from records (``extra["model_run"]``): a value that is not a finite number is a gap.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from markupsafe import Markup, escape

__all__ = ["loss_curve_svg"]

WIDTH, HEIGHT, PAD = 180, 56, 3


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _path(losses: Sequence[Any], every: int, x_of: Any, y_of: Any) -> str:
    """An SVG path through the finite points (``M`` starts a piece again after a gap)."""
    parts: list[str] = []
    move = True
    for i, loss in enumerate(losses):
        if not _finite(loss):
            move = True
            continue
        parts.append(f"{'M' if move else 'L'}{x_of(1 + i * every):.1f},{y_of(loss):.1f}")
        move = False
    return " ".join(parts)


def loss_curve_svg(run: Sequence[Any], reference: Sequence[Any] | None, *, run_every: int = 1,
                   reference_every: int = 1, steps: int | None = None, run_target: Any = None,
                   reference_target: Any = None, earlier: Sequence[Any] | None = None, earlier_every: int = 1,
                   label: str = "loss curve") -> Markup:
    """One ``<svg>``: ``run``'s losses (every ``run_every``-th step from step 1) over ``reference``'s.

    ``steps`` is the x range (default: the longer curve); ``run_target`` / ``reference_target`` the
    steps at which each reached the accuracy target (a tick at the bottom), None where it did not.
    ``earlier``: the same model's curve from an earlier run (dashed), for a regression across runs.
    Empty curves give an empty frame; the label says what is drawn (screen readers, tooltips)."""
    for name, every in (("run_every", run_every), ("reference_every", reference_every), ("earlier_every", earlier_every)):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"{name} must be a positive integer, got {every!r}")
    reference = list(reference or [])
    run = list(run or [])
    earlier = list(earlier or [])
    last = max(len(run) * run_every, len(reference) * reference_every, len(earlier) * earlier_every, 1)
    span = steps if _finite(steps) and steps and steps > 0 else last
    top = max([v for v in run + reference + earlier if _finite(v)] + [0.0])
    top = top if top > 0 else 1.0

    def x_of(step: float) -> float:
        return PAD + (WIDTH - 2 * PAD) * (step - 1) / max(span - 1, 1)

    def y_of(loss: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * max(0.0, min(loss, top)) / top

    body = [f'<rect class="frame" x="0.5" y="0.5" width="{WIDTH - 1}" height="{HEIGHT - 1}" fill="none"/>']
    for curve, every, css in ((reference, reference_every, "ref"), (earlier, earlier_every, "prev"), (run, run_every, "cur")):
        d = _path(curve, every, x_of, y_of)
        if d:
            body.append(f'<path class="{css}" d="{d}" fill="none"/>')
    for target, css in ((reference_target, "ref"), (run_target, "cur")):
        if _finite(target):
            x = x_of(min(float(target), span))
            body.append(f'<line class="{css}" x1="{x:.1f}" x2="{x:.1f}" y1="{HEIGHT - 1}" y2="{HEIGHT - 9}"/>')
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="loss-curve" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(label)}"><title>{escape(label)}</title>'
        + "".join(body) + "</svg>")
