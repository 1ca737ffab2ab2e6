"""Cutting and rescaling a trace: a time window, a seeded sample, a time scale or target rate.

Why: users replay a busy hour at 10x, or a 10-minute slice, without changing its shape.
Rescaling multiplies every inter-arrival gap by one factor, so the burstiness pattern (the
coefficient of variation of the gaps, the bursts' shape) is kept, never redrawn.
"""

from __future__ import annotations

import math

import numpy as np

from sim.errors import UserError
from sim.limits import check_last_arrival_s
from sim.workload.arrays import RequestArrays


def window(arr: RequestArrays, start_s: float | None, duration_s: float | None, where: str) -> RequestArrays:
    """Requests arriving in ``[start_s, start_s + duration_s)`` (trace seconds), shifted to start at 0."""
    if start_s is None and duration_s is None:
        return arr
    lo = start_s or 0.0
    hi = lo + duration_s if duration_s is not None else math.inf
    if lo < 0 or (duration_s is not None and duration_s <= 0):
        raise UserError(f"{where}: start must be >= 0 and duration > 0 (got {lo}, {duration_s})")
    keep = (arr.arrival_s >= lo) & (arr.arrival_s < hi)
    if not keep.any():
        raise UserError(f"{where}: no request arrives in [{lo:g}, {hi:g}) s; the trace spans "
                        f"0 to {arr.arrival_s[-1]:.3f} s")
    out = arr.take(keep)
    return out.retimed(float(out.arrival_s[0]), 1.0)


def sample(arr: RequestArrays, n: int | None, seed: int, where: str) -> RequestArrays:
    """``n`` requests drawn without replacement (seeded), kept in time order.

    NOTE: thinning lowers the mean rate by n / len; combine with a target rate to restore it.
    """
    if n is None or n >= len(arr):
        return arr
    if n < 1:
        raise UserError(f"{where}: sample must be >= 1 (got {n})")
    idx = np.sort(np.random.default_rng(seed).choice(len(arr), size=n, replace=False))
    out = arr.take(idx)
    return out.retimed(float(out.arrival_s[0]), 1.0)


def rescale(arr: RequestArrays, time_scale: float | None, target_rate_per_s: float | None, where: str) -> RequestArrays:
    """Multiply every arrival by ``time_scale``, or by the factor that gives ``target_rate_per_s``."""
    if time_scale is not None and target_rate_per_s is not None:
        raise UserError(f"{where}: give a time scale or a target rate, not both")
    if target_rate_per_s is not None:
        if not (target_rate_per_s > 0 and math.isfinite(target_rate_per_s)):
            raise UserError(f"{where}: target rate must be a finite number > 0 (got {target_rate_per_s})")
        rate = arr.mean_rate_per_s
        if not math.isfinite(rate):
            raise UserError(f"{where}: every request arrives at the same time; a target rate cannot be reached by "
                            "scaling the gaps")
        time_scale = rate / target_rate_per_s
    if time_scale is None or time_scale == 1.0:
        return arr
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise UserError(f"{where}: time scale must be a finite number > 0 (got {time_scale})")
    out = arr.retimed(0.0, time_scale)
    scenario = where.startswith("workload.trace")  # else a command line's flags (trace convert)
    if target_rate_per_s is not None:
        check_last_arrival_s(float(out.arrival_s[-1]), "workload.trace.target_rate" if scenario else f"{where} --target-rate",
                             f"{target_rate_per_s:g} req/s (a time scale of {time_scale:.3g} on the trace's gaps)")
    else:
        check_last_arrival_s(float(out.arrival_s[-1]), "workload.trace.time_scale" if scenario else f"{where} --time-scale",
                             f"a time scale of {time_scale:g}")
    return out


def apply(arr: RequestArrays, where: str, start_s=None, duration_s=None, sample_n=None, seed: int = 0,
          time_scale=None, target_rate_per_s=None) -> RequestArrays:
    """Window, then sample, then rescale (the target rate is reached on what remains)."""
    arr = window(arr, start_s, duration_s, where)
    arr = sample(arr, sample_n, seed, where)
    return rescale(arr, time_scale, target_rate_per_s, where)
