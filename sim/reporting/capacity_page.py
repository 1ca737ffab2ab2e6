"""The capacity report: each SLO figure against the probed rate per configuration, with the
SLO limit as a horizontal line and each configuration's knee as a vertical one; and the
table of knees, binding SLO, utilisation and cost figures.

Why: the knee alone hides how sharply a configuration degrades past it; the chart shows the
probes the search made and their seed noise. Takes plain records, not sweep objects.
"""

from __future__ import annotations

import altair as alt
import polars as pl

from sim.reporting.html import Page
from sim.reporting.sweep_page import _fmt, band_chart, clip_for_log
from sim.reporting.units import latency_unit


X_LOG_RATIO = 100.0


def _knee_text(r: dict) -> str:
    if r["error"]:
        return "error"
    if r["knee_rate_per_s"] is None:
        return f"< {_fmt(r['bracket_high_per_s'], 2)} (fails at every probed rate)"
    if r["censored"] == "above":
        return f">= {_fmt(r['knee_rate_per_s'], 2)} (meets the SLO at every probed rate)"
    return f"{_fmt(r['knee_rate_per_s'], 2)} [{_fmt(r['knee_ci95_low'], 2)}, {_fmt(r['knee_ci95_high'], 2)}]"


def _bracket_text(r: dict) -> str:
    """The probed rates around the knee; an open end ("- -" before) as a bound."""
    low, high = r["bracket_low_per_s"], r["bracket_high_per_s"]
    if low is None and high is None:
        return "-"
    if high is None:
        return f">= {_fmt(low, 2)}"
    if low is None:
        return f"< {_fmt(high, 2)}"
    return f"{_fmt(low, 2)} - {_fmt(high, 2)}"


def capacity_table(records: list[dict]) -> tuple[list[str], list[list]]:
    header = ["configuration", "knee req/s [95% CI]", "bracket req/s", "binding SLO", "utilisation at knee",
              "GPUs", "req/s per GPU", "requests per $"]
    rows = []
    for r in records:
        rows.append([r["label"], _knee_text(r),
                     _bracket_text(r),
                     r["binding_slo"] or "-", _fmt(r["utilization_at_knee"], 3), r["num_gpus"],
                     _fmt(r["requests_per_s_per_gpu"], 2), _fmt(r["requests_per_dollar"], 0)])
    return header, rows


def capacity_page(records: list[dict], probes: list[dict], title: str, notes: list[str]) -> Page:
    """``records``: one per configuration (``CapacityResult.records()``); ``probes``: one per
    (configuration, rate, SLO term) with ``value_ms`` and its CI (``probe_records()``)."""
    page = Page(title)
    for n in notes:
        page.paragraph(n, "note")
    header, rows = capacity_table(records)
    best = {i for i, r in enumerate(records) if r["requests_per_dollar"] is not None}
    if best:
        top = max(best, key=lambda i: records[i]["requests_per_dollar"])
        page.table(header, rows, best={(top, 7)})
    else:
        top = max(range(len(records)), key=lambda i: records[i]["requests_per_s_per_gpu"] or -1, default=None)
        page.table(header, rows, best={(top, 6)} if top is not None else frozenset())
    for r in records:
        for what in ("error", "warning"):
            if r.get(what):
                page.paragraph(f"{r['label']}: {what}: {r[what]}", "note")
    frame = pl.DataFrame(probes, infer_schema_length=None) if probes else None
    knees = pl.DataFrame([{"label": r["label"], "knee_rate_per_s": r["knee_rate_per_s"]} for r in records
                          if r["knee_rate_per_s"] is not None and r["censored"] is None],
                         schema={"label": pl.String, "knee_rate_per_s": pl.Float64})
    if frame is None:
        return page
    page.heading("SLO figures against the offered rate (mean over seeds, 95% band; dashed: SLO limit; "
                 "dotted: knee)")
    order = [r["label"] for r in records]  # the grid's order (replicas 1, 2, 10), not the labels' text order
    for slo in frame["slo"].unique(maintain_order=True).to_list():
        f = frame.filter(pl.col("slo") == slo).sort("config", "rate_per_s").rename({"label": "configuration"})
        limit = float(f["limit_ms"][0])
        # latencies from 10,000 ms up in s (the columns keep their _ms names: the axis title names the unit)
        unit, k = latency_unit([*f["value_ms"].to_list(), *f["ci95_high_ms"].to_list(), limit])
        f = clip_for_log(f.with_columns(pl.col("value_ms", "ci95_low_ms", "ci95_high_ms") * k), "value_ms", "ci95_low_ms")
        # probes spanning 100x and more (a configuration meeting the SLO at every rate doubles its
        # probe up to the bound): a log axis, or every knee is squeezed against 0
        rates = f["rate_per_s"].to_numpy()
        x_log = bool((rates > 0).all() and rates.max() > X_LOG_RATIO * rates.min())
        curves = band_chart(f, "rate_per_s", "value_ms", "ci95_low_ms", "ci95_high_ms", "configuration",
                            f"{slo} against request rate", "request rate (req/s" + (", log scale)" if x_log else ")"),
                            f"{slo} ({unit}, log scale)", y_log=True, color_sort=order, x_log=x_log)
        line = alt.Chart(pl.DataFrame({"limit_ms": [limit * k]})).mark_rule(color="black", strokeDash=[6, 4]).encode(
            y="limit_ms:Q")
        layers = [curves, line]
        if knees.height:
            layers.append(alt.Chart(knees.rename({"label": "configuration"})).mark_rule(strokeDash=[2, 2]).encode(
                x="knee_rate_per_s:Q", color=alt.Color("configuration:N", sort=order)))
        page.chart(alt.layer(*layers).resolve_scale(color="shared").properties(width="container", height=320))
    return page
