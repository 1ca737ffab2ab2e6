"""The sweep report: latency and throughput against the offered rate (or against the grid's
numeric key when the rate is not swept), one curve per configuration, with the 95% confidence
band over seeds; the scenario's SLO limits as labelled lines; and the table of points.

Why: a sweep's question is how each configuration degrades as load grows; the band shows
whether two curves differ by more than the seed noise. Grid values are numbers and are ordered
as numbers (512 < 2048 < 8192, 1 < 2 < 10), never as text. Takes plain frames, not sweep objects.
"""

from __future__ import annotations

import math

import altair as alt
import polars as pl

from sim.reporting.html import Page
from sim.reporting.units import fmt_latency_ci_ms, latency_unit
from sim.metrics.keys import MEAN_TTFT, P99_E2EL, P99_TPOT, P99_TTFT

LOG_RATIO = 10.0
# (figure, title, unit: "latency" (ms, shown in s when large) or the unit's text, SLO key)
CURVES = (
    (P99_TTFT, "p99 TTFT", "latency", "ttft_ms"), (P99_TPOT, "p99 TPOT", "latency", "tpot_ms"),
    (P99_E2EL, "p99 E2E latency", "latency", "e2el_ms"), (MEAN_TTFT, "mean TTFT", "latency", "ttft_ms"),
    ("request_throughput", "throughput", "req/s", None),
    ("simsrv_utilization", "utilisation", "busy fraction", None),
)
X_FIELD = "x_value"          # the x column under a name without dots (Vega-Lite reads "a.b" as a nested field)
# a figure and its interval on one line, the table within the page
TABLE_STYLE = "<style>td.num { white-space: nowrap; } table { font-size: 0.8em; }</style>"
NO_INTERVAL_NOTE = "One seed per point: no confidence intervals are shown; intervals need --seeds >= 2."


def _fmt(v, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}" if isinstance(v, float) else str(v)


def _ci(row: dict, m: str, digits: int = 1) -> str:
    if row.get(f"{m}_mean") is None:
        return "-"
    if (row.get("num_seeds") or 0) < 2:
        return _fmt(row[f"{m}_mean"], digits)
    return f"{_fmt(row[f'{m}_mean'], digits)} [{_fmt(row[f'{m}_ci95_low'], digits)}, " \
           f"{_fmt(row[f'{m}_ci95_high'], digits)}]"


def _latency_ci(row: dict, m: str) -> str:
    if (row.get("num_seeds") or 0) < 2:
        return fmt_latency_ci_ms(row.get(f"{m}_mean"))
    return fmt_latency_ci_ms(row.get(f"{m}_mean"), row.get(f"{m}_ci95_low"), row.get(f"{m}_ci95_high"))


