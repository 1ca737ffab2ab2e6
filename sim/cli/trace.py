"""``simsrv trace inspect|convert`` (ARCHITECTURE.md section 4): look into a trace, normalise and rescale it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from sim.cli.consoles import LazyConsole
from sim.cli.outputs import check_output
from sim.cli.trace_warnings import show_trace_warning as _show_trace_warning  # noqa: F401 - tests' in-process CLI
from sim.errors import UserError
from sim.files.text import shown
from sim.workload.formats import TIME_UNITS, format_choices, source_time_unit

trace_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Inspect a request trace, or convert it to simsrv's normalised Parquet.")
_out = LazyConsole()


def _options(fmt: str, hash_block_size, model_filter, keep_failed, time_unit, arrival_col, input_col, output_col,
             spread_grid_s, seed, max_tokens_col=None):
    from sim.workload.readers import ReadOptions

    if fmt not in format_choices():
        raise UserError(f"--format {fmt}: one of {', '.join(format_choices())}")
    if time_unit not in TIME_UNITS:
        raise UserError(f"--time-unit {time_unit}: one of {', '.join(TIME_UNITS)}")
    return ReadOptions(format=fmt, hash_block_size=hash_block_size, model_filter=model_filter,
                       keep_failed=keep_failed, time_unit=time_unit, arrival_column=arrival_col,
                       input_column=input_col, output_column=output_col, max_tokens_column=max_tokens_col,
                       spread_grid_s=spread_grid_s, seed=seed)


FORMAT_HELP = " | ".join(format_choices())
TIME_UNIT_HELP = "generic: " + " | ".join(TIME_UNITS) + "."


@trace_app.command()
def inspect(
    file: Path = typer.Argument(..., help="Trace file."),
    fmt: str = typer.Option("auto", "--format", help=FORMAT_HELP),
    hash_block_size: Optional[int] = typer.Option(None, "--hash-block-size", help="Tokens per hash id."),
    model_filter: Optional[str] = typer.Option(None, "--model", help="BurstGPT: keep this Model only."),
    keep_failed: bool = typer.Option(False, "--keep-failed", help="Count failed rows (0 output tokens) as 1-token."),
    time_unit: str = typer.Option("s", "--time-unit", help=TIME_UNIT_HELP),
    arrival_col: str = typer.Option("arrival_s", "--arrival-column"),
    input_col: str = typer.Option("input_tokens", "--input-column"),
    output_col: str = typer.Option("output_tokens", "--output-column"),
    max_tokens_col: Optional[str] = typer.Option(None, "--max-tokens-column",
                                                 help="generic: the max_tokens each request was sent with."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="Also write an HTML page with an altair chart."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
):
    """Count, span, rates over time, burstiness (busiest 1 s and 10 s against the mean), a timestamp
    grid, token percentiles and histograms, prefix reuse."""
    from sim.workload.inspect import sparkline, trace_stats

    opts = _options(fmt, hash_block_size, model_filter, keep_failed, time_unit, arrival_col, input_col, output_col,
                    None, 0, max_tokens_col)
    if html_out is not None:
        check_output(html_out, "--html", directory=False)
    stats = trace_stats(file, opts)
    if html_out is not None:
        from sim.reporting.trace_page import write_trace_html

        write_trace_html(stats, html_out)
    if as_json:
        print(json.dumps(stats, indent=2))
        return
    from rich.table import Table

    t = Table(title=shown(file))
    t.add_column("figure")
    t.add_column("value", justify="right")
    from sim.reporting.trace_page import CHARTS, HISTOGRAMS, _fmt, shape_lines
    from sim.workload.inspect import text_histogram

    for k, v in stats.items():
        if k in (*CHARTS, "file", "notes"):
            continue
        t.add_row(k, "-" if v is None else _fmt(v))
    _out.print(t)
    _out.print(f"rate per minute (peak {stats['peak_minute_rate_per_s']:.3g} req/s):")
    _out.print(sparkline(stats["rate_per_minute"]), markup=False, highlight=False)
    for line in shape_lines(stats):
        _out.print(line, markup=False, highlight=False)
    for key, what in HISTOGRAMS:
        _out.print(f"{what} tokens (power-of-two bins), requests:", markup=False, highlight=False)
        for line in text_histogram(stats[key]):
            _out.print(line, markup=False, highlight=False)
    if html_out is not None:
        _out.print(f"wrote {html_out}")


@trace_app.command()
def convert(
    file: Path = typer.Argument(..., help="Trace file."),
    out: Path = typer.Option(..., "-o", "--out", help="Output Parquet (normalised schema)."),
    fmt: str = typer.Option("auto", "--format", help=FORMAT_HELP),
    start_s: Optional[float] = typer.Option(None, "--start", help="Window start, seconds from the first request."),
    duration_s: Optional[float] = typer.Option(None, "--duration", help="Window length in seconds."),
    time_scale: Optional[float] = typer.Option(None, "--time-scale", help="Multiply every gap (2 = half the rate)."),
    target_rate: Optional[float] = typer.Option(None, "--target-rate", help="Scale the gaps to this mean req/s."),
    sample_n: Optional[int] = typer.Option(None, "--sample", help="Keep N requests drawn at random (seeded)."),
    seed: int = typer.Option(0, "--seed", help="Seed for --sample and --spread-grid."),
    spread_grid_s: Optional[float] = typer.Option(None, "--spread-grid",
                                                  help="Spread requests uniformly inside each grid bucket (s)."),
    hash_block_size: Optional[int] = typer.Option(None, "--hash-block-size", help="Tokens per hash id."),
    model_filter: Optional[str] = typer.Option(None, "--model", help="BurstGPT: keep this Model only."),
    keep_failed: bool = typer.Option(False, "--keep-failed", help="Replay failed rows with 1 output token."),
    time_unit: str = typer.Option("s", "--time-unit", help=TIME_UNIT_HELP),
    arrival_col: str = typer.Option("arrival_s", "--arrival-column"),
    input_col: str = typer.Option("input_tokens", "--input-column"),
    output_col: str = typer.Option("output_tokens", "--output-column"),
    max_tokens_col: Optional[str] = typer.Option(None, "--max-tokens-column",
                                                 help="generic: the max_tokens each request was sent with."),
):
    """Normalise a trace to Parquet, optionally cut, sampled and rescaled (gaps scaled, not redrawn)."""
    from sim.workload.normalized import write_normalized
    from sim.workload.trace import detect_format, read_trace
    from sim.workload.transform import apply

    if out.suffix != ".parquet":
        raise UserError(f"-o {out}: the output is Parquet; name it *.parquet")
    check_output(out, "-o", directory=False)
    opts = _options(fmt, hash_block_size, model_filter, keep_failed, time_unit, arrival_col, input_col, output_col,
                    spread_grid_s, seed, max_tokens_col)
    source_format = detect_format(file) if fmt == "auto" else fmt
    arr = read_trace(file, opts=opts)
    n_in = len(arr)
    arr = apply(arr, "trace convert", start_s, duration_s, sample_n, seed, time_scale, target_rate)
    meta = {
        "source_file": shown(file.name), "source_format": source_format,
        "source_time_unit": source_time_unit(source_format, time_unit),
        "time_unit": "s", "converted_by": "simsrv trace convert", "converted_at": time.strftime("%Y-%m-%d"),
        "num_requests_read": n_in, "start_s": start_s, "duration_s": duration_s, "time_scale": time_scale,
        "target_rate_per_s": target_rate, "sample": sample_n, "seed": seed, "spread_grid_s": spread_grid_s,
    }
    write_normalized(arr, out, {k: v for k, v in meta.items() if v is not None})
    _out.print(f"wrote {out}: {len(arr):,} requests over {arr.arrival_s[-1]:,.1f} s "
               f"({arr.mean_rate_per_s:,.3g} req/s)")
