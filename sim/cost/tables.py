"""Efficiency tables: log(efficiency) interpolated between measured shapes along a roofline axis.

Why: an efficiency curve measured on a grid of shapes must be evaluated at shapes between
the grid points (held-out rows, a model's layer widths). The interpolation coordinate is the
log of the operator's roofline bound at the shape (``Axis``), not the log of the shape
itself: log(eff) = log(bound) - log(time), so interpolating log(eff) linearly in log(bound)
interpolates log(time) linearly in log(bound). That is exact both where a kernel is at a
fixed latency (time flat while the bound grows) and where it tracks the roofline (time
proportional to the bound), and a power law in between. In log(shape) the same data is
curved wherever the bound is affine in the shape (decode attention reads the cached K/V
plus a fixed query: bound ~ context + heads/kv_heads), which cost up to 6% at held-out
contexts. Outside the grid the nearest measured efficiency is returned and flagged (issue
"Calibrate the cost model": fall back to the nearest measured efficiency, mark the step
extrapolated). Plain Python: these run on the simulator's per-step path.
"""

from __future__ import annotations

import math
# (bisect_right on the tables' ascending float lists, compiled and not: a native loop in its place,
# compiled, saved 2.3% of a chunked run's instructions, under the 5% that keeps a second path:
# bench/README.md, "Issue 39 item 3: one seam")
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


class Axis:
    """u(x) = log(max(a x, b + c x) + shift) + log(max((x + 1) r, 1)): the log roofline bound
    of a shape x, up to a constant, with the operator's other dimensions fixed.

    - plain log(x): a = 1 (the default, for tables whose bound is proportional to x);
    - GEMM x[m,k] @ W[k,n] along m: a = 2nk/peak, b = 2kn/bw, c = 2(k+n)/bw
      (max(FLOPs / peak, bytes / bandwidth), Williams et al. 2009);
    - decode attention along the context: a = 1, shift = heads / kv_heads (K and V of every
      cached token per KV head plus one query per head; always bandwidth bound);
    - prefill attention along the prompt length s: a = 1 and r = heads * bw / (2 (heads +
      kv_heads) peak), the FLOP/byte balance of causal attention (FLOPs 2 h d s (s + 1),
      bytes 4 d s (h + kv_heads)).
    """

    __slots__ = ("a", "b", "c", "shift", "r")

    def __init__(self, a: float = 1.0, b: float = 0.0, c: float = 0.0, shift: float = 0.0, r: float = 0.0):
        self.a, self.b, self.c, self.shift, self.r = a, b, c, shift, r

    def u(self, x: float) -> float:
        v = self.a * x
        if self.c:
            w = self.b + self.c * x
            v = w if w > v else v
        out = math.log(v + self.shift)
        if self.r:
            q = (x + 1.0) * self.r
            if q > 1.0:
                out += math.log(q)
        return out


LOG = Axis()


def pchip_slopes(xs: list[float], ys: list[float]) -> list[float]:
    """Node slopes of the monotone piecewise-cubic Hermite interpolant (Fritsch & Carlson 1980,
    the PCHIP of Moler, "Numerical Computing with MATLAB", 3.4): it never overshoots the
    measured values between two nodes, and is flat at a local extremum."""
    n = len(xs)
    if n < 3:
        s = (ys[1] - ys[0]) / (xs[1] - xs[0]) if n == 2 else 0.0
        return [s] * n
    h = [xs[i + 1] - xs[i] for i in range(n - 1)]
    d = [(ys[i + 1] - ys[i]) / h[i] for i in range(n - 1)]
    m = [0.0] * n
    for i in range(1, n - 1):
        if d[i - 1] * d[i] > 0:
            w1, w2 = 2 * h[i] + h[i - 1], h[i] + 2 * h[i - 1]
            m[i] = (w1 + w2) / (w1 / d[i - 1] + w2 / d[i])
    for i, j in ((0, 0), (n - 1, n - 2)):
        hh0, hh1 = (h[0], h[1]) if i == 0 else (h[-1], h[-2])
        d0, d1 = (d[0], d[1]) if i == 0 else (d[-1], d[-2])
        s = ((2 * hh0 + hh1) * d0 - hh0 * d1) / (hh0 + hh1)
        if s * d0 <= 0:
            s = 0.0
        elif d0 * d1 <= 0 and abs(s) > abs(3 * d0):
            s = 3 * d0
        m[i] = s
    return m


