"""Files read in bounded batches, each row tagged with its line (or Parquet row) number.

Why: a 10-million-request trace must not be held as Python objects or strings all at once;
every later error names the file and the line it came from, so each batch carries the line
number of each of its rows.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from sim.errors import UserError

CHUNK_ROWS = 1_000_000
# format detection reads at most this much of the first line (a binary file may have no newline)
FIRST_LINE_BYTES = 64 << 10


def shown(value, max_chars: int = 40) -> str:
    """A value from a user's file as an error message shows it: ``repr`` (so control characters
    are escaped), cut to ``max_chars``; a file's bytes are never echoed at length."""
    text = repr(value)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def shown_columns(cols: list[str], max_cols: int = 12) -> str:
    """Column names for an error message: each shortened, at most ``max_cols`` of them."""
    names = ", ".join(shown(c, 30) for c in cols[:max_cols])
    more = f", ... ({len(cols) - max_cols} more)" if len(cols) > max_cols else ""
    return f"[{names}{more}]"


def looks_binary(path: Path) -> bool:
    """NUL bytes, or mostly bytes that are not UTF-8 text, in the first 4 KB."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if b"\x00" in head:
        return True
    text = head.decode("utf-8", errors="replace")
    return text.count("\ufffd") > max(8, len(text) // 20)


@dataclass
class Batch:
    """Raw columns of consecutive rows; ``lines[i]`` is the 1-based line (or row) of row i."""

    frame: pl.DataFrame
    lines: np.ndarray
    label: str  # "line" (text files) or "row" (Parquet)

    def where(self, path: Path, i: int) -> str:
        return f"{path}: {self.label} {int(self.lines[i])}"


def check_exists(path: Path) -> None:
    if not path.exists():
        raise UserError(f"{path}: trace file not found")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a trace file")
    if path.stat().st_size == 0:
        raise UserError(f"{path}: the trace file is empty")


def first_line(path: Path) -> str:
    """The first non-blank line (decoded leniently, at most 64 KB of it), for format detection."""
    return _first_line_at(path)[1]


def _first_line_at(path: Path) -> tuple[int, str]:
    """(number of blank lines before it, the first non-blank line)."""
    with open(path, "rb") as f:
        skipped = 0
        while True:
            raw = f.readline(FIRST_LINE_BYTES)
            if not raw:
                break
            if raw.strip():
                return skipped, raw.decode("utf-8", errors="replace").strip().lstrip("\ufeff")
            skipped += 1
    raise UserError(f"{path}: the trace file is empty")


def csv_header(path: Path) -> list[str]:
    """The header's column names, spaces around them and quotes removed (``TIMESTAMP, ContextTokens``
    is common in real files)."""
    return [c.strip().strip('"').strip() for c in first_line(path).split(",")]


def _csv_error(path: Path, e: Exception) -> UserError:
    """One line for a CSV that pyarrow cannot parse, with the first line whose number of
    fields differs from the header's (found by one pass over the file, on this error path only)."""
    import csv

    detail = str(e).splitlines()[0]
    try:
        with open(path, newline="", encoding="utf8", errors="replace") as f:
            rows = csv.reader(f)
            width = len(next(rows, []))
            for line, row in enumerate(rows, start=2):
                if row and len(row) != width:
                    return UserError(f"{path}: line {line}: {len(row)} fields, the header has {width} ({detail})")
    except (OSError, csv.Error):
        pass
    return UserError(f"{path}: cannot read as CSV ({detail})")


