"""The ``simsrv diagnose`` report: cause of the tail TTFT, evidence, and ranked fixes."""

from __future__ import annotations

import altair as alt
import numpy as np
import polars as pl
import yaml

from sim.reporting import charts
from sim.reporting.metrics_table import metrics_table
from sim.reporting.html import Page
from sim.reporting.rundata import RunData
from sim.reporting.units import NUMBER_CELLS_STYLE, fmt_latency_ms
from sim.metrics.keys import P50_TTFT, P99_TPOT, P99_TTFT

MAX_TAIL_MARKS = 200


def build_diagnose_page(d, run_dir) -> Page:
    """``d``: a ``sim.analysis.diagnose.Diagnosis``; ``run_dir``: where the baseline run was written."""
    page = Page(f"simsrv diagnose: {d.scenario.name}: {d.summary['model_id']} on {d.summary['simsrv_num_gpus']} x "
                f"{d.summary['simsrv_gpu']}")
    page.heading("Verdict")
    page.raw("<ul>" + "".join(f"<li>{_esc(s)}</li>" for s in d.verdict) + "</ul>")
    page.heading("Diagnosis")
    page.raw("<ul>" + "".join(f"<li>{_esc(s)}</li>" for s in d.sentences) + "</ul>")
    page.paragraph(f"Cause of the tail: {d.cause}.", cls="note")

    page.raw(NUMBER_CELLS_STYLE)
    page.heading("What would fix it")
    base = d.summary
    # latencies with their unit in each cell: ms, or s from 10,000 ms up (sim/reporting/units.py)
    slo = d.payload.get("slo", {})
    meets = (lambda c: [("yes" if c.meets.get(n) else "no") for n in slo])
    rows = [["as is", "-", base["simsrv_num_gpus"], "-", _ms(base[P50_TTFT]), _ms(base[P99_TTFT]), "-",
             _ms(base[P99_TPOT]), "-", f"{base['failed']:,}", *(["-"] * len(slo)), ""]]
    for c in d.candidates:
        rows.append([c.name, c.change, c.gpus, f"+{c.gpus_added}", _ms(c.p50_ttft_ms), _ms(c.p99_ttft_ms),
                     _ms(c.ttft_gain_ms), _ms(c.p99_tpot_ms), _ms(c.tpot_cost_ms, signed=True), f"{c.failed:,}",
                     *meets(c), c.note])
    good = d.candidates and (d.candidates[0].meets_slo or (d.candidates[0].ttft_gain_ms or 0) > 0)
    page.table(["candidate", "change", "GPUs", "GPUs added", "p50 TTFT", "p99 TTFT", "p99 TTFT gained",
                "p99 TPOT", "p99 TPOT cost", "failed", *(f"meets {n} <= {v:g}" for n, v in slo.items()), "note"],
               rows, {(1, 5)} if good else set())
    page.paragraph("Each candidate is a full simulation of every request of the trace with that one change (the "
                   "long-prompt pools: the deployment as is serves the other requests, a second pool of 1-3 more "
                   "replicas the longest 5% of prompts, and the figures pool both). Ranked as a planner would: "
                   "candidates that meet every SLO first, by fewest GPUs added, then p99 TTFT; then the rest by "
                   "p99 TTFT gained (gains under 2% of the p99 count as none), GPUs added shown.", cls="note")

    page.heading("Evidence")
    steps = d.result.steps
    span = float(steps["start_s"].max() or 0) + 1e-9 if steps.height else 0.0
    tf = charts.time_frame(steps, "queue", span)
    if tf.height:
        tail = np.sort(d.tail_arrivals_s)
        if len(tail) > MAX_TAIL_MARKS:
            tail = tail[np.linspace(0, len(tail) - 1, MAX_TAIL_MARKS).astype(int)]
        q = alt.Chart(tf).mark_line(interpolate="step-after").encode(
            x=alt.X("time_s:Q", title="simulated time (s)", scale=alt.Scale(nice=False)),
            y=alt.Y("waiting:Q", title="waiting requests"))
        rules = alt.Chart(pl.DataFrame({"arrival_s": tail})).mark_rule(color="#d62728", opacity=0.35).encode(
            x="arrival_s:Q")
        page.chart((q + rules).properties(width="container", height=220,
                                          title="Queue depth over time; red: arrivals of the slowest 1% (TTFT)"))
    done = d.result.requests.filter(pl.col("status") == "completed")
    p99 = np.percentile(done["ttft_s"].to_numpy(), 99)
    lengths = charts.cdf_frame({"all requests": done["input_tokens"].to_numpy().astype(float),
                                "slowest 1%": done.filter(pl.col("ttft_s") >= p99)["input_tokens"].to_numpy().astype(float)},
                               scale=1.0)
    page.chart(charts.cdf_chart(lengths, "Prompt lengths: slowest 1% vs all", "prompt tokens (log scale)"))
    dec = charts.decomposition_frame(d.result.requests, "as is")
    if dec.height:
        page.chart(charts.decomposition_chart(dec, "TTFT decomposition: near the median vs the slowest 1%"))
    if d.measured:
        page.heading("Simulated vs measured")
        page.table(["figure", "value"], [[k, _ms(v) if k.endswith("_ms") else _f(v)] for k, v in d.measured.items()])

    page.heading("Deployment and run")
    metrics_table(page, [RunData("as is", run_dir, base, d.result.requests, d.result.steps, {})])
    page.preformatted(yaml.safe_dump(d.scenario.model_dump(mode="json", exclude_none=True, exclude={"base_dir"}),
                                     sort_keys=False))
    return page


def _ms(v, signed: bool = False) -> str:
    """A latency in ms with its unit ("412.3 ms", "12.41 s"); ``signed``: "+" before a positive one."""
    if v is None:
        return "-"
    return ("+" if signed and v > 0 else "") + fmt_latency_ms(v)


def _f(v, signed: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+,.1f}" if signed else f"{v:,.1f}"


def _esc(s: str) -> str:
    import html

    return html.escape(s)
