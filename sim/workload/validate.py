"""Column checks that name the file and line of the first bad value.

Why: users bring traces from many tools; a wrong value must stop the run with one line that
says where it is and what was expected, never a traceback and never a silent drop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from sim.errors import UserError
from sim.workload.sources import Batch

TIME_UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def _fail(batch: Batch, path: Path, bad: pl.Series, col: str, raw: pl.Series, expected: str):
    i = int(bad.arg_max())
    value = raw[i]
    shown = "missing" if value is None else repr(value if not isinstance(value, float) else _num(value))
    raise UserError(f"{batch.where(path, i)}: column {col} is {shown}, expected {expected}")


def _num(v: float):
    return int(v) if v.is_integer() else v


def _raw(batch: Batch, col: str) -> pl.Series:
    return batch.frame[col]


def tokens(batch: Batch, col: str, path: Path, minimum: int = 1) -> np.ndarray:
    """A whole-number token count column (>= ``minimum``) as int64."""
    raw = _raw(batch, col)
    x = raw.cast(pl.Float64, strict=False) if raw.dtype != pl.Float64 else raw
    bad = x.is_null() | ~x.is_finite().fill_null(False) | (x < minimum).fill_null(True) | (x != x.floor()).fill_null(True)
    if bad.any():
        _fail(batch, path, bad, col, raw, f"a whole number >= {minimum}")
    return x.to_numpy().astype(np.int64)


def seconds(batch: Batch, col: str, path: Path, unit: str = "s") -> np.ndarray:
    """A numeric time column (finite, >= 0) converted to seconds."""
    raw = _raw(batch, col)
    x = raw.cast(pl.Float64, strict=False) if raw.dtype != pl.Float64 else raw
    bad = x.is_null() | ~x.is_finite().fill_null(False) | (x < 0).fill_null(True)
    if bad.any():
        _fail(batch, path, bad, col, raw, f"a finite time >= 0 (in {unit})")
    return x.to_numpy() * TIME_UNITS_S[unit]


def datetimes_s(batch: Batch, col: str, path: Path) -> np.ndarray:
    """Wall-clock text (``2023-11-16 18:15:46.6805900``, optionally ``+00:00``) to epoch seconds.

    NOTE: text without a time zone is taken as UTC; only differences between rows matter.
    """
    raw = _raw(batch, col)
    s = raw.cast(pl.String).str.strip_chars().str.replace("T", " ", literal=True)
    naive = s.str.strptime(pl.Datetime("us"), "%Y-%m-%d %H:%M:%S%.f", strict=False).dt.epoch("us")
    zoned = s.str.strptime(pl.Datetime("us", "UTC"), "%Y-%m-%d %H:%M:%S%.f%:z", strict=False).dt.epoch("us")
    us = naive.fill_null(zoned)
    bad = us.is_null()
    if bad.any():
        i = int(bad.arg_max())
        raise UserError(f"{batch.where(path, i)}: column {col} is {raw[i]!r}, expected a date-time like "
                        "2023-11-16 18:15:46.68 or 2024-05-10 00:00:00.009930+00:00")
    return us.to_numpy().astype(np.float64) / 1e6


def present(batch: Batch, col: str, path: Path) -> None:
    """Every row has a value in ``col``."""
    bad = batch.frame[col].is_null()
    if bad.any():
        i = int(bad.arg_max())
        raise UserError(f"{batch.where(path, i)}: field {col} is missing")