def csv_batches(path: Path, columns: list[str], chunk_rows: int = CHUNK_ROWS) -> Iterator[Batch]:
    """The named columns of a CSV file, as strings, ``chunk_rows`` rows at a time."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    skipped, _line = _first_line_at(path)
    header = csv_header(path)
    missing = [c for c in columns if c not in header]
    if missing:
        raise UserError(f"{path}: line {skipped + 1}: missing column(s) {', '.join(missing)}; the header has "
                        f"{shown_columns(header)}")
    if len(set(header)) < len(header):
        dup = sorted({c for c in header if header.count(c) > 1})
        raise UserError(f"{path}: line {skipped + 1}: column(s) {shown_columns(dup)} appear more than once in the header")
    # NOTE: every column is read as text and converted by us, so a bad value is reported with
    # its line; blank lines are kept (and rejected) so line numbers stay exact.
    try:
        reader = pacsv.open_csv(
            path,
            # our cleaned header names replace the file's (which may carry spaces or quotes)
            read_options=pacsv.ReadOptions(block_size=1 << 24, encoding="utf8", column_names=header,
                                           skip_rows=skipped + 1),
            parse_options=pacsv.ParseOptions(ignore_empty_lines=False, newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(
                include_columns=columns, column_types={c: pa.string() for c in columns},
                strings_can_be_null=False, quoted_strings_can_be_null=False),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        raise _csv_error(path, e) from None
    start = skipped + 2  # line of the first data row
    pending: list[pl.DataFrame] = []
    n_pending = 0
    while True:
        try:
            rb = reader.read_next_batch()
        except StopIteration:
            break
        except pa.ArrowInvalid as e:
            raise _csv_error(path, e) from None
        pending.append(pl.from_arrow(rb))
        n_pending += rb.num_rows
        if n_pending >= chunk_rows:
            frame = pl.concat(pending)
            yield Batch(frame, np.arange(start, start + frame.height), "line")
            start += frame.height
            pending, n_pending = [], 0
    if pending:
        frame = pl.concat(pending)
        yield Batch(frame, np.arange(start, start + frame.height), "line")


def parquet_columns(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).schema_arrow.names
    except Exception as e:
        raise UserError(f"{path}: cannot read as Parquet ({str(e).splitlines()[0]})") from None


def parquet_batches(path: Path, columns: list[str], chunk_rows: int = CHUNK_ROWS) -> Iterator[Batch]:
    import pyarrow.parquet as pq

    names = parquet_columns(path)
    missing = [c for c in columns if c not in names]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}; the file has {shown_columns(names)}")
    start = 1
    for rb in pq.ParquetFile(path).iter_batches(batch_size=chunk_rows, columns=columns):
        frame = pl.from_arrow(rb)
        yield Batch(frame, np.arange(start, start + frame.height), "row")
        start += frame.height


def jsonl_batches(path: Path, schema: dict[str, pl.DataType], chunk_rows: int = CHUNK_ROWS,
                  flatten=None) -> Iterator[Batch]:
    """JSON Lines, one object per line; only the ``schema`` fields are kept.

    A batch is parsed by polars; if that fails, line by line with ``json`` to name the bad line.
    ``flatten(obj) -> dict`` maps a nested record to flat fields (slow path only).
    """
    with open(path, "rb") as f:
        buf: list[bytes] = []
        lines: list[int] = []
        for no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue  # NOTE: blank lines in JSON Lines carry no record
            buf.append(raw if raw.endswith(b"\n") else raw + b"\n")
            lines.append(no)
            if len(buf) >= chunk_rows:
                yield _parse_jsonl(path, buf, np.array(lines), schema, flatten)
                buf, lines = [], []
        if buf:
            yield _parse_jsonl(path, buf, np.array(lines), schema, flatten)


def _parse_jsonl(path: Path, buf: list[bytes], lines: np.ndarray, schema, flatten) -> Batch:
    if flatten is None:
        try:
            frame = pl.read_ndjson(io.BytesIO(b"".join(buf)), schema=schema)
            if frame.height == len(buf):
                return Batch(frame, lines, "line")
        except Exception:
            pass
    cols: dict[str, list] = {k: [] for k in schema}
    for raw, no in zip(buf, lines.tolist()):
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: line {no}: not valid JSON ({e.msg if hasattr(e, 'msg') else e})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}: line {no}: expected a JSON object, got {type(obj).__name__}")
        if flatten is not None:
            obj = flatten(obj, f"{path}: line {no}")
        for k, dtype in schema.items():
            cols[k].append(_coerce(obj.get(k), dtype, f"{path}: line {no}", k))
    return Batch(pl.DataFrame(cols, schema=schema), lines, "line")


def _coerce(v, dtype, where: str, key: str):
    """A JSON value as ``dtype``; None stays None (checked later); a wrong type is an error."""
    if v is None:
        return None
    if dtype == pl.String:
        return str(v)
    if dtype == pl.Float64:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UserError(f"{where}: {key} is {shown(v)}, expected a number")
        return float(v)
    if dtype == pl.Int64:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not _INT64_MIN <= v <= _INT64_MAX:
            raise UserError(f"{where}: {key} is {shown(v)}, expected an integer")
        return v
    if isinstance(dtype, pl.List):
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                              and _INT64_MIN <= x <= _INT64_MAX for x in v):
            raise UserError(f"{where}: {key} is {shown(v)}, expected a list of integers")
        return v
    return v


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
