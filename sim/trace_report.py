"""An HTML page of a trace's figures and its rate over time (altair). Reporting layer."""

from __future__ import annotations

import html
from pathlib import Path


def write_trace_html(stats: dict, path: str | Path) -> None:
    import altair as alt

    values = [{"minute": i, "rate_per_s": r} for i, r in enumerate(stats["rate_per_minute"])]
    chart = alt.Chart(alt.Data(values=values)).mark_bar().encode(
        x=alt.X("minute:Q", title="minute from the first request"),
        y=alt.Y("rate_per_s:Q", title="requests / s (mean over the minute)"),
    ).properties(width=720, height=240, title=f"{Path(stats['file']).name}: arrival rate per minute")
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(_fmt(v))}</td></tr>"
                   for k, v in stats.items() if k != "rate_per_minute")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>trace {html.escape(stats['file'])}</title>"
            "<script src='https://cdn.jsdelivr.net/npm/vega@5'></script>"
            "<script src='https://cdn.jsdelivr.net/npm/vega-lite@5'></script>"
            "<script src='https://cdn.jsdelivr.net/npm/vega-embed@6'></script></head><body>"
            f"<h1>{html.escape(stats['file'])}</h1><div id='rate'></div>"
            f"<script>vegaEmbed('#rate', {chart.to_json()});</script>"
            f"<table border='1' cellpadding='3'>{rows}</table></body></html>")
    Path(path).write_text(page)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, list):
        return "; ".join(map(str, v))
    return str(v)