def value_text(v) -> str:
    """A grid value as a label: 5.0 -> "5", 0.25 -> "0.25", text as it is."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return "-" if v is None else str(v)


def short_key(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _numeric(agg: pl.DataFrame, key: str) -> bool:
    return key in agg.columns and agg[key].dtype.is_numeric()


def choose_x(agg: pl.DataFrame, grid_keys: list[str], rate_key: str | None) -> tuple[str | None, str | None, str]:
    """The x axis as (grid key, column, title): the measured request rate when the grid sweeps
    the rate, else the first numeric grid key with more than one value, else (None, None,
    "point"): one mark per point, in grid order."""
    if rate_key and "request_rate_mean" in agg.columns and agg["request_rate_mean"].null_count() < agg.height:
        return rate_key, "request_rate_mean", "request rate (req/s)"
    for k in grid_keys:
        if _numeric(agg, k) and agg[k].n_unique() > 1:
            return k, k, short_key(k)
    return None, None, "point"


def _first_seen(values: pl.Series) -> dict[str, int]:
    order: dict[str, int] = {}
    for v in values.cast(pl.String).to_list():
        if v is not None and v not in order:
            order[v] = len(order)
    return order


def with_configuration(agg: pl.DataFrame, grid_keys: list[str], x_key: str | None) -> pl.DataFrame:
    """``configuration``: the grid values other than the x key's, as "key=value, ..." ("all"
    when none), and ``order``: each row's rank with the rows sorted by their grid values
    (numbers as numbers, in the grid file's key order); the frame comes back in that order."""
    others = [k for k in grid_keys if k != x_key and k in agg.columns]
    labels = [", ".join(f"{short_key(k)}={value_text(r[k])}" for k in others) or "all"
              for r in agg.iter_rows(named=True)]
    keys = [k for k in grid_keys if k in agg.columns]
    # numbers sort as numbers; other values (policies, JSON text) keep the grid file's order
    ranks = [pl.col(k) if _numeric(agg, k) else
             pl.col(k).cast(pl.String).replace_strict(_first_seen(agg[k]), return_dtype=pl.Int64, default=None)
             for k in keys]
    indexed = agg.with_row_index("_i").with_columns(*(r.alias(f"_rank{j}") for j, r in enumerate(ranks)))
    sorted_i = indexed.sort([*(f"_rank{j}" for j in range(len(keys))), "_i"], nulls_last=True)["_i"].to_list()
    rank = [0] * agg.height
    for pos, i in enumerate(sorted_i):
        rank[i] = pos
    return agg.with_columns(pl.Series("configuration", labels, dtype=pl.String),
                            pl.Series("order", rank, dtype=pl.Int64)).sort("order")


def band_chart(frame: pl.DataFrame, x: str, y: str, lo: str, hi: str, color: str, title: str, x_title: str,
               y_title: str, x_nominal: bool = False, y_log: bool = False, x_sort: list | None = None,
               color_sort: list | None = None, bands: bool = True, x_log: bool = False) -> alt.LayerChart:
    """Mean as a line with points, its 95% interval as a translucent band (``bands``), one
    colour per ``color``. ``x_sort``: the x values in order, for an ordinal x (numbers kept in
    numeric order); ``x_nominal``: one error bar per x value, in ``x_sort`` order; ``x_log``: a
    quantitative x on a log scale."""
    if x_nominal or x_sort is not None:
        kind = "N" if x_nominal else "O"
        xe = alt.X(f"{x}:{kind}", title=x_title, sort=x_sort,
                   axis=alt.Axis(labelAngle=-30 if x_nominal else 0, labelLimit=260, labelOverlap=True))
    else:
        xe = alt.X(f"{x}:Q", title=x_title, axis=alt.Axis(), scale=alt.Scale(type="log") if x_log else alt.Undefined)
    base = alt.Chart(frame, title=title)
    col = alt.Color(f"{color}:N", title="configuration", sort=color_sort, legend=alt.Legend(labelLimit=400))
    tip = [alt.Tooltip(f"{color}:N"), alt.Tooltip(f"{x}:{'Q' if x_sort is None and not x_nominal else 'N'}"),
           alt.Tooltip(f"{y}:Q", format=",.2f")]
    if bands:
        tip += [alt.Tooltip(f"{lo}:Q", format=",.2f"), alt.Tooltip(f"{hi}:Q", format=",.2f")]
    scale = alt.Scale(type="log") if y_log else alt.Scale(zero=False)
    if x_nominal:
        points = base.mark_point(filled=True).encode(xe, alt.Y(f"{y}:Q", title=y_title, scale=scale), col, tooltip=tip)
        if not bands:
            return alt.layer(points)
        bars = base.mark_errorbar().encode(xe, alt.Y(f"{lo}:Q", title=y_title, scale=scale), alt.Y2(hi), col)
        return alt.layer(bars, points)
    line = base.mark_line(point=True).encode(xe, alt.Y(f"{y}:Q", title=y_title, scale=scale), col, tooltip=tip)
    if not bands:
        return alt.layer(line)
    band = base.mark_area(opacity=0.2).encode(xe, alt.Y(f"{lo}:Q", title=y_title, scale=scale), alt.Y2(hi), col)
    return alt.layer(band, line)


def slo_rule(limit: float, text: str) -> alt.LayerChart:
    """A dashed red horizontal line at ``limit``, labelled ``text`` just above it at the left edge."""
    data = pl.DataFrame({"limit": [limit], "text": [text]})
    rule = alt.Chart(data).mark_rule(color="black", strokeDash=[6, 4]).encode(y=alt.Y("limit:Q"))
    label = alt.Chart(data).mark_text(align="left", baseline="bottom", dx=4, dy=-3, color="black", fontWeight="bold").encode(
        x=alt.value(0), y=alt.Y("limit:Q"), text="text:N")
    return alt.layer(rule, label)


def _curve_frame(agg: pl.DataFrame, m: str, x: str, bands: bool) -> pl.DataFrame:
    cols = ["configuration", "order", "num_seeds", f"{m}_mean", f"{m}_ci95_low", f"{m}_ci95_high", x]
    frame = agg.select(list(dict.fromkeys(cols))).drop_nulls(f"{m}_mean")
    if bands:  # a point with one seed has no interval: its band is left out, not drawn with width 0
        one = pl.col("num_seeds") < 2
        frame = frame.with_columns(pl.when(one).then(None).otherwise(pl.col(f"{m}_ci95_low")).alias(f"{m}_ci95_low"),
                                   pl.when(one).then(None).otherwise(pl.col(f"{m}_ci95_high")).alias(f"{m}_ci95_high"))
    return frame


def clip_for_log(frame: pl.DataFrame, y: str, lo: str) -> pl.DataFrame:
    """A band reaching 0 (or below) on a log axis is cut at half the smallest positive ``y``:
    a zero would break the whole scale (the chart came out blank)."""
    vals = frame[y].to_numpy()
    positive = vals[vals > 0]
    return frame.with_columns(pl.col(lo).clip(lower_bound=float(positive.min()) / 2)) if len(positive) else frame


def _log_axis(frame: pl.DataFrame, m: str) -> tuple[bool, pl.DataFrame]:
    """Curves spanning more than LOG_RATIO (a saturated configuration next to a healthy one) go
    on a log axis."""
    vals = frame[f"{m}_mean"].to_numpy()
    if not ((vals > 0).all() and vals.max() > LOG_RATIO * vals.min()):
        return False, frame
    return True, clip_for_log(frame, f"{m}_mean", f"{m}_ci95_low")


def sweep_page(agg: pl.DataFrame, grid_keys: list[str], rate_key: str | None, title: str, notes: list[str],
               slo: dict[str, float] | None = None) -> Page:
    """``agg``: one row per point with ``label``, ``num_seeds``, the grid keys' values (one
    column per dotted key) and ``{figure}_mean/_ci95_low/_ci95_high``; ``grid_keys``: the keys the
    grid varies, in the file's order; ``rate_key``: the one that sets the offered load, if swept;
    ``slo``: the scenario's limits (``ttft_ms``, ``tpot_ms``, ``e2el_ms``) drawn on their charts."""
    page = Page(title)
    page.raw(TABLE_STYLE)
    bands = agg.height > 0 and int(agg["num_seeds"].max() or 0) >= 2
    for n in notes:
        page.paragraph(n, "note")
    if not bands:
        page.paragraph(NO_INTERVAL_NOTE, "note")
    x_key, x_col, x_title = choose_x(agg, grid_keys, rate_key)
    agg = with_configuration(agg, grid_keys, x_key)
    frame_all = agg.with_columns((pl.col(x_col) if x_col else pl.col("label")).alias(X_FIELD))
    x_nominal = x_col is None
    x_sort = None
    if x_nominal:
        x_sort = frame_all.sort("order")["label"].to_list()
    elif x_col != "request_rate_mean":
        x_sort = sorted(frame_all[X_FIELD].drop_nulls().unique().to_list())
    color_sort = list(dict.fromkeys(frame_all.sort("order")["configuration"].to_list()))
    page.heading("Curves (mean over seeds, 95% confidence band)" if bands else "Curves (one seed per point)")
    for m, label, unit, slo_key in CURVES:
        if f"{m}_mean" not in agg.columns or agg[f"{m}_mean"].null_count() == agg.height:
            continue
        frame = _curve_frame(frame_all, m, X_FIELD, bands).sort("order" if x_sort is not None else X_FIELD)
        limit = (slo or {}).get(slo_key) if slo_key else None
        if unit == "latency":
            unit, k = latency_unit([*frame[f"{m}_mean"].to_list(), *frame[f"{m}_ci95_high"].to_list(), limit])
            frame = frame.with_columns(pl.col(f"{m}_mean", f"{m}_ci95_low", f"{m}_ci95_high") * k)
            limit = limit * k if limit is not None else None
        y_log, frame = _log_axis(frame, m)
        y_title = f"{label} ({unit}{', log scale' if y_log else ''})"
        chart = band_chart(frame, X_FIELD, f"{m}_mean", f"{m}_ci95_low", f"{m}_ci95_high", "configuration",
                           f"{label} ({unit})", x_title, y_title, x_nominal=x_nominal, y_log=y_log, x_sort=x_sort,
                           color_sort=color_sort, bands=bands)
        if limit is not None:
            chart = alt.layer(chart, slo_rule(limit, f"SLO {slo_key.removesuffix('_ms')} <= {limit:,.6g} {unit} "
                                                     "(per request)"))
        page.chart(chart.properties(width="container", height=300, title=f"{label} ({unit})"))
    if slo and any(v is not None for v in slo.values()):
        page.paragraph("Dashed black lines: the scenario's SLO limits, which each request must meet to count "
                       "towards goodput (the p99 line crossing it means more than 1% of requests miss it).", "note")
    seeds = int(agg["num_seeds"].max() or 0) if agg.height else 0
    page.heading(f"Points (mean [95% CI] over {seeds} seeds)" if bands else "Points (one seed each)")
    page.table(*points_table(agg, grid_keys, goodput=bool(slo and any(v is not None for v in slo.values()))))
    return page


def points_table(agg: pl.DataFrame, grid_keys: list[str], goodput: bool = False) -> tuple[list[str], list[list]]:
    """One row per point, in ``agg``'s order: its grid values (its label when the grid varies
    no column), then the key figures with their intervals (latencies in ms, or in s from
    10,000 ms up: each cell names its unit); ``goodput`` with an SLO. The seeds column only when
    points differ in their number of good seeds (errors); utilisation as a mean (its interval
    near 1 says little and the table must fit the page)."""
    keys = [k for k in grid_keys if k in agg.columns]
    seeds = agg.height > 0 and agg["num_seeds"].n_unique() > 1
    figures = [*(["seeds"] if seeds else []), "p99 TTFT", "p99 TPOT", "p99 E2E", "req/s",
               *(["goodput req/s"] if goodput else []), "utilisation", "errors"]
    header = [*(short_key(k) for k in keys)] if keys else ["point"]
    rows = []
    for r in agg.iter_rows(named=True):
        point = [value_text(r[k]) for k in keys] if keys else [r["label"]]
        rows.append([*point, *([r["num_seeds"]] if seeds else []), _latency_ci(r, P99_TTFT),
                     _latency_ci(r, P99_TPOT), _latency_ci(r, P99_E2EL), _ci(r, "request_throughput", 2),
                     *([_ci(r, "request_goodput", 2)] if goodput else []), _fmt(r.get("simsrv_utilization_mean"), 3),
                     r["num_errors"]])
    return header + figures, rows
