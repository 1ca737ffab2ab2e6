"""Latency and throughput metrics with vLLM bench definitions (DESIGN.md section 1).

TTFT = first token - arrival; TPOT = (e2e - TTFT) / (output - 1) for requests with more than
one output token; ITL = every gap between consecutive tokens of a request, pooled; E2EL =
finish - arrival; queue = first scheduled - arrival. Percentiles use numpy's linear method.
ITL comes from the step log: each decode step gives each of its sequences one gap equal to
the step's duration, so it is stored as (value, count) pairs, never a list per token.
"""

from __future__ import annotations

import numpy as np

PCTS = (50, 90, 99)


def weighted_stats(values: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """mean/median/std/p50/p90/p99 of the multiset holding ``weights[i]`` copies of ``values[i]``,
    exactly as numpy would give on the expanded array (linear interpolation between ranks)."""
    mask = weights > 0
    values, weights = values[mask], weights[mask].astype(np.int64)
    n = int(weights.sum())
    if n == 0:
        return {k: float("nan") for k in ("mean", "median", "std", "p50", "p90", "p99")}
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w)  # cum[i] - 1 is the last expanded index holding v[i]
    mean = float(np.dot(v, w) / n)
    std = float(np.sqrt(max(np.dot((v - mean) ** 2, w) / n, 0.0)))

    def at(idx: int) -> float:
        return float(v[np.searchsorted(cum, idx + 1)])

    def pct(p: float) -> float:
        pos = p / 100.0 * (n - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, n - 1)
        frac = pos - lo
        a = at(lo)
        return a if frac == 0 else a + (at(hi) - a) * frac

    out = {"mean": mean, "std": std, "median": pct(50)}
    out.update({f"p{p}": pct(p) for p in PCTS})
    return out


def plain_stats(values: np.ndarray) -> dict[str, float]:
    values = values[~np.isnan(values)]
    if len(values) == 0:
        return {k: float("nan") for k in ("mean", "median", "std", "p50", "p90", "p99")}
    out = {"mean": float(values.mean()), "median": float(np.median(values)), "std": float(values.std())}
    out.update({f"p{p}": float(np.percentile(values, p)) for p in PCTS})
    return out


def itl_samples(steps: dict[str, np.ndarray], resume_gaps_s: list[float],
                adjust: list[tuple[float, float]] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(gap seconds, count) pairs: each decode step's duration once per decode sequence in it.

    A fast-forwarded row of k steps holds steps evenly spaced from ``first_step_duration_s`` to
    ``last_step_duration_s``; it is expanded per step (not per token). Gaps spanning a preemption, and
    those of multi-step blocks (tokens released at a block's end: one gap per sequence per
    block), are added from the schedulers' records.
    """
    k = steps["num_steps"]
    has = steps["decode_tokens"] > 0
    if "multi_step" in steps:  # a multi-step block's gaps are listed per request (resume_gaps_s)
        has &= steps["multi_step"] == 0
    k, first, last = k[has], steps["first_step_duration_s"][has], steps["last_step_duration_s"][has]
    seqs = steps["decode_tokens"][has] // np.maximum(k, 1)
    row = np.repeat(np.arange(len(k)), k)
    offsets = np.cumsum(k) - k
    j = np.arange(int(k.sum())) - np.repeat(offsets, k)
    span = np.where(k > 1, (last - first) / np.maximum(k - 1, 1), 0.0)
    gaps = first[row] + span[row] * j
    counts = seqs[row]
    if resume_gaps_s:
        gaps = np.concatenate([gaps, np.asarray(resume_gaps_s)])
        counts = np.concatenate([counts, np.ones(len(resume_gaps_s), dtype=np.int64)])
    if len(adjust):
        # A request that joined decoding with its KV computed elsewhere (swap-in, KV transfer)
        # waited before its first decode step: that token's gap is the wait plus the step, so
        # one sample of the step's duration is replaced by the longer gap. A new gap of nan
        # removes the sample: that step emitted the request's first token (disaggregated,
        # first token from decode), part of TTFT, not an inter-token gap.
        old, new = np.asarray(adjust, dtype=np.float64).T
        new = new[~np.isnan(new)]
        gaps = np.concatenate([gaps, old, new])
        counts = np.concatenate([counts, -np.ones(len(old), np.int64), np.ones(len(new), np.int64)])
        gaps, inverse = np.unique(gaps, return_inverse=True)
        counts = np.bincount(inverse, weights=counts, minlength=len(gaps)).astype(np.int64)
        if (counts < 0).any():
            raise AssertionError("ITL adjustment removed a gap the step log does not hold")
    return gaps, counts


def request_metrics(req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-request TTFT, TPOT, E2EL and queue time in seconds (nan where undefined)."""
    ok = req["status"] == "completed"
    ttft = np.where(ok, req["first_token_s"] - req["arrival_s"], np.nan)
    e2el = np.where(ok, req["finish_s"] - req["arrival_s"], np.nan)
    out = req["output_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(ok & (out > 1), (e2el - ttft) / (out - 1), np.nan)
    queue = req["first_scheduled_s"] - req["arrival_s"]
    return {"ttft_s": ttft, "tpot_s": tpot, "e2el_s": e2el, "queue_s": queue}


def goodput_mask(m: dict[str, np.ndarray], ok: np.ndarray, slo) -> np.ndarray:
    """Completed requests meeting every SLO given (vLLM bench ``--goodput``)."""
    good = ok.copy()
    if slo.ttft_ms is not None:
        good &= m["ttft_s"] * 1e3 <= slo.ttft_ms
    if slo.tpot_ms is not None:
        good &= ~(m["tpot_s"] * 1e3 > slo.tpot_ms)  # single-token requests have no TPOT
    if slo.e2el_ms is not None:
        good &= m["e2el_s"] * 1e3 <= slo.e2el_ms
    return good
