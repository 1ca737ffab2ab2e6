"""The runs-side-by-side figures table, with "best" marked only where it means something.

Why: a run on 2 GPUs is not "best" against one on 1 GPU, and a p99 that differs by less than
its own sampling error is not a difference. So absolute figures are compared only among runs
with the same number of GPUs, per-GPU figures across all runs, and a best value is
highlighted only when it is outside the noise of the runner-up. A latency is read over the
completed requests only, so a run that fails requests the others serve drops its hardest ones
and looks fast (``continuous`` was marked best on every latency row while failing 3,307 of
8,819 requests): latency rows rank only the runs with the fewest failed requests of their
group, and the completed and failed counts open the table. Runs under different admission
control limits (result.json ``simsrv_admission_control``) are never ranked against each other:
their rejections remove different requests from every figure.

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

import numpy as np

from sim.reporting.html import Page
from sim.metrics.keys import MAX_ITL, P999_ITL, key, queue_key
from sim.metrics.summary import measured_ids

Z95 = 1.96


@dataclass(frozen=True)
class Row:
    label: str
    key: str                            # the result.json key the figure is read from
    better: str | None = None           # "min" | "max" | None (not ranked)
    per_gpu: bool = False               # the key's value over the run's GPUs: comparable across GPU counts
    sample: tuple[str, float] | None = None   # (requests column, quantile) for a sampling interval
    noise: str = "rate"                 # "rate" | "count" | "itl:<q>" | "none"
    fmt: str = "num"                    # "num" | "pct"
    latency: bool = False               # a latency over completed requests only (see eligible_for_latency)

    @property
    def metric(self) -> str:
        """The row's name in compare.json: the result.json key, ``<key>_per_gpu`` for per-GPU rows."""
        return f"{self.key}_per_gpu" if self.per_gpu else self.key

    def value(self, s: dict) -> float | None:
        v = s.get(self.key)
        if not self.per_gpu:
            return v
        g = s.get("simsrv_num_gpus")
        return v / g if v is not None and g else None


def _latency_rows(name: str, metric: str, col: str | None) -> list[Row]:
    return [Row(f"{name} {p} (ms)", key(p, metric), "min", sample=(col, q) if col else None, latency=True)
            for p, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))]


ROWS = [
    Row("completed", "completed", "max", noise="count"),
    Row("failed", "failed", "min", noise="count"),
    Row("rejected (admission control)", "simsrv_rejected", "min", noise="count"),
    Row("GPUs", "simsrv_num_gpus"),
    *_latency_rows("TTFT", "ttft", "ttft_s"),
    *_latency_rows("TPOT", "tpot", "tpot_s"),
    *[Row(f"ITL {p} (ms)", key(p, "itl"), "min", noise=f"itl:{q}", latency=True) for p, q in
      (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))],
    Row("ITL p99.9 (ms)", P999_ITL, "min", noise="itl:0.999", latency=True),
    Row("ITL max (ms)", MAX_ITL, "min", noise="none", latency=True),
    *_latency_rows("E2E latency", "e2el", "e2el_s"),
    *[Row(f"queue time {p} (ms)", queue_key(p), "min", sample=("queue_s", q), latency=True)
      for p, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))],
    Row("requests / s", "request_throughput", "max"),
    Row("output tokens / s", "output_throughput", "max"),
    Row("total tokens / s", "total_token_throughput", "max"),
    Row("goodput (req / s meeting the SLO)", "request_goodput", "max"),
    Row("requests / s per GPU", "request_throughput", "max", per_gpu=True),
    Row("output tokens / s per GPU", "output_throughput", "max", per_gpu=True),
    Row("goodput per GPU (req / s)", "request_goodput", "max", per_gpu=True),
    Row("prefix-cache hit rate", "simsrv_prefix_cache_hit_rate", "max", fmt="pct"),
    Row("preemptions", "simsrv_num_preemptions", "min", noise="count"),
    Row("peak KV use", "simsrv_peak_kv_usage", fmt="pct"),
]

NOISE_NOTE = (
    "Highlighted: the best value of a row, only among runs with the same number of GPUs (per-GPU rows: "
    "among all runs), and only when it is outside the noise of the runner-up. A latency covers completed "
    "requests only, so on the latency rows only the runs with the fewest failed requests of their group are "
    "ranked (none when fewer than two): a run that fails requests the others serve is never best on latency. "
    "Noise: a latency percentile's "
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
        values = requests[row.sample[0]].to_numpy().astype(float)
        warmup = int(summary.get("simsrv_warmup_requests") or 0)
        if warmup and "request_id" in requests.columns:  # the figure leaves the warm-up out: so does its interval
            values = values[measured_ids(requests["request_id"].to_numpy(), warmup)]
        ci = quantile_interval(values, row.sample[1])
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
            # ranked only among runs under the same admission_control limits
            key = ("all" if row.per_gpu else r.summary.get("simsrv_num_gpus"), limits_key(r.summary))
            groups.setdefault(key, []).append((j, float(v), r))
        for members in groups.values():
            if row.latency:
                members = eligible_for_latency(members)
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


def limits_key(summary: dict) -> str:
    """The run's admission_control limits as one comparable value (no section: '')."""
    return repr(summary.get("simsrv_admission_control") or "")


def limits_differ(runs: list) -> bool:
    """Whether the runs' admission_control limits differ (then no run is ranked against another
    under other limits, and the page says so)."""
    return len({limits_key(r.summary) for r in runs}) > 1


def _failed(summary: dict) -> int:
    """Requests not served: failed, rejected by admission control, aborted by their clients (all
    leave the latencies)."""
    return (summary.get("failed") or 0) + (summary.get("simsrv_rejected") or 0) + (summary.get("simsrv_aborted") or 0)


def eligible_for_latency(members: list[tuple[int, float, object]]) -> list[tuple[int, float, object]]:
    """The runs of a group that a latency row may rank: those with the fewest failed requests
    (zero when any run of the group has none). A latency percentile covers completed requests
    only; a run that fails requests another serves drops its hardest ones and looks fast."""
    fewest = min(_failed(r.summary) for _, _, r in members)
    return [m for m in members if _failed(m[2].summary) == fewest]


def best_by_metric(runs: list, names: list[str], rows: list[Row] = ROWS) -> dict[str, str]:
    """``{metric: name of the run}`` for each row where ``best_cells`` marks exactly one run (the
    page's rule; a row with one best per GPU count names no single best and is left out)."""
    marked: dict[int, list[int]] = {}
    for i, col in sorted(best_cells(runs, rows)):
        marked.setdefault(i, []).append(col - 1)
    return {rows[i].metric: names[cols[0]] for i, cols in marked.items() if len(cols) == 1}


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
    if limits_differ(runs):
        page.paragraph("The runs have different admission_control limits ("
                       + "; ".join(f"{r.label}: {r.summary.get('simsrv_admission_control') or 'none'}" for r in runs)
                       + "): their rejections differ, so no run is ranked against one under other limits.",
                       cls="note")
    gpus = sorted({r.summary.get("simsrv_num_gpus") for r in runs}, key=lambda g: (g is None, g))
    if len(runs) > 1 and len(gpus) > 1:
        page.paragraph("The runs use different numbers of GPUs ("
                       + ", ".join(f"{r.label}: {r.summary.get('simsrv_num_gpus')}" for r in runs)
                       + "): compare their costs on the per-GPU rows.", cls="note")
    page.paragraph((NOISE_NOTE + " " if len(runs) > 1 else "") + "Latencies follow vLLM bench definitions; goodput counts completed requests "
                   "meeting every SLO of the scenario.", cls="note")
