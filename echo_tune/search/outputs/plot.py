"""A small self-contained SVG scatter plot for Pareto fronts (no plotting dependency)."""

from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT = 720, 460
LEFT, RIGHT, TOP, BOTTOM = 80, 20, 40, 60


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _range(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.05 or (abs(lo) * 0.05 or 1.0)
    return lo - pad, hi + pad


def pareto_svg(points: list[tuple[float, float]], front: list[tuple[float, float]], labels: list[str],
               *, title: str = "") -> str:
    """All feasible ``points`` in grey, the ``front`` in red joined by a staircase; axes named by ``labels``."""
    allp = list(points) + list(front)
    if not allp:
        allp = [(0.0, 0.0)]
    x0, x1 = _range([p[0] for p in allp])
    y0, y1 = _range([p[1] for p in allp])

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * (WIDTH - LEFT - RIGHT)

    def sy(y: float) -> float:
        return HEIGHT - BOTTOM - (y - y0) / (y1 - y0) * (HEIGHT - TOP - BOTTOM)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>']
    bx0, by0, bx1, by1 = LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM
    out.append(f'<rect x="{bx0}" y="{by0}" width="{bx1 - bx0}" height="{by1 - by0}" fill="none" stroke="#333"/>')
    for t in _ticks(x0, x1):
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{by1}" x2="{x:.1f}" y2="{by1 + 5}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{by1 + 18}" text-anchor="middle">{_fmt(t)}</text>')
    for t in _ticks(y0, y1):
        y = sy(t)
        out.append(f'<line x1="{bx0 - 5}" y1="{y:.1f}" x2="{bx0}" y2="{y:.1f}" stroke="#333"/>')
        out.append(f'<text x="{bx0 - 8}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    out.append(f'<text x="{(bx0 + bx1) / 2}" y="{HEIGHT - 18}" text-anchor="middle">{escape(labels[0])}</text>')
    if len(labels) > 1:
        out.append(f'<text x="18" y="{(by0 + by1) / 2}" text-anchor="middle" '
                   f'transform="rotate(-90 18 {(by0 + by1) / 2})">{escape(labels[1])}</text>')
    for x, y in points:
        out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="#999" fill-opacity="0.6"/>')
    ordered = sorted(front)
    if len(ordered) > 1:
        path = [f"M{sx(ordered[0][0]):.1f},{sy(ordered[0][1]):.1f}"]
        for (_, ya), (xb, yb) in zip(ordered, ordered[1:]):
            path.append(f"H{sx(xb):.1f}V{sy(yb):.1f}")
        out.append(f'<path d="{"".join(path)}" fill="none" stroke="#d62728" stroke-width="1.5"/>')
    for x, y in ordered:
        out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4.5" fill="#d62728">'
                   f'<title>{escape(labels[0])}={_fmt(x)}, {escape(labels[-1])}={_fmt(y)}</title></circle>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
