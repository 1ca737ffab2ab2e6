"""Mean and 95% confidence interval of a figure over seeds.

Why: one seed is one draw of the workload; a p99 from one run can move a lot with the seed.
Means and throughputs get Student's t interval over seeds (each seed's figure is an average
of many requests, close to normal). Percentiles are not averages, so they get a percentile
bootstrap over seeds (resample the seeds with replacement, take the mean of the resampled
figures). With one seed, or with every seed giving the same figure (a trace replay does not
depend on the seed), the interval has width 0, which is what the data supports.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
from scipy.special import stdtrit  # Student's t quantile; scipy.stats takes a second to import

from sim.metrics import keys

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20240601  # fixed: the same rows always give the same interval

# figures aggregated per point (when present in the rows)
METRICS = (
    "request_rate", "request_throughput", "request_goodput", "output_throughput", "total_token_throughput", "completed", "failed",
    *(keys.key(s, m) for m in keys.LATENCY_METRICS for s in ("mean", "median", "p90", "p99")),
    keys.queue_key("mean"), keys.queue_key("p99"), "simsrv_num_preemptions", "simsrv_peak_kv_usage",
    "simsrv_utilization",
)


def is_percentile(name: str) -> bool:
    return name.split("_", 1)[0] in ("median", "p50", "p90", "p99") or "_p99_" in name or "_p90_" in name


def t_interval(x: np.ndarray) -> tuple[float, float]:
    m = float(x.mean())
    if len(x) < 2 or np.all(x == x[0]):
        return m, m
    half = stdtrit(len(x) - 1, 0.5 + CONFIDENCE / 2) * x.std(ddof=1) / math.sqrt(len(x))
    return m - half, m + half


def bootstrap_interval(x: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap of the mean over seeds."""
    m = float(x.mean())
    if len(x) < 2 or np.all(x == x[0]):
        return m, m
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    lo, hi = np.percentile(means, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)])
    return float(lo), float(hi)


# Figures bounded by definition: a t interval over few seeds can reach past the bound, which
# no run can; the interval is cut at it (all figures are >= 0; these are also <= 1).
AT_MOST_ONE = ("simsrv_peak_kv_usage", "simsrv_utilization")


def interval(name: str, x: np.ndarray) -> tuple[float, float]:
    lo, hi = bootstrap_interval(x) if is_percentile(name) else t_interval(x)
    lo = max(lo, 0.0)
    if name in AT_MOST_ONE:
        hi = min(hi, 1.0)
    return lo, hi


def aggregate(rows: pl.DataFrame, group_cols: list[str]) -> pl.DataFrame:
    """One row per point: ``group_cols``, ``num_seeds``, ``seeds_identical`` and, per figure,
    ``{figure}_mean``, ``{figure}_ci95_low``, ``{figure}_ci95_high``. Rows with an error are
    left out of the figures; ``num_errors`` counts them."""
    ok = rows.filter(pl.col("error").is_null()) if "error" in rows.columns else rows
    metrics = [m for m in METRICS if m in rows.columns]
    out = []
    for key, grp in rows.group_by("point_id", maintain_order=True):
        good = ok.filter(pl.col("point_id") == key[0])
        rec = {c: grp[c][0] for c in group_cols}
        rec["num_seeds"] = good.height
        rec["num_errors"] = grp.height - good.height
        same = good.height > 1
        for m in metrics:
            x = good[m].cast(pl.Float64, strict=False).drop_nulls().to_numpy()
            if len(x) == 0:
                rec[f"{m}_mean"] = rec[f"{m}_ci95_low"] = rec[f"{m}_ci95_high"] = None
                continue
            lo, hi = interval(m, x)
            rec[f"{m}_mean"], rec[f"{m}_ci95_low"], rec[f"{m}_ci95_high"] = float(x.mean()), lo, hi
            same = same and len(x) == good.height and bool(np.all(x == x[0]))
        rec["seeds_identical"] = same
        out.append(rec)
    return pl.DataFrame(out, infer_schema_length=None)
