"""``simsrv calibrate`` and ``simsrv profile`` (registered in ``sim/cli/app.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from sim.cli.consoles import LazyConsole
from sim.errors import UserError

out_console = LazyConsole()


def _pct(v) -> str:
    return "-" if v is None else f"{v:.1f}%"


def calibrate(
    gpu: str = typer.Option(..., "--gpu", help="GPU catalogue key, e.g. h100-sxm."),
    profiles: Path = typer.Option(Path("kernels_profile"), "--profiles", help="Profile folder or .parquet file."),
    out: Optional[Path] = typer.Option(None, "--out", help="Calibration file (default: the one simsrv loads)."),
    as_json: bool = typer.Option(False, "--json", help="Print the error tables as JSON."),
):
    """Fit per-operator efficiencies from measured kernels; print held-out and cross-source errors."""
    import polars as pl

    from sim.cost.calibration import calibration_dir, pack_tables
    from sim.cost.fit import fit
    from sim.cost.validate import cross_source_attention, cross_source_gemm, heldout_table
    from sim.spec.hardware import get_gpu
    from sim.kernels.schema import read_profiles

    spec = get_gpu(gpu)
    df = read_profiles(profiles).filter(pl.col("gpu") == gpu)
    if df.is_empty():
        raise UserError(f"{profiles}: no measured rows for GPU {gpu!r}; it runs on roofline with default efficiencies")
    if df.filter(pl.col("op") == "overhead").is_empty():
        # Engine CPU overheads are measured on A100 only (vidur); they are host-side, so other
        # GPUs borrow them. NOTE: marked in the file's overhead "sources".
        other = read_profiles(profiles).filter(pl.col("op") == "overhead")
        df = pl.concat([df, other])
    held = heldout_table(df, spec)
    cross = cross_source_gemm(df, spec)
    attn = cross_source_attention(df, spec)
    table = fit(df, spec)
    path = out or calibration_dir() / f"{gpu}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    from sim.files.atomic import write_text

    write_text(path, json.dumps(pack_tables(table), separators=(",", ":")) + "\n")
    if as_json:
        print(json.dumps({"heldout": held, "cross_source_gemm": cross, "cross_source_attention": attn}, indent=2))
        return
    from rich.table import Table

    t = Table(title=f"{gpu}: held-out shapes (every fifth token count / context / size / batch)")
    for c in ("operator", "rows fitted", "rows held out", "median abs err", "p90 abs err", "held out beyond roofline"):
        t.add_column(c, justify="left" if c == "operator" else "right")
    for r in held:
        t.add_row(r["op"], f"{r['rows_fitted']:,}", f"{r['rows_held_out']:,}", _pct(r["median_pct"]), _pct(r["p90_pct"]),
                  f"{r['rows_beyond_roofline']:,}" if "rows_beyond_roofline" in r else "-")
    out_console.print(t)
    for title, rows in (("cross-source GEMM: aiconfigurator GEMM fit -> vidur per-layer linear ops", cross),
                        ("cross-source attention: primary-source fit -> other sources", attn)):
        if not rows:
            continue
        t = Table(title=title)
        corr = any("median_pct_corrected" in r for r in rows)
        cols = ["target", "rows", "median abs err", "p90 abs err", "median predicted/measured"]
        if corr:
            cols += [f"median / p90 x{rows[0]['compute_factor']:.2f} compute-bound"]
        for c in cols:
            t.add_column(c, justify="left" if c == "target" else "right")
        for r in rows:
            label = r["target"] if "op" not in r else f"{r['op']}: {r['target']}"
            ratio = "-" if r.get("median_ratio") is None else f"{r['median_ratio']:.2f}"
            extra = [f"{_pct(r['median_pct_corrected'])} / {_pct(r['p90_pct_corrected'])}"] if corr else []
            t.add_row(label, f"{r['rows']:,}", _pct(r["median_pct"]), _pct(r["p90_pct"]), ratio, *extra)
        out_console.print(t)
    out_console.print(f"wrote {path}")


def profile(
    out: Path = typer.Option(..., "--out", help="Folder to write, e.g. kernels_profile/mybox/."),
    gpu: str = typer.Option(..., "--gpu", help="Name for the rows; a catalogue key lets `simsrv calibrate --gpu` use them."),
    device: Optional[str] = typer.Option(None, "--device", help="torch device (default: cuda if present, else cpu)."),
    tiny: bool = typer.Option(False, "--tiny", help="A tiny grid (seconds on a CPU), for testing the pipeline."),
):
    """Measure the calibration's operator grid with PyTorch on this machine."""
    from sim.kernels.profile import TINY, Grid, profile as run_profile, write_profile

    df = run_profile(gpu, TINY if tiny else Grid(), device)
    path = write_profile(df, out)
    out_console.print(f"wrote {len(df):,} rows ({df['source'][0]}) to {path}")
