"""The validation page: measured vs simulated per published case, and the error per level."""

from __future__ import annotations

import html

import altair as alt
import polars as pl
import yaml

from sim.reporting.html import Page
from sim.analysis.validate import Row, fmt_value, not_reproduced, summarize_rows


def _pct(v) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def rows_table(rows: list[Row]) -> tuple[list[str], list[list]]:
    header = ["row", "level", "role", "metric", "measured", "simulated", "err", "tolerance", "within"]
    body = []
    for r in rows:
        if r.simulated is None:
            continue
        if r.level == "ordering":
            meas, sim = "ranked", ("same ranking" if r.simulated == 1.0 else "WRONG ranking")
        else:
            meas, sim = fmt_value(r.measured), fmt_value(r.simulated)
        body.append([r.id, r.level, r.role, r.metric, meas, sim, _pct(r.err) if r.level != "ordering" else "-",
                     f"±{r.tolerance:.0%}" if r.level != "ordering" and r.measured is not None else "-",
                     "-" if r.within is None else ("yes" if r.within else "NO")])
    return header, body


def summary_lines(rows: list[Row]) -> list[str]:
    s = summarize_rows(rows)
    out = []
    for lvl, target in (("step", "median <= 10%, p90 <= 25%"), ("request", "median <= 15%")):
        st = s[lvl]
        n = sum(1 for r in rows if r.level == lvl and r.err is not None)
        if st["median_abs_err"] is None:
            out.append(f"{lvl}: no rows run")
        else:
            out.append(f"{lvl} ({n} rows): median |err| {st['median_abs_err']:.1%}, p90 |err| {st['p90_abs_err']:.1%}"
                       f" (target {target})")
    o = s["ordering"]
    out.append(f"ordering: {o['correct']} of {o['total']} right (target: all)")
    for g, gs in s["by_generation"].items():
        out.append(f"{g} engines: " + "; ".join(_generation_parts(rows, g, gs)))
    return out


def _generation_parts(rows: list[Row], generation: str, gs: dict) -> list[str]:
    """One generation's figures per level (``summarize_rows``' ``by_generation`` entry)."""
    parts = []
    for lvl in ("step", "request"):
        n = sum(1 for r in rows if r.generation == generation and r.level == lvl and r.err is not None)
        st = gs[lvl]
        parts.append(f"{lvl} no rows run" if st["median_abs_err"] is None else
                     f"{lvl} ({n} rows) median |err| {st['median_abs_err']:.1%}, p90 {st['p90_abs_err']:.1%}")
    o = gs["ordering"]
    parts.append(f"ordering {o['correct']} of {o['total']} right")
    return parts


def build_validate_page(rows: list[Row]) -> Page:
    page = Page("simsrv validation against published measurements")
    page.paragraph("err = simulated / measured - 1. Every row is held out unless marked calibration; the engine "
                   "profiles' free terms were fitted on the measured CPU profile (vidur), not on these rows.",
                   cls="note")
    page.heading("Summary per level")
    for line in summary_lines(rows):
        page.paragraph(line)
    header, body = rows_table(rows)
    page.heading("Cases")
    page.table(header, body, best={(i, 8) for i, b in enumerate(body) if b[8] == "yes"})
    pts = [{"row": r.id, "level": r.level, "measured": r.measured, "simulated": r.simulated}
           for r in rows if r.simulated is not None and r.level != "ordering" and r.measured]
    if pts:
        df = pl.DataFrame(pts)
        lo, hi = float(min(df["measured"].min(), df["simulated"].min())), float(max(df["measured"].max(), df["simulated"].max()))
        diag = alt.Chart(pl.DataFrame({"x": [lo, hi], "y": [lo, hi]})).mark_line(color="#999").encode(x="x", y="y")
        dots = alt.Chart(df).mark_point(filled=True).encode(
            x=alt.X("measured", scale=alt.Scale(type="log"), title="measured"),
            y=alt.Y("simulated", scale=alt.Scale(type="log"), title="simulated"),
            color="level", tooltip=["row", "measured", "simulated"])
        page.chart((diag + dots).properties(width=520, height=420, title="simulated vs measured (log-log)"))
    page.heading("Scenarios")
    page.paragraph("The scenario each row ran (the case's base merged with the row's keys); paths are relative "
                   "to validation/.", cls="note")
    for r in rows:
        if r.scenario is not None and r.simulated is not None:
            text = yaml.safe_dump(r.scenario, sort_keys=False)
            page.raw(f"<details><summary>{html.escape(r.id)}</summary><pre>{html.escape(text)}</pre></details>")
        elif r.allreduce is not None:
            page.raw(f"<details><summary>{html.escape(r.id)}</summary><pre>one all-reduce: "
                     f"{html.escape(str(r.allreduce))}</pre></details>")
    skipped = not_reproduced(rows)
    if skipped:
        page.heading("Not reproduced")
        page.table(["row", "measured", "why"], [[r.id, fmt_value(r.measured) if r.level != "ordering" else "-",
                                                 r.reason] for r in skipped])
    return page
