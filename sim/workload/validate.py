"""Column checks that name the file and line of the first bad value.

Why: users bring traces from many tools; a wrong value must stop the run with one line that
says where it is and what was expected, never a traceback and never a silent drop.
A numeric batch (``sources.numeric_batches``) is checked with numpy (its date-times converted
with pyarrow); a value that fails a check there raises ``NotNumeric``, and the general reader
reads the batch again to name the line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.errors import UserError
from sim.limits import MAX_TIME_S, MAX_TOKENS
from sim.workload.sources import Batch, NotNumeric, NumericColumns, arrow_compute, arrow_is_text, shown

if TYPE_CHECKING:
    import polars as pl

TIME_UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def _floats(batch: Batch, col: str) -> tuple[np.ndarray, pl.Series | None]:
    """The column as float64 (NaN where a value is missing or not a number) and, from the
    general reader, its raw values for an error message (None from the numeric reader)."""
    if isinstance(batch.frame, NumericColumns):
        x = batch.frame[col]
        # (a JSON Lines column is a pyarrow array: NaN where a value is missing)
        return (x if isinstance(x, np.ndarray) else x.to_numpy(zero_copy_only=False)), None
    import polars as pl

    raw = _raw(batch, col)
    x = raw.cast(pl.Float64, strict=False) if raw.dtype != pl.Float64 else raw
    return x.to_numpy(), raw


def truncated_ints(batch: Batch, col: str, path: Path, missing: int) -> np.ndarray:
    """An optional numeric column as int64: ``missing`` where a row has none, a fraction
    truncated toward zero (as polars' cast did); NaN, an infinity or a value beyond int64 is an
    error naming the line."""
    x, raw = _floats(batch, col)
    # (the numeric reader's NaN is a missing value: it gives up a batch with a NaN written out)
    null = np.isnan(x) if raw is None else raw.is_null().to_numpy()
    x = np.where(null, float(missing), x)
    ok = np.isfinite(x) & (np.abs(x) < 2.0 ** 63)
    _check(batch, path, col, ok, raw, "a number")
    return np.trunc(x).astype(np.int64)


def floats(batch: Batch, col: str) -> np.ndarray:
    """A column of numbers that is not checked (measured latencies) as float64, NaN where missing."""
    return _floats(batch, col)[0]


def _check(batch: Batch, path: Path, col: str, ok: np.ndarray, raw: pl.Series | None, expected: str) -> None:
    """Every value passed (``ok``); else the numeric reader gives up (``NotNumeric``: the general
    reader reads the batch again) and the general reader names the first bad value's line."""
    if ok.all():
        return
    if raw is None:
        raise NotNumeric(col)
    i = int(np.argmin(ok))
    value = raw[i]
    text = "missing" if value is None else shown(value if not isinstance(value, float) else _num(value))
    raise UserError(f"{batch.where(path, i)}: column {col} is {text}, expected {expected}")


def _num(v: float):
    return int(v) if v.is_integer() and abs(v) < 1e16 else v


def _raw(batch: Batch, col: str) -> pl.Series:
    """The column; text values without surrounding spaces (``4808, 10`` after a comma and space)."""
    import polars as pl

    s = batch.frame[col]
    return s.str.strip_chars() if s.dtype == pl.String else s


def tokens(batch: Batch, col: str, path: Path, minimum: int = 1) -> np.ndarray:
    """A whole-number token count column (``minimum`` to ``MAX_TOKENS``) as int64.

    The upper bound keeps a corrupted count (2^63 and above wraps to a negative int64) from
    becoming a request that silently fails."""
    x, raw = _floats(batch, col)
    ok = (x >= minimum) & (x <= MAX_TOKENS) & (x == np.floor(x))  # NaN and infinities fail
    _check(batch, path, col, ok, raw, f"a whole number from {minimum} to {MAX_TOKENS:,}")
    return x.astype(np.int64)


def seconds(batch: Batch, col: str, path: Path, unit: str = "s") -> np.ndarray:
    """A numeric time column (finite, 0 to ``MAX_TIME_S`` once in seconds) converted to seconds."""
    limit = MAX_TIME_S / TIME_UNITS_S[unit]
    x, raw = _floats(batch, col)
    ok = (x >= 0) & (x <= limit)  # NaN and infinities fail
    _check(batch, path, col, ok, raw, f"a time from 0 to {limit:.3g} {unit} (is the time unit right?)")
    return x * TIME_UNITS_S[unit]


def abort_times(batch: Batch, path: Path, arrival_s: np.ndarray, col: str = "abort_s") -> np.ndarray:
    """The optional abort-time column (when each request's client aborts it, on the arrival
    column's clock, in seconds): NaN where a row has none; a value before its row's arrival, or
    not a time, is an error naming the line."""
    x, raw = _floats(batch, col)
    if raw is None:
        null = np.isnan(x)
    else:  # (an empty CSV field: null, or '' where the column is read as text)
        import polars as pl

        null = (raw.is_null() | (raw == "")).fill_null(True).to_numpy() if raw.dtype == pl.String \
            else raw.is_null().to_numpy()
    ok = null | ((x >= arrival_s) & (x <= MAX_TIME_S))
    _check(batch, path, col, ok, raw, f"empty or a time in seconds from the row's arrival_s to {MAX_TIME_S:.3g}")
    return np.where(null, np.nan, x)


# The date-time text the numeric reader converts with pyarrow, once ASCII spaces are trimmed:
# the canonical form, where polars (the general reader) gives the same microsecond (the test:
# tests/test_trace_numeric.py). Anything else (one-digit fields, leap second 60, other offsets,
# a mix of zoned and naive rows) goes to the general reader, which also names a bad line.
_DATE_TIME = (r"[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[ T]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
              r"(\.[0-9]+)?")
_OFFSET = r"[+-]([01][0-9]|2[0-3]):[0-5][0-9]"


def _arrow_all(pc, mask) -> bool:
    """Whether every value of a pyarrow boolean array without nulls (``datetimes_s`` and
    ``text_equals`` hand over none) is true."""
    return bool(pc.call_function("all", [mask]).as_py())


def _arrow_datetimes_us(text) -> np.ndarray:
    """pyarrow text of the canonical form to epoch microseconds (int64), or ``NotNumeric``."""
    import pyarrow as pa

    pc = arrow_compute()
    s = pc.call_function("ascii_trim_whitespace", [text])

    def all_match(pattern: str) -> bool:
        return _arrow_all(pc, pc.call_function("match_substring_regex", [s], pc.MatchSubstringOptions(pattern)))

    if all_match(f"^{_DATE_TIME}$"):
        unit = pa.timestamp("us")
    elif all_match(f"^{_DATE_TIME}{_OFFSET}$"):
        unit = pa.timestamp("us", "UTC")
    else:
        raise NotNumeric("date-time")
    # microseconds, the further digits truncated as polars does
    s = pc.call_function("replace_substring_regex", [s], pc.ReplaceSubstringOptions(r"(\.[0-9]{6})[0-9]+", r"\1"))
    try:
        t = pc.call_function("cast", [s], pc.CastOptions.safe(unit))
    except pa.ArrowInvalid:  # a day its month does not have
        raise NotNumeric("date-time") from None
    return pc.call_function("cast", [t], pc.CastOptions.safe(pa.int64())).to_numpy()


def datetimes_s(batch: Batch, col: str, path: Path) -> np.ndarray:
    """Wall-clock text (``2023-11-16 18:15:46.6805900``, optionally ``+00:00``) to epoch seconds.

    NOTE: text without a time zone is taken as UTC; only differences between rows matter.
    """
    if isinstance(batch.frame, NumericColumns):
        text = batch.frame[col]
        # (a JSON Lines field may be missing, or a number where the arrival and a token count
        # are the same field: the general reader names the line)
        if text.null_count or not arrow_is_text(text.type):
            raise NotNumeric(col)
        return _arrow_datetimes_us(text).astype(np.float64) / 1e6
    import polars as pl

    raw = _raw(batch, col)
    s = raw.cast(pl.String).str.strip_chars().str.replace("T", " ", literal=True)
    naive = s.str.strptime(pl.Datetime("us"), "%Y-%m-%d %H:%M:%S%.f", strict=False).dt.epoch("us")
    zoned = s.str.strptime(pl.Datetime("us", "UTC"), "%Y-%m-%d %H:%M:%S%.f%:z", strict=False).dt.epoch("us")
    us = naive.fill_null(zoned)
    bad = us.is_null()
    if bad.any():
        i = int(bad.arg_max())
        raise UserError(f"{batch.where(path, i)}: column {col} is {shown(raw[i])}, expected a date-time like "
                        "2023-11-16 18:15:46.68 or 2024-05-10 00:00:00.009930+00:00")
    return us.to_numpy().astype(np.float64) / 1e6


def text_equals(batch: Batch, col: str, value: str) -> np.ndarray:
    """Rows whose text in ``col``, without surrounding spaces, is ``value`` (a numpy bool
    mask). The numeric reader's ASCII text is trimmed of ASCII spaces, which for ASCII text
    are all the spaces polars trims; other text goes to the general reader (``NotNumeric``)."""
    if isinstance(batch.frame, NumericColumns):
        pc = arrow_compute()
        text = batch.frame[col]
        if not _arrow_all(pc, pc.call_function("string_is_ascii", [text])):
            raise NotNumeric(col)
        trimmed = pc.call_function("ascii_trim_whitespace", [text])
        return np.asarray(pc.call_function("equal", [trimmed, value]).to_numpy(), dtype=bool)
    return (_raw(batch, col) == value).fill_null(False).to_numpy()


def present(batch: Batch, col: str, path: Path) -> None:
    """Every row has a value in ``col``."""
    if isinstance(batch.frame, NumericColumns):
        if batch.frame.null_count(col):
            raise NotNumeric(col)  # the general reader names the line
        return
    bad = batch.frame[col].is_null()
    if bad.any():
        i = int(bad.arg_max())
        raise UserError(f"{batch.where(path, i)}: field {col} is missing")
