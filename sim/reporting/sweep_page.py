"""The sweep report: latency and throughput against the offered rate, one curve per
configuration, with the 95% confidence band over seeds; and the aggregated table.

Why: a sweep's question is how each configuration degrades as load grows; the band shows
whether two curves differ by more than the seed noise. Takes plain frames, not sweep objects.
"""

from __future__ import annotations

import math

import altair as alt
import polars as pl

from sim.reporting.html import Page

LOG_RATIO = 10.0
CURVES = (
    ("p99_ttft_ms", "p99 TTFT (ms)"), ("p99_tpot_ms", "p99 TPOT (ms)"), ("p99_e2el_ms", "p99 E2E latency (ms)"),
    ("mean_ttft_ms", "mean TTFT (ms)"), ("request_throughput", "throughput (req/s)"),
    ("simsrv_utilization", "utilisation (busy fraction)"),
)


def band_chart(frame: pl.DataFrame, x: str, y: str, lo: str, hi: str, color: str, title: str, x_title: str,
               y_title: str, x_nominal: bool = False, y_log: bool = False) -> alt.LayerChart:
    """Mean as a line with points, its 95% interval as a translucent band, one colour per ``color``."""
    xe = alt.X(f"{x}:N" if x_nominal else f"{x}:Q", title=x_title,
               axis=alt.Axis(labelAngle=-30, labelLimit=260, labelOverlap=True) if x_nominal else alt.Axis())
    base = alt.Chart(frame, title=title)
    col = alt.Color(f"{color}:N", title="configuration", legend=alt.Legend(labelLimit=400))
    tip = [alt.Tooltip(f"{color}:N"), alt.Tooltip(x), alt.Tooltip(y, format=",.2f"),
           alt.Tooltip(lo, format=",.2f"), alt.Tooltip(hi, format=",.2f")]
    if x_nominal:
        ys = alt.Scale(type="log") if y_log else alt.Scale(zero=False)
        bars = base.mark_errorbar().encode(xe, alt.Y(f"{lo}:Q", title=y_title, scale=ys), alt.Y2(hi), col)
        return alt.layer(bars, base.mark_point(filled=True).encode(xe, alt.Y(f"{y}:Q"), col, tooltip=tip))
    scale = alt.Scale(type="log") if y_log else alt.Scale(zero=False)
    band = base.mark_area(opacity=0.2).encode(xe, alt.Y(f"{lo}:Q", title=y_title, scale=scale), alt.Y2(hi), col)
    line = base.mark_line(point=True).encode(xe, alt.Y(f"{y}:Q"), col, tooltip=tip)
    return alt.layer(band, line)


def _fmt(v, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}" if isinstance(v, float) else str(v)


def _ci(row: dict, m: str, digits: int = 1) -> str:
    if row.get(f"{m}_mean") is None:
        return "-"
    return f"{_fmt(row[f'{m}_mean'], digits)} [{_fmt(row[f'{m}_ci95_low'], digits)}, " \
           f"{_fmt(row[f'{m}_ci95_high'], digits)}]"


def sweep_page(agg: pl.DataFrame, x: str | None, x_title: str, title: str, notes: list[str]) -> Page:
    """``agg``: one row per point with ``label``, ``configuration`` (the label without the x key),
    and ``{figure}_mean/_ci95_low/_ci95_high``; ``x``: the numeric column to plot against (None:
    one error bar per point)."""
    page = Page(title)
    for n in notes:
        page.paragraph(n, "note")
    page.heading("Curves (mean over seeds, 95% confidence band)")
    for m, label in CURVES:
        if f"{m}_mean" not in agg.columns or agg[f"{m}_mean"].null_count() == agg.height:
            continue
        cols = ["configuration", f"{m}_mean", f"{m}_ci95_low", f"{m}_ci95_high"] + ([x] if x else ["label"])
        frame = agg.select(list(dict.fromkeys(cols))).drop_nulls(f"{m}_mean")
        if x:
            frame = frame.sort(x)
        # curves spanning more than 10x (a saturated configuration next to a healthy one) on a log axis
        vals = frame[f"{m}_mean"].to_numpy()
        y_log = bool((vals > 0).all() and vals.max() > LOG_RATIO * vals.min())
        page.chart(band_chart(frame, x or "label", f"{m}_mean", f"{m}_ci95_low", f"{m}_ci95_high", "configuration",
                              label, x_title, label + (" (log scale)" if y_log else ""), x_nominal=x is None,
                              y_log=y_log).properties(width="container", height=300))
    page.heading("Points (mean [95% CI] over seeds)")
    header = ["point", "seeds", "p99 TTFT ms", "p99 TPOT ms", "p99 E2E ms", "req/s", "utilisation", "errors"]
    rows = []
    for r in agg.iter_rows(named=True):
        rows.append([r["label"], r["num_seeds"], _ci(r, "p99_ttft_ms"), _ci(r, "p99_tpot_ms"), _ci(r, "p99_e2el_ms"),
                     _ci(r, "request_throughput", 2), _ci(r, "simsrv_utilization", 3), r["num_errors"]])
    page.table(header, rows)
    return page
