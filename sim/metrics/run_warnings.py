"""What a run's figures do not say by themselves: saturation, a large share of failures, and
failure reasons grouped by kind.

Why: a saturated run (a queue that grows for as long as requests arrive) reports latencies
that depend on the run's length, not on the deployment; a run where half the requests failed
reports figures over the other half only. Both exit 0, so the run says so in words.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from sim.metrics.vllm_bench import median

SATURATION_RATIO = 0.9   # served below 90% of offered ...
QUEUE_GROWTH = 1.5       # ... and the last arrivals queue 1.5x longer than the middle ones ...
TREND_CORRELATION = 0.8  # ... rising through the second half (rank correlation), not one spike ...
GROWTH_WINDOW_SHARE = 0.005  # ... by at least 0.5% of the arrival window
FAILED_SHARE = 0.05      # warn when 5% or more of the requests failed
EXTRAPOLATED_SHARE = 0.10  # warn when over 10% of the steps were costed outside the measured profile
# simsrv validate's request-level median |simulated / measured - 1| (README, "Validation against
# published measurements"): an SLO met or missed by less than this is flagged where decided
VALIDATED_REQUEST_ERR = 0.10


def close_call(figure_ms: float | None, limit_ms: float) -> bool:
    """Whether an SLO figure is within the model's validated error of its limit (either side)."""
    return figure_ms is not None and abs(figure_ms / limit_ms - 1.0) < VALIDATED_REQUEST_ERR
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def failure_kinds(reasons: list[str]) -> dict[str, int]:
    """Failure reasons grouped by kind: reasons that differ only in their numbers are one kind,
    the numbers that vary shown as their range ("prompt+output 9000-120000 tokens > max_model_len
    8192"), so 5,000 distinct token counts make one line, not 5,000."""
    groups: dict[str, list[list[float]]] = {}
    counts: Counter[str] = Counter()
    for reason, n in Counter(reasons).items():
        template = _NUMBER.sub("#", reason)
        groups.setdefault(template, []).append([float(x) for x in _NUMBER.findall(reason)])
        counts[template] += n
    out = {}
    for template, numbers in groups.items():
        cols = np.array(numbers).T if numbers and numbers[0] else np.zeros((0, 0))
        text = template
        for col in cols:
            lo, hi = col.min(), col.max()
            text = text.replace("#", _num(lo) if lo == hi else f"{_num(lo)}-{_num(hi)}", 1)
        out[text or "(no reason recorded)"] = counts[template]
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:g}"


def window_rates(arrival_s: np.ndarray, admitted_s: np.ndarray) -> tuple[float, float]:
    """(offered, served) req/s over the arrival window [first arrival, last arrival]: arrivals
    ``(n - 1) / span`` (``mean_rate_per_s``) and requests taken into a batch inside the window
    over its span. ``arrival_s``: every request's arrival; ``admitted_s``: the completed
    requests' first scheduling (arrival + queue time).

    NOTE: completions over the time of the last finish measure the drain: on a trace slice, a
    run that queues for minutes after the last arrival still "serves" nearly everything offered.
    Inside the arrival window a deployment that cannot keep up takes requests in only as fast
    as it finishes them (its capacity); admissions, not completions, are counted because a
    request whose service outlasts a short window would count as not served by a deployment
    that keeps up."""
    if len(arrival_s) < 2:
        return float("nan"), float("nan")
    first, last = float(np.min(arrival_s)), float(np.max(arrival_s))
    span = last - first
    if span <= 0:
        return float("inf"), float("nan")
    served = int(np.count_nonzero(np.asarray(admitted_s) <= last))
    return (len(arrival_s) - 1) / span, served / span


def queue_growth(arrival_s: np.ndarray, queue_s: np.ndarray) -> tuple[bool, float, float]:
    """(growing, median queue time of the middle 10% of arrivals, of the last 10%), seconds.

    Growing: the last 10% wait 1.5x longer than the middle 10% (a queue growing linearly from
    the start gives ~1.9x; a stationary one ~1x), by at least 0.5% of the arrival window (a
    queue fed 10% faster than it drains gains ~5% of the window between the two; noise of a
    few steps does not), and the rise is a trend, not one spike: the medians of the second
    half's five arrival-order tenths rise with time (Spearman rank correlation with their
    order >= 0.8). NOTE: not compared with the service time: long decodes make service longer
    than a queue that grows all the same."""
    n = len(arrival_s)
    if n < 20:
        return False, float("nan"), float("nan")
    q = np.asarray(queue_s)[np.argsort(arrival_s, kind="stable")]
    mid = median(q[int(0.45 * n):max(int(0.55 * n), int(0.45 * n) + 1)])
    last = median(q[int(0.9 * n):])
    tenths = [median(q[int(k * n / 10):int((k + 1) * n / 10)]) for k in range(5, 10)]
    window = float(np.max(arrival_s) - np.min(arrival_s))
    growing = (last > QUEUE_GROWTH * mid and last - mid >= GROWTH_WINDOW_SHARE * window
               and _rank_correlation(tenths) >= TREND_CORRELATION)
    return bool(growing), mid, last


