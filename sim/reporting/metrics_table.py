"""The runs-side-by-side figures table, with "best" marked only where it means something.

Why: a run on 2 GPUs is not "best" against one on 1 GPU, and a p99 that differs by less than
its own sampling error is not a difference. So absolute figures are compared only among runs
with the same number of GPUs, per-GPU figures across all runs, and a best value is
highlighted only when it is outside the noise of the runner-up.

NOTE (noise, stated on the page): a latency percentile read from per-request samples gets the
distribution-free 95% interval of a quantile (the order statistics at ranks n*p -/+
1.96*sqrt(n*p*(1-p)), Conover, Practical Nonparametric Statistics, 3rd ed., section 3.2); two
runs differ when their intervals do not overlap. Figures without per-request samples (ITL
percentiles, rates, counts) get a Poisson interval from the count behind them: value -/+
value/sqrt(k), k the samples beyond the percentile (ITL) or the completed requests (rates, hit
rate), so two runs differ when the relative gap exceeds ~2/sqrt(k); a count c gets
c -/+ 2*sqrt(c). A maximum rests on one sample and is never highlighted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sim.reporting.html import Page

Z95 = 1.96


@dataclass(frozen=True)
class Row:
    label: str
    value: Callable[[dict], float | None]
    better: str | None = None           # "min" | "max" | None (not ranked)
    per_gpu: bool = False               # comparable across different GPU counts
    sample: tuple[str, float] | None = None   # (requests column, quantile) for a sampling interval
    noise: str = "rate"                 # "rate" | "count" | "itl:<q>" | "none"
    fmt: str = "num"                    # "num" | "pct"


def _key(k: str) -> Callable[[dict], float | None]:
    return lambda s: s.get(k)


def _per_gpu(k: str) -> Callable[[dict], float | None]:
    def f(s: dict) -> float | None:
        v, g = s.get(k), s.get("simsrv_num_gpus")
        return v / g if v is not None and g else None
    return f


def _latency_rows(name: str, key: str, col: str | None) -> list[Row]:
    return [Row(f"{name} {p} (ms)", _key(f"{p}_{key}_ms"), "min", sample=(col, q) if col else None)
            for p, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))]


ROWS = [
    Row("GPUs", _key("simsrv_num_gpus")),
    *_latency_rows("TTFT", "ttft", "ttft_s"),
    *_latency_rows("TPOT", "tpot", "tpot_s"),
    *[Row(f"ITL {p} (ms)", _key(f"{p}_itl_ms"), "min", noise=f"itl:{q}") for p, q in
      (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))],
    Row("ITL p99.9 (ms)", _key("p99.9_itl_ms"), "min", noise="itl:0.999"),
    Row("ITL max (ms)", _key("simsrv_max_itl_ms"), "min", noise="none"),
    *_latency_rows("E2E latency", "e2el", "e2el_s"),
    *[Row(f"queue time {p} (ms)", _key(f"simsrv_{p}_queue_time_ms"), "min", sample=("queue_s", q))
      for p, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))],
    Row("requests / s", _key("request_throughput"), "max"),
    Row("output tokens / s", _key("output_throughput"), "max"),
    Row("total tokens / s", _key("total_token_throughput"), "max"),
    Row("goodput (req / s meeting the SLO)", _key("request_goodput"), "max"),
    Row("requests / s per GPU", _per_gpu("request_throughput"), "max", per_gpu=True),
    Row("output tokens / s per GPU", _per_gpu("output_throughput"), "max", per_gpu=True),
    Row("goodput per GPU (req / s)", _per_gpu("request_goodput"), "max", per_gpu=True),
    Row("prefix-cache hit rate", _key("simsrv_prefix_cache_hit_rate"), "max", fmt="pct"),
    Row("completed", _key("completed"), "max", noise="count"),
    Row("failed", _key("failed"), "min", noise="count"),
    Row("preemptions", _key("simsrv_num_preemptions"), "min", noise="count"),
    Row("peak KV use", _key("simsrv_peak_kv_usage"), fmt="pct"),
]

NOISE_NOTE = (
    "Highlighted: the best value of a row, only among runs with the same number of GPUs (per-GPU rows: "
    "among all runs), and only when it is outside the noise of the runner-up. Noise: a latency percentile's "
    "distribution-free 95% interval from its per-request samples (intervals must not overlap); for ITL "
    "percentiles, rates and the hit rate, value +/- value/sqrt(k) (k: ITL samples beyond the percentile, or "
    "completed requests), i.e. a relative gap above about 2/sqrt(k); for a count c, c +/- 2*sqrt(c) (Poisson). "
    "Maxima rest on one sample and are not highlighted.")


def quantile_interval(values: np.ndarray, q: float) -> tuple[float, float] | None:
    """Distribution-free 95% interval of the ``q`` quantile from samples (order statistics)."""
    v = np.sort(values[~np.isnan(values)])
    n = len(v)
    if n < 2:
        return None
    half = Z95 * math.sqrt(n * q * (1 - q))
    lo = int(max(math.floor(n * q - half) - 1, 0))
    hi = int(min(math.ceil(n * q + half) - 1, n - 1))
    return float(v[lo]), float(v[hi])


def _interval(row: Row, summary: dict, requests, value: float) -> tuple[float, float]:
    """The figure's noise interval: the sampling interval, or value -/+ the Poisson margin."""
    if row.sample and requests is not None and row.sample[0] in getattr(requests, "columns", ()):
        ci = quantile_interval(requests[row.sample[0]].to_numpy().astype(float), row.sample[1])
        if ci is not None:
            return ci[0] * 1e3, ci[1] * 1e3
    if row.noise == "none":
        return -math.inf, math.inf
    if row.noise == "count":
        return value - 2 * math.sqrt(max(value, 1)), value + 2 * math.sqrt(max(value, 1))  # sum of variances
    if row.noise.startswith("itl:"):
        n = summary.get("simsrv_num_itl_samples") or max(
            (summary.get("total_output_tokens") or 0) - (summary.get("completed") or 0), 0)
        k = n * (1 - float(row.noise[4:]))
    else:
        k = summary.get("completed") or 0
    if k < 1:
        return -math.inf, math.inf
    margin = abs(value) / math.sqrt(k)  # half of 2/sqrt(k): two half-margins must not overlap
    return value - margin, value + margin


