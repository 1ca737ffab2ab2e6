"""An HTML page of a trace's figures, its rate over time and its prompt- and output-length
distributions (altair, offline: sim/reporting/html.py); and the text lines ``trace inspect``
prints about bursts and a timestamp grid."""

from __future__ import annotations

from pathlib import Path

LABELS = {
    "file": "file", "num_requests": "requests", "span_s": "span (s)", "mean_rate_per_s": "mean rate (req/s)",
    "interarrival_cv": "inter-arrival CV (1 = Poisson)", "rows_moved_by_sorting": "rows out of time order",
    "peak_minute_rate_per_s": "busiest minute (req/s)", "total_input_tokens": "prompt tokens, total",
    "total_output_tokens": "output tokens, total", "notes": "notes",
    "mean_input_tokens": "prompt tokens, mean", "p50_input_tokens": "prompt tokens, p50",
    "p90_input_tokens": "prompt tokens, p90", "p99_input_tokens": "prompt tokens, p99",
    "max_input_tokens": "prompt tokens, max", "mean_output_tokens": "output tokens, mean",
    "p50_output_tokens": "output tokens, p50", "p90_output_tokens": "output tokens, p90",
    "p99_output_tokens": "output tokens, p99", "max_output_tokens": "output tokens, max",
    "hash_block_size": "tokens per prefix hash block", "num_prefix_blocks": "prefix blocks, total",
    "num_distinct_blocks": "prefix blocks, distinct",
    "prefix_block_reuse_ratio": "prefix blocks seen before (an unbounded cache's hit rate)",
    "peak_1s_rate_per_s": "busiest 1 s (req/s)", "peak_1s_over_mean": "busiest 1 s / mean rate",
    "peak_10s_rate_per_s": "busiest 10 s (req/s)", "peak_10s_over_mean": "busiest 10 s / mean rate",
    "zero_gap_fraction": "gaps of 0 (requests at the same instant)",
    "timestamp_grid_s": "timestamp grid step (s)",
}
CHARTS = ("rate_per_minute", "input_tokens_histogram", "output_tokens_histogram")
HISTOGRAMS = (("input_tokens_histogram", "prompt"), ("output_tokens_histogram", "output"))


def shape_lines(stats: dict) -> list[str]:
    """Bursts and the timestamp grid in words, for the terminal and the page."""
    lines = []
    mean = stats["mean_rate_per_s"]
    peaks = [f"{w} s {_fmt(stats[f'peak_{w}s_rate_per_s'])} req/s"
             + (f" ({stats[f'peak_{w}s_over_mean']:.1f}x)" if stats.get(f"peak_{w}s_over_mean") is not None else "")
             for w in (1, 10)]
    lines.append(f"bursts: busiest {', busiest '.join(peaks)}, against a mean of {_fmt(mean)} req/s")
    grid = stats.get("timestamp_grid_s")
    zero = stats.get("zero_gap_fraction", 0.0)
    if grid is not None:
        lines.append(f"timestamp grid: arrivals are rounded to a {grid:g} s grid ({zero:.1%} of gaps are 0): replayed "
                     f"as they are, each grid step's requests arrive at once; workload.trace.spread_grid_s: {grid:g} "
                     f"(trace convert --spread-grid {grid:g}) spreads them over the step")
    else:
        lines.append(f"timestamp grid: none ({zero:.1%} of gaps are 0)")
    return lines


def write_trace_html(stats: dict, path: str | Path) -> None:
    import altair as alt

    from sim.reporting.html import Page

    name = Path(stats["file"]).name
    page = Page(f"trace {name}")
    span_min = max(stats["span_s"] / 60.0, 1e-9)
    rates = stats["rate_per_minute"]
    values = [{"from_min": float(i), "to_min": min(i + 1.0, span_min) if i == len(rates) - 1 else i + 1.0,
               "rate_per_s": r} for i, r in enumerate(rates)]
    page.chart(alt.Chart(alt.Data(values=values)).mark_bar(stroke="white", strokeWidth=0.3).encode(
        # the axis starts at the first request and ends at the last: no empty minutes before the trace
        x=alt.X("from_min:Q", title="minutes from the first request",
                scale=alt.Scale(domain=[0, span_min], nice=False, zero=False)),
        x2="to_min:Q",
        y=alt.Y("rate_per_s:Q", title="requests / s (mean over the minute)", scale=alt.Scale(zero=True)),
        y2=alt.datum(0),
        tooltip=[alt.Tooltip("from_min:Q", title="minute"), alt.Tooltip("rate_per_s:Q", format=",.2f")],
    ).properties(width="container", height=240, title=f"{name}: arrival rate per minute"))
    for key, what in HISTOGRAMS:
        hist = [{"bin": _tokens(h["from_tokens"]) + "-" + _tokens(h["to_tokens"]), "order": i, "count": h["count"]}
                for i, h in enumerate(stats.get(key, []))]
        if hist:
            page.chart(alt.Chart(alt.Data(values=hist)).mark_bar().encode(
                x=alt.X("bin:O", title=f"{what} tokens (power-of-two bins)", sort=alt.SortField("order"),
                        axis=alt.Axis(labelAngle=0)),
                y=alt.Y("count:Q", title="requests"),
                tooltip=["bin:O", alt.Tooltip("count:Q", format=",")],
            ).properties(width="container", height=220, title=f"{name}: {what}-length distribution"))
    for line in shape_lines(stats):
        page.paragraph(line[0].upper() + line[1:] + ".")
    page.paragraph(f"File: {stats['file']}." + (f" Notes: {'; '.join(stats['notes'])}." if stats.get("notes") else ""))
    page.table(["figure", "value"], [[LABELS.get(k, k), "-" if v is None else _fmt(v)] for k, v in stats.items()
                                     if k not in (*CHARTS, "file", "notes")])
    page.write(path)


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 else str(n)


def _fmt(v) -> str:
    """Plain numbers: thousands separated, never in scientific notation."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return str(v)
        if v == int(v) and abs(v) >= 1:
            return f"{v:,.0f}"
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:,.2f}" if abs(v) >= 1 else f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, list):
        return "; ".join(map(str, v)) or "-"
    return str(v)
