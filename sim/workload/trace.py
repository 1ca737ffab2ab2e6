"""Trace readers into the normalised schema (DESIGN.md section 6).

Why: users replay real traffic; every bad row is reported with its file and line, and nothing
is silently dropped. Formats: ``normalized`` (Parquet or CSV with ``arrival_s``,
``input_tokens``, ``output_tokens``), ``azure`` (Azure LLM inference 2023 CSV: ``TIMESTAMP``,
``ContextTokens``, ``GeneratedTokens``), ``vidur`` (``arrived_at``, ``num_prefill_tokens``,
``num_decode_tokens``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from sim.errors import UserError
from sim.workload.arrays import RequestArrays

# format -> (arrival column, input column, output column)
COLUMNS = {
    "normalized": ("arrival_s", "input_tokens", "output_tokens"),
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "vidur": ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
}


def _read_frame(path: Path) -> pl.DataFrame:
    if not path.exists():
        raise UserError(f"{path}: trace file not found")
    try:
        if path.suffix == ".parquet":
            return pl.read_parquet(path)
        return pl.read_csv(path, infer_schema=False)
    except pl.exceptions.NoDataError:
        raise UserError(f"{path}: the trace file is empty") from None
    except Exception as e:  # polars/pyarrow parse errors carry their own detail
        raise UserError(f"{path}: cannot read as {'Parquet' if path.suffix == '.parquet' else 'CSV'} ({str(e).splitlines()[0]})") from None


def detect_format(cols: list[str], path: Path) -> str:
    for fmt, (a, i, o) in COLUMNS.items():
        if {a, i, o} <= set(cols):
            return fmt
    raise UserError(
        f"{path}: unknown trace format: columns {cols}; expected one of "
        + "; ".join(f"{f}: {', '.join(c)}" for f, c in COLUMNS.items())
    )


def _line_of(path: Path, row: int) -> str:
    return f"row {row + 1}" if path.suffix == ".parquet" else f"line {row + 2}"


def _numeric(df: pl.DataFrame, col: str, path: Path, integer: bool) -> np.ndarray:
    s = df[col]
    casted = s.cast(pl.Float64, strict=False)
    bad = casted.is_null() | ~casted.is_finite()
    if integer:
        bad = bad | (casted < 1) | (casted != casted.floor())
    else:
        bad = bad | (casted < 0)
    if bad.any():
        row = int(bad.arg_max())
        what = "a whole number >= 1" if integer else "a finite number >= 0"
        raise UserError(f"{path}: {_line_of(path, row)}: column {col} is {s[row]!r}, expected {what}")
    return casted.to_numpy()


def _timestamps_s(df: pl.DataFrame, col: str, path: Path) -> np.ndarray:
    """Azure wall-clock text (7 fractional digits) to seconds since the first request."""
    s = df[col].cast(pl.String)
    parsed = s.str.strptime(pl.Datetime("us"), "%Y-%m-%d %H:%M:%S%.f", strict=False)
    bad = parsed.is_null()
    if bad.any():
        row = int(bad.arg_max())
        raise UserError(f"{path}: {_line_of(path, row)}: {col} {s[row]!r} is not a date-time like 2023-11-16 18:15:46.68")
    us = parsed.dt.epoch("us").to_numpy().astype(np.float64)
    return (us - us.min()) / 1e6


def read_trace(path: str | Path, fmt: str = "auto", time_scale: float = 1.0) -> RequestArrays:
    """Read a trace; arrivals are shifted to start at 0, sorted, and multiplied by ``time_scale``."""
    path = Path(path)
    df = _read_frame(path)
    if df.height == 0:
        raise UserError(f"{path}: the trace has no rows")
    fmt = detect_format(df.columns, path) if fmt == "auto" else fmt
    a, i, o = COLUMNS[fmt]
    missing = [c for c in (a, i, o) if c not in df.columns]
    if missing:
        raise UserError(f"{path}: format {fmt} needs column(s) {', '.join(missing)}; found {df.columns}")
    arrival = _timestamps_s(df, a, path) if fmt == "azure" else _numeric(df, a, path, integer=False)
    inp = _numeric(df, i, path, integer=True).astype(np.int64)
    out = _numeric(df, o, path, integer=True).astype(np.int64)
    order = np.argsort(arrival, kind="stable")
    arrival = (arrival[order] - arrival[order][0]) * time_scale
    return RequestArrays(arrival, inp[order], out[order])


def read_column(path: Path, column: str, where: str) -> np.ndarray:
    """One token-count column of a trace file (for ``dist: empirical``)."""
    df = _read_frame(Path(path))
    if column not in df.columns:
        raise UserError(f"{where}: {path} has no column {column!r}; columns: {df.columns}")
    return _numeric(df, column, Path(path), integer=True)


def write_normalized(arrays: RequestArrays, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write the normalised Parquet schema, with provenance in the file's key-value metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "request_id": np.arange(len(arrays), dtype=np.int64),
        "arrival_s": arrays.arrival_s.astype(np.float64),
        "input_tokens": arrays.input_tokens.astype(np.int64),
        "output_tokens": arrays.output_tokens.astype(np.int64),
    })
    table = table.replace_schema_metadata({k: str(v) for k, v in (metadata or {}).items()})
    pq.write_table(table, path, compression="zstd")