def best_cells(runs: list, rows: list[Row] = ROWS) -> set[tuple[int, int]]:
    """(row, column) cells to highlight; column j + 1 is run j (column 0 holds the labels)."""
    best = set()
    for i, row in enumerate(rows):
        if row.better is None:
            continue
        groups: dict = {}
        for j, r in enumerate(runs):
            v = row.value(r.summary)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                continue
            key = "all" if row.per_gpu else r.summary.get("simsrv_num_gpus")
            groups.setdefault(key, []).append((j, float(v), r))
        for members in groups.values():
            if len(members) < 2:
                continue
            sign = 1.0 if row.better == "min" else -1.0
            members.sort(key=lambda m: sign * m[1])
            (j0, v0, r0), (_, v1, r1) = members[0], members[1]
            if v0 == v1:
                continue
            a = _interval(row, r0.summary, r0.requests, v0)
            b = _interval(row, r1.summary, r1.requests, v1)
            separated = a[1] < b[0] if row.better == "min" else a[0] > b[1]
            if separated:
                best.add((i, j0 + 1))
    return best


def _fmt(row: Row, v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if row.fmt == "pct":
        return f"{v:.1%}"
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
    return f"{v:,}"


def metrics_table(page: Page, runs: list) -> None:
    rows = [[row.label, *(_fmt(row, row.value(r.summary)) for r in runs)] for row in ROWS]
    page.table(["metric", *(r.label for r in runs)], rows, best_cells(runs))
    gpus = sorted({r.summary.get("simsrv_num_gpus") for r in runs}, key=lambda g: (g is None, g))
    if len(runs) > 1 and len(gpus) > 1:
        page.paragraph("The runs use different numbers of GPUs ("
                       + ", ".join(f"{r.label}: {r.summary.get('simsrv_num_gpus')}" for r in runs)
                       + "): compare their costs on the per-GPU rows.", cls="note")
    page.paragraph((NOISE_NOTE + " " if len(runs) > 1 else "") + "Latencies follow vLLM bench definitions; goodput counts completed requests "
                   "meeting every SLO of the scenario.", cls="note")
