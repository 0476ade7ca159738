"""Small inline SVG line charts (no plotting library, no JavaScript): one chart = a few series over the step axis."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


@dataclass
class Series:
    """One line: ``points`` are (step, value) in log order (several values at one step, e.g. step 0 before and
    after a warm start, are drawn in that order)."""

    name: str
    points: list[tuple[float, float]]
    dashed: bool = False


def nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """About ``n`` round tick values (1, 2 or 5 times a power of ten apart, at least 1 when ``integer``) covering
    [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi - lo < 1e-12:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, round(step))
    first = math.floor(lo / step) * step
    ticks, v = [], first
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 12))
        v += step
    if ticks[-1] < hi:
        ticks.append(round(v, 12))
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        return f"{v:.1e}"
    return f"{v:.4g}"


def line_chart(title: str, series: list[Series], width: int = 400, height: int = 230) -> str:
    """An ``<svg>`` element: axes with round ticks, one polyline (with dots when short) per non-empty series, and a
    legend. Series without points are left out; with none at all the chart says "no data"."""
    series = [s for s in series if s.points]
    left, right, top, bottom = 52, 12, 26, 26 + 14 * max(1, len(series))
    pw, ph = width - left - right, height - top - bottom
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img"><title>{html.escape(title)}</title>',
             f'<text x="{width / 2:.1f}" y="16" text-anchor="middle" class="ct">{html.escape(title)}</text>']
    if not series:
        parts.append(f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" text-anchor="middle" class="cl">no data</text>')
        return "".join(parts) + "</svg>"
    xs = [p[0] for s in series for p in s.points]
    ys = [p[1] for s in series for p in s.points]
    xt = nice_ticks(min(xs), max(xs), 5, integer=True) if max(xs) > min(xs) else [min(xs) - 1, min(xs), min(xs) + 1]
    yt = nice_ticks(min(ys), max(ys), 4)
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def sx(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1.0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / ((y1 - y0) or 1.0) * ph

    for y in yt:
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="grid"/>'
                     f'<text x="{left - 4}" y="{sy(y) + 3:.1f}" text-anchor="end" class="cl">{_fmt(y)}</text>')
    for x in xt:
        parts.append(f'<text x="{sx(x):.1f}" y="{top + ph + 12}" text-anchor="middle" class="cl">{_fmt(x)}</text>')
    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="frame"/>')
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s.points)
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.6"{dash}/>')
        if len(s.points) <= 40:
            parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.4" fill="{color}">'
                      f"<title>{html.escape(s.name)} step {_fmt(x)}: {y:.4g}</title></circle>" for x, y in s.points]
        ly = top + ph + 26 + 14 * i
        parts.append(f'<line x1="{left}" x2="{left + 16}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" '
                     f'stroke-width="2"{dash}/><text x="{left + 20}" y="{ly}" class="cl">{html.escape(s.name)}</text>')
    return "".join(parts) + "</svg>"
