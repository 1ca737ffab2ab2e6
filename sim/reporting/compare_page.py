"""The policy comparison report: runs side by side (``simsrv compare`` / ``simsrv report``)."""

from __future__ import annotations

import html

import altair as alt
import polars as pl
import yaml

from sim.analysis.notes import area, notes_for, run_facts
from sim.metrics.run_warnings import uncertainty_notes
from sim.reporting import charts
from sim.reporting.html import Page
from sim.reporting.metrics_table import metrics_table
from sim.reporting.classes_table import classes_table
from sim.reporting.rundata import RunData, scenario_differences

def build_compare_page(runs: list[RunData], title: str) -> Page:
    page = Page(title)
    first = runs[0]
    same = {(r.summary.get("model_id"), r.summary.get("simsrv_gpu"), r.summary.get("num_prompts"),
             r.summary.get("simsrv_seed"), str(r.scenario.get("workload"))) for r in runs}
    if len(same) == 1:
        page.paragraph(f"{len(runs)} runs of the same workload ({first.summary.get('num_prompts'):,} requests, "
                       f"seed {first.summary.get('simsrv_seed')}) on {first.summary.get('model_id')}, "
                       f"{first.summary.get('simsrv_gpu')}.")
    else:
        page.paragraph(f"{len(runs)} runs that differ in workload or deployment: "
                       + "; ".join(f"{r.label}: {r.summary.get('model_id')} on {r.summary.get('simsrv_gpu')}, "
                                   f"{r.summary.get('num_prompts'):,} requests" for r in runs)
                       + ". Compare the figures with care.", cls="note")
    page.heading("Summary")
    metrics_table(page, runs)
    for r in runs:  # where a run's figures rest on costs outside the measured profiles (above 10%)
        for note in r.summary.get("simsrv_uncertainty") or uncertainty_notes(r.summary):
            page.paragraph(f"{r.label}: {note}.", cls="note")

    classes_table(page, runs)

    page.heading("Latency distributions")
    for col, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT")):
        frame, unit = charts.in_latency_unit(charts.cdf_frame({r.label: r.requests[col].to_numpy() for r in runs}))
        page.chart(charts.cdf_chart(frame, f"CDF of {name}", f"{name} ({unit}, log scale)"))

    page.heading("Over time")
    span = max(float(r.steps["start_s"].max() or 0) + 1e-9 for r in runs if r.steps.height) if any(
        r.steps.height for r in runs) else 0.0
    frames = [charts.time_frame(r.steps, r.label, span) for r in runs]
    frames = [f for f in frames if f.height]
    if frames:
        tf = pl.concat(frames)
        page.chart(charts.time_chart(tf, "waiting", "Queue depth (waiting requests)", "requests"))
        page.chart(charts.time_chart(tf, "running", "Running batch size", "sequences per step"))
        page.chart(charts.time_chart(tf, "kv_blocks", "KV blocks in use", "blocks"))
        tok = tf.unpivot(on=["prefill_tok_step", "decode_tok_step"], index=["time_s", "run"],
                         variable_name="kind", value_name="tokens").with_columns(
            pl.col("kind").replace({"prefill_tok_step": "prefill", "decode_tok_step": "decode"}))
        independent = charts.scales_differ(tf, ["prefill_tok_step", "decode_tok_step"])
        n = tok["run"].n_unique()
        chart = alt.Chart(tok).mark_line(interpolate="step-after").encode(
            x=alt.X("time_s:Q", title="simulated time (s)", scale=alt.Scale(nice=False)),
            y=alt.Y("tokens:Q", title=None),  # panels of 70 px: the title names the unit once
            color=alt.Color("kind:N", title="tokens")).properties(width=charts.PAGE_CHART_WIDTH,
                                                                  height=max(70, 240 // n)).facet(
            row=alt.Row("run:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left", labelLimit=200)),
            title="Prefill and decode tokens per engine step, one panel per run"
                  + (" (each with its own scale)" if independent else ""))
        page.chart(chart.resolve_scale(y="independent") if independent else chart)

    page.heading("Where TTFT goes")
    dec = [charts.decomposition_frame(r.requests, r.label) for r in runs]
    dec = [d for d in dec if d.height]
    if dec:
        page.chart(charts.decomposition_chart(pl.concat(dec), "TTFT decomposition: requests near the median vs "
                                                              "the slowest 1%"))
        page.paragraph("Parts add up exactly to each request's TTFT (requests.parquet columns ttft_*_s). With "
                       "disaggregation and first_token: decode (vLLM P/D, the default) the KV transfer and the "
                       "decode replica's first step are parts of TTFT; with first_token: prefill (DistServe) the "
                       "transfer follows the first token and shows in the second token's gap (column "
                       "kv_transfer_s).", cls="note")

    page.heading("Scenario")
    diffs = scenario_differences(runs)
    if diffs:
        page.table(["key", *(r.label for r in runs)], [[k, *map(str, v)] for k, v in diffs.items()])
    else:
        page.paragraph("The runs' resolved scenarios are identical.")
    page.preformatted(yaml.safe_dump(first.scenario, sort_keys=False))
    page.heading("Cost model")
    page.table(["run", "cost model"], [[r.label, str(r.summary.get("simsrv_cost_model", "-"))] for r in runs])
    page.heading("Modelling notes that apply")
    facts = [run_facts(r.scenario, r.requests["arrival_s"].to_numpy() if "arrival_s" in r.requests.columns else None)
             for r in runs]
    page.raw("<ul>" + "".join(f"<li><b>{html.escape(area(m))}</b>: {html.escape(n)}</li>" for m, n in
                              notes_for([r.policy for r in runs], facts)) + "</ul>")
    return page
