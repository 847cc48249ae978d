"""Inline SVG charts for the HTML report: small, dependency-free, every text escaped.

Each builder returns :class:`markupsafe.Markup` holding one ``<svg>`` element (no script, no
external reference, no style beyond CSS classes the report's stylesheet defines), so the page stays
one self-contained file. Every label or tooltip that came from the results goes through
:func:`markupsafe.escape`; numbers are formatted here, never taken as text from the input.

* :func:`stacked_bars`: passed / failed / skipped per cell (the pass/fail chart);
* :func:`grouped_bars`: one benchmark across backends and torch versions, the reference drawn
  as a thinner grey bar right under each current value;
* :func:`value_bar`: the current median beside its reference (and the history's noise band) in
  one table cell;
* :func:`trend`: per-run medians over time, with the noise band when one is known.

CSS classes used (defined in ``templates/report.html.j2``): ``ok``, ``bad``, ``warn``, ``skip``,
``xf``, ``ref``, ``band``, ``cur``, ``line``, ``axis``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

from markupsafe import Markup, escape

__all__ = ["grouped_bars", "stacked_bars", "trend", "value_bar"]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _svg(width: int, height: int, label: str, body: Iterable[str], cls: str = "") -> Markup:
    klass = f' class="{cls}"' if cls else ""
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg"{klass} width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">' + "".join(body) + "</svg>"
    )


def stacked_bars(
    rows: Sequence[tuple[str, Sequence[int]]],
    segments: Sequence[tuple[str, str]],
    *,
    title: str = "outcomes per cell",
    label_w: int | None = None,
    bar_w: int = 520,
    bar_h: int = 16,
) -> Markup:
    """One horizontal bar per row, split into ``segments`` (``(name, css class)``) by the row's
    counts; each bar spans the full width (shares of that row's tests), counts in the tooltip and
    at the end of the bar. ``label_w`` defaults to what the longest label needs (at 11 px)."""
    gap = 5
    if label_w is None:
        label_w = int(min(520, max(120, 6.6 * max((len(label) for label, _ in rows), default=0) + 14)))
    body = []
    for index, (label, counts) in enumerate(rows):
        y = index * (bar_h + gap)
        total = sum(int(c) for c in counts) or 1
        body.append(f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">{escape(label)}</text>')
        x = float(label_w)
        for (name, css), count in zip(segments, counts):
            if not count:
                continue
            width = bar_w * int(count) / total
            body.append(f'<rect class="{css}" x="{x:.1f}" y="{y}" width="{max(width, 0.8):.1f}" height="{bar_h}">'
                        f'<title>{escape(label)}: {int(count):,} {escape(name)}</title></rect>')
            x += width
        text = " · ".join(f"{int(c):,} {n}" for (n, _), c in zip(segments, counts) if c)
        body.append(f'<text x="{label_w + bar_w + 6}" y="{y + 12}">{escape(text)}</text>')
    height = len(rows) * (bar_h + gap) + 2
    return _svg(label_w + bar_w + 330, height, title, body)


def grouped_bars(
    items: Sequence[dict[str, Any]],
    fmt: Callable[[Any], str],
    *,
    title: str,
    label_w: int = 210,
    bar_w: int = 300,
) -> Markup:
    """One benchmark's current medians (``value``, bar coloured by ``status``) with the reference
    (``ref``) as a thin grey bar under each; ``items`` carry ``label``, ``value``, ``ref``, ``status``.
    All bars share one scale starting at zero, so lengths compare across backends."""
    bar_h, ref_h, gap = 12, 5, 7
    peak = max([i["value"] for i in items if _finite(i.get("value"))] + [i["ref"] for i in items if _finite(i.get("ref"))],
               default=0.0) or 1.0
    body = []
    y = 0
    for item in items:
        value, ref = item.get("value"), item.get("ref")
        css = {"regression": "bad", "suspect": "warn", "improvement": "ok"}.get(item.get("status"), "cur")
        body.append(f'<text x="{label_w - 6}" y="{y + 10}" text-anchor="end">{escape(item["label"])}</text>')
        if _finite(value):
            width = max(1.0, bar_w * value / peak)
            body.append(f'<rect class="{css}" x="{label_w}" y="{y}" width="{width:.1f}" height="{bar_h}">'
                        f'<title>now: {escape(fmt(value))}</title></rect>')
            body.append(f'<text x="{label_w + width + 4:.1f}" y="{y + 10}">{escape(fmt(value))}</text>')
        if _finite(ref):
            width = max(1.0, bar_w * ref / peak)
            body.append(f'<rect class="ref" x="{label_w}" y="{y + bar_h + 1}" width="{width:.1f}" height="{ref_h}">'
                        f'<title>reference: {escape(fmt(ref))}</title></rect>')
        y += bar_h + ref_h + gap
    return _svg(label_w + bar_w + 90, y + 2, title, body)


def value_bar(value: Any, ref: Any, peak: float, *, status: str = "", band: tuple[Any, Any] = (None, None),
              width: int = 120, fmt: Callable[[Any], str] = str) -> Markup:
    """The current median (upper bar) beside its reference (lower, grey) on a scale to ``peak``,
    with the noise band as a shaded span behind them; for one cell of the benchmark table."""
    height = 18
    if not peak or not _finite(peak):
        peak = 1.0
    scale = (width - 2) / peak
    body = []
    low, high = band
    if _finite(low) and _finite(high) and high >= low:
        body.append(f'<rect class="band" x="{low * scale:.1f}" y="0" width="{max((high - low) * scale, 1.0):.1f}" height="{height}">'
                    f'<title>noise band of the history: {escape(fmt(low))} – {escape(fmt(high))}</title></rect>')
    css = {"regression": "bad", "suspect": "warn", "improvement": "ok"}.get(status, "cur")
    if _finite(value):
        body.append(f'<rect class="{css}" x="0" y="2" width="{max(value * scale, 1.0):.1f}" height="8"><title>now: {escape(fmt(value))}</title></rect>')
    if _finite(ref):
        body.append(f'<rect class="ref" x="0" y="12" width="{max(ref * scale, 1.0):.1f}" height="4"><title>reference: {escape(fmt(ref))}</title></rect>')
    return _svg(width, height, "now beside the reference", body, cls="inl")


def trend(points: Sequence[tuple[str, float]], *, band: tuple[Any, Any] = (None, None), ref: Any = None,
          status: str = "", width: int = 150, height: int = 34, fmt: Callable[[Any], str] = str,
          what: str = "trend") -> Markup:
    """Per-run medians (``(when, value)``, oldest first) as a line; the newest point coloured by
    ``status``; the noise band shaded and the reference dashed when known. Empty with < 2 points.
    ``what`` names the line for screen readers ("trend over N runs")."""
    values = [v for _, v in points if _finite(v)]
    if len(values) < 2:
        return Markup("")
    lows = [v for v in (band[0], ref) if _finite(v)] + values
    highs = [v for v in (band[1], ref) if _finite(v)] + values
    lo, hi = min(lows), max(highs)
    if hi - lo < 1e-12 * max(abs(hi), 1.0):
        lo, hi = lo - 0.5 * (abs(lo) or 1), hi + 0.5 * (abs(hi) or 1)
    pad = 3
    span_y = (height - 2 * pad) / (hi - lo)

    def y_of(v: float) -> float:
        return height - pad - (v - lo) * span_y

    step = (width - 2 * pad) / (len(points) - 1)
    body = []
    if _finite(band[0]) and _finite(band[1]):
        top, bottom = y_of(band[1]), y_of(band[0])
        body.append(f'<rect class="band" x="0" y="{top:.1f}" width="{width}" height="{max(bottom - top, 1.0):.1f}">'
                    f'<title>noise band: {escape(fmt(band[0]))} – {escape(fmt(band[1]))}</title></rect>')
    if _finite(ref):
        body.append(f'<line class="axis" x1="0" x2="{width}" y1="{y_of(ref):.1f}" y2="{y_of(ref):.1f}"><title>reference: {escape(fmt(ref))}</title></line>')
    coords = [(pad + i * step, y_of(v)) for i, (_, v) in enumerate(points) if _finite(v)]
    body.append('<polyline class="line" points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in coords) + '"></polyline>')
    for (x, y), (when, value) in zip(coords, [p for p in points if _finite(p[1])]):
        body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="1.6"><title>{escape(when)}: {escape(fmt(value))}</title></circle>')
    css = {"regression": "bad", "suspect": "warn", "improvement": "ok"}.get(status, "cur")
    x, y = coords[-1]
    body.append(f'<circle class="{css}" cx="{x:.1f}" cy="{y:.1f}" r="3"><title>latest: {escape(fmt(values[-1]))}</title></circle>')
    return _svg(width, height, f"{what} over {len(values)} runs", body, cls="inl")