def _rank_correlation(values: list[float]) -> float:
    """Spearman's rank correlation of ``values`` with their order (ties: average ranks)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2 or np.all(v == v[0]):
        return 0.0
    ranks = np.empty(len(v))
    order = np.argsort(v, kind="stable")
    ranks[order] = np.arange(len(v), dtype=float)
    for x in np.unique(v):  # ties share their mean rank
        ranks[v == x] = ranks[v == x].mean()
    return float(np.corrcoef(ranks, np.arange(len(v), dtype=float))[0, 1])


@dataclass(frozen=True)
class Saturation:
    saturated: bool
    offered_per_s: float
    served_per_s: float
    mid_queue_s: float
    last_queue_s: float


def saturation(arrival_s: np.ndarray, done_arrival_s: np.ndarray, done_queue_s: np.ndarray) -> Saturation:
    """Whether a run could not keep up with its arrivals: inside the arrival window it served
    under 90% of the offered rate (``window_rates``) and the queue grew (``queue_growth``); a
    stable deployment cannot show both. ``arrival_s``: every request; ``done_*``: the completed
    ones. The one test of ``run_warnings`` and ``simsrv diagnose``."""
    offered, served = window_rates(arrival_s, np.asarray(done_arrival_s) + np.asarray(done_queue_s))
    growing, mid, last = queue_growth(done_arrival_s, done_queue_s)
    slow = bool(offered > 0 and served < SATURATION_RATIO * offered) if np.isfinite(served) else False
    return Saturation(slow and growing, offered, served, mid, last)


def run_warnings(summary: dict, arrival_s: np.ndarray, queue_s: np.ndarray,
                 all_arrival_s: np.ndarray | None = None) -> list[str]:
    """Warnings for a finished run. The arrays hold the completed requests' arrival and queue
    time, in seconds; ``all_arrival_s`` every request's arrival (default: the completed ones').
    Saturation: ``saturation``."""
    out = []
    every = arrival_s if all_arrival_s is None else all_arrival_s
    sat = saturation(every, arrival_s, queue_s)
    if sat.saturated:
        out.append(f"saturated: served {sat.served_per_s:.2f} req/s of {sat.offered_per_s:.2f} req/s offered "
                   f"({sat.served_per_s / sat.offered_per_s:.0%}) while requests arrived; the queue grew "
                   f"(median queue time {sat.mid_queue_s:,.2f} s mid-run, {sat.last_queue_s:,.2f} s for the last "
                   "10% of arrivals). Latencies here grow with the run's length: add replicas or lower the rate.")
    n, failed = summary.get("num_prompts", 0), summary.get("failed", 0)
    if n and failed / n >= FAILED_SHARE:
        kinds = summary.get("simsrv_failed_reasons") or {}
        top = "; ".join(f"{c:,} x {k}" for k, c in list(kinds.items())[:3])
        out.append(f"{failed:,} of {n:,} requests ({failed / n:.0%}) failed ({top}); every latency and "
                   "throughput figure covers completed requests only.")
    return out


def uncertainty_notes(summary: dict) -> list[str]:
    """Where the run's step costs leave what the profiles measured: the share of engine steps
    whose GEMM shapes fell outside a calibrated operator's measured range (costed at the
    nearest measured efficiency), when above 10%, and scheduled-sequence counts outside the
    engine profile's measured batch range. Their figures carry more error than ``simsrv
    validate`` measured, so a decision close to a limit should not rest on them."""
    out = []
    steps, extrapolated = summary.get("simsrv_num_steps") or 0, summary.get("simsrv_extrapolated_steps") or 0
    if steps and extrapolated / steps > EXTRAPOLATED_SHARE:
        out.append(f"extrapolated: {extrapolated / steps:.0%} of the engine steps ({extrapolated:,} of {steps:,}) "
                   "had kernel shapes outside the measured profile (costed at the nearest measured "
                   "efficiency); their error is larger than simsrv validate's")
    outside = summary.get("simsrv_overhead_outside_batch_range")
    if outside:
        out.append(f"outside the profile's measured batch range: steps of {outside[0]}-{outside[1]} sequences "
                   "took the engine overhead's per-sequence term beyond the batches it was measured on")
    return out
