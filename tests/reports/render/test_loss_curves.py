"""accel_reports.render.loss_curves: the run's and the reference's loss curves as one small inline SVG."""

from __future__ import annotations

import re

import pytest

from accel_reports.render.loss_curves import HEIGHT, PAD, WIDTH, loss_curve_svg


def _points(svg: str, css: str) -> list[tuple[float, float]]:
    d = re.search(rf'<path class="{css}" d="([^"]*)"', svg).group(1)
    return [tuple(map(float, p[1:].split(","))) for p in d.split()]


def test_both_curves_share_the_axes_and_the_higher_loss_is_drawn_higher():
    svg = str(loss_curve_svg([2.0, 1.0, 0.5], [2.0, 0.5, 0.25], label="cnn"))
    run, ref = _points(svg, "cur"), _points(svg, "ref")
    assert run[0] == ref[0] == (PAD, PAD)  # the largest loss at the top, step 1 at the left
    assert run[-1][0] == ref[-1][0] == WIDTH - PAD
    assert run[1][1] < ref[1][1]  # the run's loss is higher at step 2: smaller y
    assert '<title>cnn</title>' in svg and 'aria-label="cnn"' in svg


def test_a_downsampled_curve_is_placed_by_its_steps_and_a_gap_breaks_the_line():
    svg = str(loss_curve_svg([1.0, float("nan"), 0.5, 0.25], [1.0] * 7, run_every=2, steps=7))
    d = re.search(r'<path class="cur" d="([^"]*)"', svg).group(1)
    assert d.startswith("M") and d.count("M") == 2  # restarted after the nan
    xs = [p[0] for p in _points(svg, "cur")]
    assert xs[1] == pytest.approx(PAD + (WIDTH - 2 * PAD) * 4 / 6, abs=0.1)  # the third value is step 5 of 7


def test_target_ticks_and_empty_curves():
    svg = str(loss_curve_svg([], None, run_target=None, reference_target=3.0, steps=5))
    assert "<path" not in svg and svg.count("<line") == 1 and f'y1="{HEIGHT - 1}"' in svg


def test_the_label_is_escaped_and_bad_strides_are_refused():
    assert "<script>" not in str(loss_curve_svg([1.0], [1.0], label="<script>alert(1)</script>"))
    with pytest.raises(ValueError, match="run_every"):
        loss_curve_svg([1.0], [1.0], run_every=0)
