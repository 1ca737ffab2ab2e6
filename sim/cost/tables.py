"""Efficiency tables: piecewise-linear interpolation of log(efficiency) in log(shape).

Why: an efficiency curve measured on a grid of shapes must be evaluated at shapes between
the grid points (held-out rows, a model's layer widths). Linear interpolation in log-log
space is monotone between nodes (it never overshoots the measured values) and reproduces a
power law exactly; outside the grid it returns the nearest measured efficiency and says so
(issue "Calibrate the cost model": fall back to the nearest measured efficiency, mark the
step extrapolated). Plain Python: these run on the simulator's per-step path.
"""

from __future__ import annotations

import math
from bisect import bisect_right


def bracket(xs: list[float], x: float) -> tuple[int, float, bool]:
    """(index i, weight w of xs[i+1], outside) for interpolation at x on ascending xs."""
    n = len(xs)
    if n == 1:
        return 0, 0.0, x != xs[0]
    if x <= xs[0]:
        return 0, 0.0, x < xs[0]
    if x >= xs[-1]:
        return n - 2, 1.0, x > xs[-1]
    i = bisect_right(xs, x) - 1
    return i, (x - xs[i]) / (xs[i + 1] - xs[i]), False


class Curve:
    """log(eff) against log(x), piecewise linear (a power law between measured shapes),
    clamped outside [x0, xn]. NOTE: monotone cubic (PCHIP) was tried and did worse on the
    held-out GEMM rows (A100 p90 17.1% against 15.5%), so the simpler form stays."""

    __slots__ = ("lx", "ly")

    def __init__(self, xs, log_eff):
        pts = sorted((math.log(x), y) for x, y in zip(xs, log_eff) if y is not None and not math.isnan(y))
        self.lx = [p[0] for p in pts]
        self.ly = [p[1] for p in pts]

    def __bool__(self) -> bool:
        return bool(self.lx)

    def log_eff(self, x: float) -> tuple[float, bool]:
        i, w, out = bracket(self.lx, math.log(x))
        if len(self.ly) == 1:
            return self.ly[0], out
        return self.ly[i] + w * (self.ly[i + 1] - self.ly[i]), out

    def eff(self, x: float) -> tuple[float, bool]:
        y, out = self.log_eff(x)
        return math.exp(y), out


class Grid2:
    """log(eff) on a rectangular grid (a x b), bilinear in (log a, log b); missing nodes (None)
    are filled along b from their neighbours first, so every row is a usable curve."""

    __slots__ = ("la", "lb", "rows")

    def __init__(self, a_vals, b_vals, log_eff):
        self.la = [math.log(a) for a in a_vals]
        self.lb = [math.log(b) for b in b_vals]
        rows = []
        for row in log_eff:
            c = Curve(b_vals, row)
            rows.append([c.log_eff(b)[0] for b in b_vals] if c else None)
        good = [r for r in rows if r is not None]
        # A whole missing row takes the nearest measured row (nearest measured efficiency).
        for i, r in enumerate(rows):
            if r is None:
                j = min((j for j, rr in enumerate(rows) if rr is not None), key=lambda j: abs(j - i))
                rows[i] = rows[j]
        if not good:
            raise ValueError("empty efficiency grid")
        self.rows = rows

    def eff(self, a: float, b: float) -> tuple[float, bool]:
        i, wa, oa = bracket(self.la, math.log(a))
        j, wb, ob = bracket(self.lb, math.log(b))
        r0 = self.rows[i]
        r1 = self.rows[i + 1] if len(self.rows) > 1 else r0
        if len(self.lb) == 1:
            y0, y1 = r0[0], r1[0]
        else:
            y0 = r0[j] + wb * (r0[j + 1] - r0[j])
            y1 = r1[j] + wb * (r1[j + 1] - r1[j])
        return math.exp(y0 + wa * (y1 - y0)), oa or ob
