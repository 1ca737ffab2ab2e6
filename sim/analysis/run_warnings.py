"""What a run's figures do not say by themselves: saturation, a large share of failures, and
failure reasons grouped by kind.

Why: a saturated run (a queue that grows for as long as requests arrive) reports latencies
that depend on the run's length, not on the deployment; a run where half the requests failed
reports figures over the other half only. Both exit 0, so the run says so in words.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from sim.analysis.metrics import median

SATURATION_RATIO = 0.9   # served below 90% of offered ...
QUEUE_GROWTH = 1.5       # ... and the last arrivals queue 1.5x longer than the middle ones, and longer than service
FAILED_SHARE = 0.05      # warn when 5% or more of the requests failed
EXTRAPOLATED_SHARE = 0.10  # warn when over 10% of the steps were costed outside the measured profile
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


def run_warnings(summary: dict, arrival_s: np.ndarray, queue_s: np.ndarray, service_s: np.ndarray) -> list[str]:
    """Warnings for a finished run. The arrays hold the completed requests' arrival, queue time
    and service time (E2E latency less queue time), in seconds.

    NOTE: saturation is read from two facts that a stable run cannot show together: the served
    rate (completed / duration) is below 90% of the offered rate, and the queue grows while
    requests arrive: the median queue time of the last 10% of arrivals is 1.5x that of the
    middle 10% (a queue growing linearly from the start gives ~1.9x; a stationary one ~1x) and
    longer than the median service time. A short run of a stable deployment, whose served rate
    is low only because the run ends with the last requests' service, fails the second test."""
    out = []
    offered = summary.get("request_rate")
    served = summary.get("request_throughput") or 0.0
    if isinstance(offered, (int, float)) and offered > 0 and len(arrival_s) >= 20:
        order = np.argsort(arrival_s, kind="stable")
        q = queue_s[order]
        n = len(q)
        mid = median(q[int(0.45 * n):max(int(0.55 * n), int(0.45 * n) + 1)])
        last = median(q[int(0.9 * n):])
        if served < SATURATION_RATIO * offered and last > QUEUE_GROWTH * mid and last > median(service_s):
            out.append(f"saturated: served {served:.2f} req/s of {offered:.2f} req/s offered "
                       f"({served / offered:.0%}); the queue grew while requests arrived (median queue time "
                       f"{mid:,.2f} s mid-run, {last:,.2f} s for the last 10% of arrivals). Latencies here grow "
                       "with the run's length: add replicas or lower the rate.")
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
