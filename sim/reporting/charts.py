"""Chart builders shared by the compare and diagnose reports.

Why: reports must stay readable and small with 100,000-request runs, so every chart plots
aggregates (quantiles, time bins, means), never one mark per request or step.
"""

from __future__ import annotations

import altair as alt
import numpy as np
import polars as pl

from sim.reporting.html import PAGE_CHART_WIDTH
from sim.reporting.units import fmt_latency_ms, latency_unit
from sim.core.ttft import TTFT_PARTS

CDF_POINTS = 200
TIME_BINS = 240
SCALE_RATIO = 10.0   # series whose maxima differ more than this get one panel each (own y scale)
PART_LABELS = {
    "ttft_wait_batch_s": "wait: batch/budget full", "ttft_wait_kv_s": "wait: KV blocks full",
    "ttft_prefill_s": "own prefill", "ttft_interference_s": "interference (shared steps)",
    "ttft_overhead_s": "engine overhead", "ttft_preempt_s": "preemption + recompute",
    "ttft_kv_transfer_s": "KV transfer (P/D)", "ttft_decode_s": "decode admission + first step",
    "ttft_kv_load_s": "KV load from CPU tier",
    "ttft_frontend_s": "front end (HTTP, tokenise, stream)",
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


def in_latency_unit(frame: pl.DataFrame, col: str = "value") -> tuple[pl.DataFrame, str]:
    """A frame of latencies in ms, in s instead when they reach 10,000 ms (sim/reporting/units.py);
    and the unit, for the axis title."""
    unit, k = latency_unit(frame[col].to_list() if frame.height else [])
    return (frame.with_columns(pl.col(col) * k) if k != 1.0 else frame), unit


def cdf_chart(frame: pl.DataFrame, title: str, unit: str) -> alt.Chart:
    return alt.Chart(frame, title=title).mark_line().encode(
        x=alt.X("value:Q", title=unit, scale=alt.Scale(type="log")),
        y=alt.Y("fraction:Q", title="fraction of requests"),
        color=alt.Color("run:N", title="run", legend=alt.Legend(labelLimit=300)),
    ).properties(width="container", height=260)


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


def scales_differ(frame: pl.DataFrame, fields: list[str], by: str = "run") -> bool:
    """Whether the series' maxima (per ``by``) differ by more than SCALE_RATIO: one series
    would then flatten the others near zero on a shared axis."""
    if frame.height == 0 or frame[by].n_unique() < 2:
        return False
    peaks = frame.group_by(by).agg(pl.max_horizontal(*[pl.col(f).max() for f in fields]).alias("peak"))["peak"]
    peaks = peaks.fill_null(0.0).to_numpy()
    top, low = float(peaks.max()), float(peaks[peaks > 0].min()) if (peaks > 0).any() else 0.0
    return top > 0 and (low == 0 or top / low > SCALE_RATIO)


def time_chart(frame: pl.DataFrame, field: str, title: str, unit: str) -> alt.Chart:
    """One line per run; when the runs' scales differ by more than SCALE_RATIO, one panel per
    run with its own y scale (small multiples) so no run collapses onto zero."""
    base = alt.Chart(frame).mark_line(interpolate="step-after").encode(
        x=alt.X("time_s:Q", title="simulated time (s)", scale=alt.Scale(nice=False)),
        y=alt.Y(f"{field}:Q", title=unit),
        color=alt.Color("run:N", title="run", legend=alt.Legend(labelLimit=300)),
    )
    if not scales_differ(frame, [field]):
        return base.properties(width="container", height=200, title=title)
    n = frame["run"].n_unique()
    # panels as short as 70 px: a y title per panel would run into the next panel's, so the unit
    # is named once, in the chart's title
    return base.encode(y=alt.Y(f"{field}:Q", title=None)).properties(
        width=PAGE_CHART_WIDTH, height=max(70, 200 // n)).facet(
        row=alt.Row("run:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left", labelLimit=200)),
        title=f"{title}, {unit} (one panel per run, each with its own scale)",
    ).resolve_scale(y="independent")


def decomposition_frame(requests: pl.DataFrame, label: str) -> pl.DataFrame:
    """Mean TTFT parts (ms) of requests around the median TTFT (p45-p55) and in the p99 tail;
    ``label`` carries each group's mean TTFT, as the chart shows shares."""
    done = requests.filter(pl.col("status") == "completed")
    if done.height == 0:
        return pl.DataFrame()
    t = done["ttft_s"].to_numpy()
    p45, p55, p99 = np.quantile(t, [0.45, 0.55, 0.99])
    rows = []
    for group, mask in (("p50", (t >= p45) & (t <= p55)), ("p99 tail", t >= p99)):
        sel = done.filter(pl.Series(mask))
        if sel.height == 0:  # a few requests: none between p45 and p55
            continue
        total = sum(float(sel[p].mean()) * 1e3 for p in TTFT_PARTS if p in sel.columns)
        for part in TTFT_PARTS:
            if part in sel.columns:
                rows.append({"run": label, "group": group, "part": PART_LABELS[part],
                             "ms": float(sel[part].mean()) * 1e3, "label": f"{label} ({fmt_latency_ms(total)})"})
    return pl.DataFrame(rows)


def decomposition_chart(frame: pl.DataFrame, title: str) -> alt.Chart:
    """Each run's TTFT as shares of its parts (runs' TTFTs can differ 100x: absolute bars would
    flatten the fast runs); the mean TTFT is in each bar's label."""
    return alt.Chart(frame, title=f"{title} (share of mean TTFT; the mean in brackets)").mark_bar().encode(
        x=alt.X("ms:Q", title="share of mean TTFT", stack="normalize", axis=alt.Axis(format="%")),
        y=alt.Y("label:N", title=None, axis=alt.Axis(labelLimit=300)),
        color=alt.Color("part:N", title="TTFT part", sort=list(PART_LABELS.values())),
        row=alt.Row("group:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left")),
        tooltip=["run", "group", "part", alt.Tooltip("ms:Q", format=",.1f")],
    ).properties(width=PAGE_CHART_WIDTH - 200, height=alt.Step(22)).resolve_scale(y="independent")
