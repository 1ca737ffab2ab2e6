"""An HTML page of a trace's figures and its rate over time (altair, offline: sim/reporting/html.py)."""

from __future__ import annotations

from pathlib import Path


def write_trace_html(stats: dict, path: str | Path) -> None:
    import altair as alt

    from sim.reporting.html import Page

    values = [{"minute": i, "rate_per_s": r} for i, r in enumerate(stats["rate_per_minute"])]
    page = Page(f"trace {Path(stats['file']).name}")
    page.chart(alt.Chart(alt.Data(values=values)).mark_bar().encode(
        x=alt.X("minute:Q", title="minute from the first request"),
        y=alt.Y("rate_per_s:Q", title="requests / s (mean over the minute)"),
    ).properties(width=720, height=240, title=f"{Path(stats['file']).name}: arrival rate per minute"))
    page.table(["figure", "value"], [[k, _fmt(v)] for k, v in stats.items() if k != "rate_per_minute"])
    page.write(path)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, list):
        return "; ".join(map(str, v))
    return str(v)
