"""Chart builders shared by the compare and diagnose reports.

Why: reports must stay readable and small with 100,000-request runs, so every chart plots
aggregates (quantiles, time bins, means), never one mark per request or step.
"""

from __future__ import annotations

import altair as alt
import numpy as np
import polars as pl

from sim.ttft import TTFT_PARTS

CDF_POINTS = 200
TIME_BINS = 240
PART_LABELS = {
    "ttft_wait_batch_s": "wait: batch/budget full", "ttft_wait_kv_s": "wait: KV blocks full",
    "ttft_prefill_s": "own prefill", "ttft_interference_s": "interference (shared steps)",
    "ttft_overhead_s": "engine overhead", "ttft_preempt_s": "preemption + recompute",
}


def cdf_frame(values_by_label: dict[str, np.ndarray], scale: float = 1e3) -> pl.DataFrame:
    """CDF_POINTS quantiles per label (numpy linear method), as (label, value, fraction)."""
    rows = []
    q = np.linspace(0, 1, CDF_POINTS + 1)
    for label, v in values_by_label.items():
        v = v[~np.isnan(v)]
        if len(v):
            rows.append(pl.DataFrame({"run": label, "value": np.quantile(v, q) * scale, "fraction": q}))
    return pl.concat(rows) if rows else pl.DataFrame({"run": [], "value": [], "fraction": []})


def cdf_chart(frame: pl.DataFrame, title: str, unit: str) -> alt.Chart:
    return alt.Chart(frame, title=title).mark_line().encode(
        x=alt.X("value:Q", title=unit, scale=alt.Scale(type="log")),
        y=alt.Y("fraction:Q", title="fraction of requests"),
        color=alt.Color("run:N", title="run"),
    ).properties(width=520, height=260)


def time_frame(steps: pl.DataFrame, label: str, span_s: float) -> pl.DataFrame:
    """Step records binned over time (by each record's start): queue depth, running sequences
    and KV blocks used (duration-weighted means, summed over replicas), and prefill / decode
    tokens per engine step (tokens over engine steps in the bin, all replicas)."""
    if steps.height == 0 or span_s <= 0:
        return pl.DataFrame()
    width = span_s / TIME_BINS
    s = steps.with_columns((pl.col("start_s") / width).floor().clip(0, TIME_BINS - 1).alias("bin"))
    agg = s.group_by("bin", "replica").agg(
        ((pl.col("num_waiting") * pl.col("duration_s")).sum() / pl.col("duration_s").sum()).alias("waiting"),
        ((pl.col("num_seqs") * pl.col("duration_s")).sum() / pl.col("duration_s").sum()).alias("running"),
        ((pl.col("kv_blocks_used") * pl.col("duration_s")).sum() / pl.col("duration_s").sum()).alias("kv_blocks"),
        pl.col("prefill_tokens").sum().alias("prefill"),
        pl.col("decode_tokens").sum().alias("decode"),
        pl.col("num_steps").sum().alias("engine_steps"),
    ).group_by("bin").agg(pl.col("waiting").sum(), pl.col("running").sum(), pl.col("kv_blocks").sum(),
                          (pl.col("prefill").sum() / pl.col("engine_steps").sum()).alias("prefill_tok_step"),
                          (pl.col("decode").sum() / pl.col("engine_steps").sum()).alias("decode_tok_step"))
    return agg.with_columns((pl.col("bin") * width).alias("time_s"), pl.lit(label).alias("run")).sort("time_s")


def time_chart(frame: pl.DataFrame, field: str, title: str, unit: str) -> alt.Chart:
    return alt.Chart(frame, title=title).mark_line(interpolate="step-after").encode(
        x=alt.X("time_s:Q", title="simulated time (s)"),
        y=alt.Y(f"{field}:Q", title=unit),
        color=alt.Color("run:N", title="run"),
    ).properties(width=520, height=200)


def decomposition_frame(requests: pl.DataFrame, label: str) -> pl.DataFrame:
    """Mean TTFT parts (ms) of requests around the median TTFT (p45-p55) and in the p99 tail."""
    done = requests.filter(pl.col("status") == "completed")
    if done.height == 0:
        return pl.DataFrame()
    t = done["ttft_s"].to_numpy()
    p45, p55, p99 = np.quantile(t, [0.45, 0.55, 0.99])
    rows = []
    for group, mask in (("p50", (t >= p45) & (t <= p55)), ("p99 tail", t >= p99)):
        sel = done.filter(pl.Series(mask))
        for part in TTFT_PARTS:
            if part in sel.columns:
                rows.append({"run": label, "group": group, "part": PART_LABELS[part],
                             "ms": float(sel[part].mean()) * 1e3})
    return pl.DataFrame(rows)


def decomposition_chart(frame: pl.DataFrame, title: str) -> alt.Chart:
    return alt.Chart(frame, title=title).mark_bar().encode(
        x=alt.X("ms:Q", title="mean TTFT (ms)", stack="zero"),
        y=alt.Y("run:N", title=None),
        color=alt.Color("part:N", title="TTFT part", sort=list(PART_LABELS.values())),
        row=alt.Row("group:N", title=None),
        tooltip=["run", "group", "part", alt.Tooltip("ms:Q", format=".1f")],
    ).properties(width=460, height=alt.Step(22))