class Curve:
    """log(eff) against u = axis.u(x): piecewise linear (``cubic=False``: a power law of time
    in the bound between measured shapes) or monotone cubic (``cubic=True``, PCHIP), clamped
    outside [x0, xn]. NOTE: PCHIP is used where it wins on held-out shapes (prefill
    attention); for GEMMs it did worse (A100 p90 16.7% against 15.1%)."""

    __slots__ = ("lx", "ly", "axis", "m")

    def __init__(self, xs, log_eff, axis: Axis = LOG, cubic: bool = False):
        self.axis = axis
        pts = sorted((axis.u(x), y) for x, y in zip(xs, log_eff) if y is not None and not math.isnan(y))
        # (typed: compiled, sim/compiled_core.py, the interpolation below is arithmetic on native floats)
        self.lx: list[float] = [p[0] for p in pts]
        self.ly: list[float] = [p[1] for p in pts]
        self.m: list[float] | None = pchip_slopes(self.lx, self.ly) if cubic and len(pts) > 1 else None

    def __bool__(self) -> bool:
        return bool(self.lx)

    def at(self, u: float) -> tuple[float, bool]:
        """log(eff) at coordinate u, and whether u lies outside the measured range."""
        # bracket(self.lx, u), written out (this runs for every new shape costed)
        lx, ly = self.lx, self.ly
        n = len(lx)
        if n == 1:
            return ly[0], u != lx[0]
        if u <= lx[0]:
            i, w, out = 0, 0.0, u < lx[0]
        elif u >= lx[-1]:
            i, w, out = n - 2, 1.0, u > lx[-1]
        else:
            i = bisect_right(lx, u) - 1
            w, out = (u - lx[i]) / (lx[i + 1] - lx[i]), False
        if self.m is None or out or w == 0.0 or w == 1.0:
            return ly[i] + w * (ly[i + 1] - ly[i]), out
        h = lx[i + 1] - lx[i]
        w2, w3 = w * w, w * w * w
        return ((2 * w3 - 3 * w2 + 1) * ly[i] + (w3 - 2 * w2 + w) * h * self.m[i]
                + (3 * w2 - 2 * w3) * ly[i + 1] + (w3 - w2) * h * self.m[i + 1]), out

    def log_eff(self, x: float) -> tuple[float, bool]:
        return self.at(self.axis.u(x))

    def eff(self, x: float) -> tuple[float, bool]:
        y, out = self.at(self.axis.u(x))
        return math.exp(y), out


class Grid2:
    """log(eff) on a rectangular grid (a x b): linear in log a between rows, and along b a
    ``Curve`` on ``axis_b`` (linear or PCHIP); missing nodes (None) are filled along b from
    their neighbours first, so every row is a usable curve."""

    __slots__ = ("la", "rows", "b_nodes", "_a_brackets")

    def __init__(self, a_vals, b_vals, log_eff, axis_b: Axis = LOG, cubic: bool = False):
        self.la: list[float] = [math.log(a) for a in a_vals]
        # where the interpolant along b may bend (cost/runs.py); as floats (the tables' shapes
        # are ints: compiled, sim/compiled_core.py, each read of an int as a float made a
        # new float object; the same values and comparisons)
        self.b_nodes: list[float] = sorted(float(b) for b in b_vals)
        rows = []
        for row in log_eff:
            c = Curve(b_vals, row, axis_b)
            rows.append(Curve(b_vals, [c.log_eff(b)[0] for b in b_vals], axis_b, cubic) if c else None)
        if not any(r is not None for r in rows):
            raise ValueError("empty efficiency grid")
        # A whole missing row takes the nearest measured row (nearest measured efficiency).
        for i, r in enumerate(rows):
            if r is None:
                j = min((j for j, rr in enumerate(rows) if rr is not None), key=lambda j: abs(j - i))
                rows[i] = rows[j]
        self.rows: list[Curve] = [r for r in rows if r is not None]  # (all of them, by now)
        self._a_brackets: dict[float, tuple[int, float, bool]] = {}  # bracket(la, log a) by a (few: batch sizes)

    def eff(self, a: float, b: float) -> tuple[float, bool]:
        hit = self._a_brackets.get(a)
        if hit is None:
            hit = self._a_brackets[a] = bracket(self.la, math.log(a))
        i, wa, oa = hit
        r0 = self.rows[i]
        u = r0.axis.u(b)
        y0, ob = r0.at(u)
        if wa == 0.0 or len(self.rows) == 1:
            return math.exp(y0), oa or ob
        y1, _ = self.rows[i + 1].at(u)
        return math.exp(y0 + wa * (y1 - y0)), oa or ob
