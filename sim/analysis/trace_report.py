"""An HTML page of a trace's figures, its rate over time and its prompt-length distribution
(altair, offline: sim/reporting/html.py)."""

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
}
CHARTS = ("rate_per_minute", "input_tokens_histogram")


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
    hist = [{"bin": _tokens(h["from_tokens"]) + "-" + _tokens(h["to_tokens"]), "order": i, "count": h["count"]}
            for i, h in enumerate(stats.get("input_tokens_histogram", []))]
    if hist:
        page.chart(alt.Chart(alt.Data(values=hist)).mark_bar().encode(
            x=alt.X("bin:O", title="prompt tokens (power-of-two bins)", sort=alt.SortField("order"),
                    axis=alt.Axis(labelAngle=0)),
            y=alt.Y("count:Q", title="requests"),
            tooltip=["bin:O", alt.Tooltip("count:Q", format=",")],
        ).properties(width="container", height=220, title=f"{name}: prompt-length distribution"))
    page.paragraph(f"File: {stats['file']}." + (f" Notes: {'; '.join(stats['notes'])}." if stats.get("notes") else ""))
    page.table(["figure", "value"], [[LABELS.get(k, k), _fmt(v)] for k, v in stats.items()
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
