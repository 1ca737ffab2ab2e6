"""Search for the highest request rate that meets an SLO, on a noisy objective.

Why: each probe of a rate is a handful of simulations with different seeds, so the figure
being compared with the SLO is noisy. A probe passes when the mean over seeds of every SLO
figure is within its limit; the seeds are common random numbers (seed k draws the same
workload shape at every rate), which keeps the objective close to monotone in the rate.
The search doubles (or halves) the rate until it brackets the knee, then splits the bracket
(``m`` probes per round, so idle workers are used) until it is within ``tolerance`` of its
low end. The knee is where the worst SLO ratio crosses 1, interpolated between the highest
passing probe and the lowest failing one; its confidence interval is a bootstrap over seeds
(the same resampled seeds at every probe), so it says how much the knee moves with the
workload draw. The bracket's width (at most ``tolerance``) is reported beside it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from sim.sweep.slo import SLOTerm
from sim.sweep.stats import BOOTSTRAP_SEED, CONFIDENCE

KNEE_RESAMPLES = 1000
MAX_DOUBLINGS = 16   # the rate is searched within start / 2^16 .. start * 2^16


@dataclass
class Probe:
    rate_per_s: float
    ratios: np.ndarray          # (seeds, terms): figure / limit; nan where a figure is undefined
    utilization: np.ndarray     # (seeds,)

    @property
    def mean_ratios(self) -> np.ndarray:
        return _mean_ratios(self.ratios)

    @property
    def margin(self) -> float:
        """Worst SLO ratio minus 1: <= 0 passes."""
        return _margin(self.mean_ratios)

    @property
    def passed(self) -> bool:
        return self.margin <= 0


def _mean_ratios(r: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a figure undefined at every seed stays nan
        return np.nanmean(r, axis=-2)


def _margin(mean_ratios: np.ndarray) -> float:
    m = mean_ratios[~np.isnan(mean_ratios)]
    return float(m.max()) - 1.0 if len(m) else math.inf  # no figure at all (nothing completed): fails


@dataclass
class Knee:
    rate_per_s: float | None          # None: the SLO fails at every probed rate
    ci95_low: float | None
    ci95_high: float | None
    bracket: tuple[float | None, float | None]   # (highest passing, lowest failing) probe rates
    censored: str | None               # "above": passes at every probed rate; "below": fails at every one
    binding: str | None                # the SLO term that fails first above the knee
    utilization: float | None          # interpolated at the knee
    seeds_identical: bool


@dataclass
class KneeSearch:
    terms: list[SLOTerm]
    start_rate_per_s: float
    tolerance: float = 0.05
    probes: dict[float, Probe] = field(default_factory=dict)

    @property
    def lo(self) -> float | None:
        hi = self.hi
        ok = [r for r, p in self.probes.items() if p.passed and (hi is None or r < hi)]
        return max(ok) if ok else None

    @property
    def hi(self) -> float | None:
        bad = [r for r, p in self.probes.items() if not p.passed]
        return min(bad) if bad else None

    def next_rates(self, m: int) -> list[float]:
        """The next ``m`` rates to probe; empty when the search is over."""
        m = max(1, m)
        lo, hi = self.lo, self.hi
        if not self.probes:
            return [self.start_rate_per_s]
        if hi is None:
            top = max(self.probes)
            limit = self.start_rate_per_s * 2**MAX_DOUBLINGS
            return [top * 2**j for j in range(1, m + 1) if top * 2**j <= limit]
        if lo is None:
            bottom = min(self.probes)
            limit = self.start_rate_per_s / 2**MAX_DOUBLINGS
            return [bottom / 2**j for j in range(1, m + 1) if bottom / 2**j >= limit]
        if hi - lo <= self.tolerance * lo:
            return []
        return [lo + (hi - lo) * j / (m + 1) for j in range(1, m + 1)]

    def add(self, probe: Probe) -> None:
        self.probes[probe.rate_per_s] = probe

    def knee(self) -> Knee:
        rates = np.array(sorted(self.probes))
        ratios = np.stack([self.probes[r].ratios for r in rates])          # (probes, seeds, terms)
        util = np.stack([self.probes[r].utilization for r in rates])        # (probes, seeds)
        est = _crossing(rates, np.array([_margin(_mean_ratios(x)) for x in ratios]))
        knee_rate, censored, i_pass, i_fail, frac = est
        seeds_identical = ratios.shape[1] < 2 or bool(np.all(np.nan_to_num(ratios - ratios[:, :1], nan=0.0) == 0))
        lo_ci = hi_ci = knee_rate
        if not seeds_identical and knee_rate is not None:
            rng = np.random.default_rng(BOOTSTRAP_SEED)
            n = ratios.shape[1]
            boot = []
            for _ in range(KNEE_RESAMPLES):
                idx = rng.integers(0, n, n)
                margins = np.array([_margin(_mean_ratios(x[idx])) for x in ratios])
                r = _crossing(rates, margins)[0]
                boot.append(rates[0] if r is None else r)
            lo_ci, hi_ci = (float(v) for v in np.percentile(boot, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)]))
        binding = None
        utilization = None
        if i_fail is not None:
            binding = self.terms[int(np.nanargmax(_mean_ratios(ratios[i_fail])))].name
        if i_pass is not None:
            u_pass = float(util[i_pass].mean())
            u_fail = float(util[i_fail].mean()) if i_fail is not None else u_pass
            utilization = u_pass + (u_fail - u_pass) * frac
        return Knee(knee_rate, lo_ci, hi_ci, (self.lo, self.hi), censored, binding, utilization, seeds_identical)


def _crossing(rates: np.ndarray, margins: np.ndarray):
    """(knee rate, censored, index of the pass probe, index of the fail probe, fraction between them)."""
    fails = np.flatnonzero(margins > 0)
    if len(fails) == 0:
        return float(rates[-1]), "above", len(rates) - 1, None, 0.0
    f = int(fails[0])
    if f == 0:
        return None, "below", None, f, 0.0
    p = f - 1  # every probe below the first failure passed
    g_p, g_f = margins[p], margins[f]
    frac = 0.0 if not math.isfinite(g_f) else float(-g_p / (g_f - g_p))  # nothing completed: no slope to use
    return float(rates[p] + (rates[f] - rates[p]) * frac), None, p, f, frac
