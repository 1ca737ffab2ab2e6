"""Arrivals whose rate varies over time: piecewise-constant or diurnal (sine) profiles.

Why: production load is not stationary (the Azure and Mooncake traces swing several-fold
within an hour, and by day). Method: draw a unit-rate renewal process with gamma gaps
(shape = burstiness, as vLLM bench), then map its times through the inverse of the cumulative
rate Lambda(t) = integral of rate (time-rescaling theorem; Brown et al., Neural Computation
14(2), 2002), so the local rate follows the profile and the burstiness is kept.
"""

from __future__ import annotations

import math

import numpy as np

from sim.errors import UserError
from sim.limits import check_last_arrival_s


def _unit_times(rng: np.random.Generator, n: int, burstiness: float) -> np.ndarray:
    gaps = rng.gamma(shape=burstiness, scale=1.0 / burstiness, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def piecewise_times(lam: np.ndarray, segments: list[tuple[float, float]]) -> np.ndarray:
    """Inverse of Lambda for piecewise-constant rates; the last rate holds after the segments."""
    durs = np.array([d for d, _ in segments], dtype=float)
    rates = np.array([r for _, r in segments], dtype=float)
    cum = np.concatenate([[0.0], np.cumsum(durs * rates)])
    starts = np.concatenate([[0.0], np.cumsum(durs)])
    k = np.searchsorted(cum, lam, side="right") - 1  # skips zero-rate segments (cum flat)
    out = np.empty_like(lam)
    tail = k >= len(durs)
    out[tail] = starts[-1] + (lam[tail] - cum[-1]) / rates[-1]
    ks = k[~tail]
    out[~tail] = starts[ks] + (lam[~tail] - cum[ks]) / rates[ks]
    return out


def diurnal_cumulative(t: np.ndarray, min_rate: float, max_rate: float, period_s: float, peak_s: float) -> np.ndarray:
    """Lambda(t) for rate(t) = m + a cos(2 pi (t - peak) / P), m and a from the min and max rates."""
    m, a, w = (min_rate + max_rate) / 2.0, (max_rate - min_rate) / 2.0, 2.0 * math.pi / period_s
    return m * t + a / w * (np.sin(w * (t - peak_s)) - math.sin(-w * peak_s))


# points of the diurnal profile's interpolation grid (8 bytes each, twice): 2,000 per period
MAX_DIURNAL_GRID_POINTS = 20_000_000


def diurnal_times(lam: np.ndarray, min_rate: float, max_rate: float, period_s: float, peak_s: float) -> np.ndarray:
    """Inverse of the diurnal Lambda by interpolation on a grid of P/2000 steps (Lambda is smooth).

    Lambda(t) lies within m t +- P / pi (the sine term is at most a / w <= m P / (2 pi)), so the
    last arrival is known to within a period before the grid is built: one past ``MAX_TIME_S``,
    or a grid past ``MAX_DIURNAL_GRID_POINTS``, is refused first."""
    m = (min_rate + max_rate) / 2.0
    key = "workload.synthetic.rate_profile"
    check_last_arrival_s(float(lam[-1]) / m - period_s, key, f"a diurnal mean rate of {m:g} req/s for {len(lam):,} arrivals")
    t_end = float(lam[-1]) / m + period_s
    points = int(t_end / period_s * 2000) + 2
    if points > MAX_DIURNAL_GRID_POINTS:
        raise UserError(f"{key}.period_s: the arrivals span {t_end:.3g} s, {t_end / period_s:.3g} periods of "
                        f"{period_s:g} s; at most {MAX_DIURNAL_GRID_POINTS // 2000:,} periods are drawn: "
                        "lengthen the period or shorten the workload")
    grid = np.linspace(0.0, t_end, points)
    cum = diurnal_cumulative(grid, min_rate, max_rate, period_s, peak_s)
    return np.interp(lam, cum, grid)


def profile_arrival_times_s(rng: np.random.Generator, n: int, profile, burstiness: float) -> np.ndarray:
    """``n`` arrival times following ``profile`` (a ``RateProfile``); the first request at t = 0
    when the profile's rate is positive there."""
    lam = _unit_times(rng, n, burstiness)
    if profile.shape == "piecewise":
        return piecewise_times(lam, profile.segments)
    return diurnal_times(lam, profile.min_rate, profile.max_rate, profile.period_s, profile.peak_s)
