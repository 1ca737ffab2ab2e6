"""Files read in bounded batches, each row tagged with its line (or Parquet row) number.

Why: a 10-million-request trace must not be held as Python objects or strings all at once;
every later error names the file and the line it came from, so each batch carries the line
number of each of its rows.

Two readers: the general one gives polars frames of the raw values (text for CSV), which the
checks in ``validate.py`` convert and which name the first bad value's line. The numeric one
is the fast path, and loads no polars (its import is ~0.15 s of a run):
- ``numeric_batches``, for a table whose needed columns are all numbers, or date-times in the
  canonical form: pyarrow parses the numbers as float64 and hands over the date-time text,
  which ``validate.datetimes_s`` converts with pyarrow;
- ``jsonl_numeric_batches``, for JSON Lines: pyarrow's JSON reader with the format's field
  types (nested records, AIPerf's, parsed by ``json`` as the general reader does).
It gives up (``NotNumeric``) at the first batch with anything else (other text, an empty or
missing value, a value out of range, a line pyarrow does not parse): the general reader then
takes that batch and names the line.
"""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.errors import UserError
from sim.files.text import arrow_file

if TYPE_CHECKING:
    import polars as pl

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


class NotNumeric(Exception):
    """The numeric reader's batch holds something other than finite numbers in range: the
    general reader must read it (and name the line of a bad value)."""


def arrow_compute():
    """pyarrow's compute functions (``call_function`` and the option classes) without
    importing ``pyarrow.compute``, which wraps all ~290 functions in Python at import (~0.04 s
    of CPU); from it if a pyarrow release moves them."""
    try:
        import pyarrow._compute as pc
    except ImportError:  # pragma: no cover
        import pyarrow.compute as pc
    return pc


def arrow_is_text(arrow_type) -> bool:
    import pyarrow as pa

    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def arrow_or(array, value):
    """A pyarrow array with ``value`` where it is null (``fill_null``, whose method imports
    ``pyarrow.compute``)."""
    import pyarrow as pa

    return arrow_compute().call_function("coalesce", [array, pa.scalar(value, array.type)])


def arrow_list_lengths(array) -> np.ndarray:
    """Elements per row of a pyarrow list array, 0 where the row is null."""
    return arrow_or(arrow_compute().call_function("list_value_length", [array]), 0).to_numpy()


def arrow_list_values(array):
    """Every element of a pyarrow list array's rows, in row order (``flatten``, whose method
    imports ``pyarrow.compute``)."""
    return arrow_compute().call_function("list_flatten", [array])


class NumericColumns:
    """Columns of consecutive rows (the numeric reader's frame): float64 numpy arrays from a
    table, whose date-time column is pyarrow text; pyarrow arrays from JSON Lines, with nulls
    where a field is missing. ``frame[name]``, ``columns`` and ``height``, as the general
    reader's polars frames have them."""

    __slots__ = ("cols", "height")

    def __init__(self, cols: dict, height: int):
        self.cols, self.height = cols, height

    def __getitem__(self, name: str):
        return self.cols[name]

    @property
    def columns(self) -> list[str]:
        return list(self.cols)

    def null_count(self, name: str) -> int:
        """Rows missing ``name`` (JSON Lines; a table's numeric columns have none)."""
        v = self.cols[name]
        return 0 if isinstance(v, np.ndarray) else v.null_count

    def values(self, name: str) -> list:
        """The column as Python values, None where missing (as polars' ``to_list`` gives them)."""
        v = self.cols[name]
        return v.tolist() if isinstance(v, np.ndarray) else v.to_pylist()

    def filter(self, keep: np.ndarray) -> NumericColumns:
        """The rows where ``keep`` (a numpy bool mask) is true."""
        import pyarrow as pa

        mask = pa.array(keep)
        cols = {c: v[keep] if isinstance(v, np.ndarray) else arrow_compute().call_function("filter", [v, mask])
                for c, v in self.cols.items()}
        return NumericColumns(cols, int(keep.sum()))


@dataclass
class Batch:
    """Raw columns of consecutive rows; ``lines[i]`` is the 1-based line (or row) of row i."""

    frame: pl.DataFrame | NumericColumns
    lines: np.ndarray
    label: str  # "line" (text files) or "row" (Parquet)
    # a CSV's lines count its data rows as if it had no empty line (pyarrow skips them): this
    # maps such a number to the file's line, for a message (CsvLines)
    line_of: Callable[[int], int] | None = None

    def where(self, path: Path, i: int) -> str:
        line = int(self.lines[i])
        return f"{path}: {self.label} {line if self.line_of is None else self.line_of(line)}"

    def without_first(self, n: int) -> Batch:
        """The batch less its first ``n`` rows (rows another reader has delivered already)."""
        return Batch(self.frame.slice(n), self.lines[n:], self.label, self.line_of)

    def filter(self, keep: np.ndarray) -> Batch:
        """The rows where ``keep`` (a numpy bool mask) is true, with their lines."""
        if isinstance(self.frame, NumericColumns):
            return Batch(self.frame.filter(keep), self.lines[keep], self.label, self.line_of)
        import polars as pl

        return Batch(self.frame.filter(pl.Series(keep)), self.lines[keep], self.label, self.line_of)


class CsvLines:
    """The file's line of a CSV data row numbered as if the file had no blank line (``first``:
    the line of its first data row): the reader skips blank lines (``_open_csv``), so the numbers
    of the rows it gives are only right up to the first; the file is read again, on an error's
    path only. ``spaces``: a line of spaces or tabs is blank too (a file of 2 columns or more)."""

    def __init__(self, path: Path, first: int, spaces: bool = True):
        self.path, self.first, self.spaces = path, first, spaces

    def __call__(self, line: int) -> int:
        rows_before = line - self.first  # data rows before this one
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                if number < self.first or raw in (b"\n", b"\r\n") or (self.spaces and not raw.strip()):
                    continue
                if rows_before == 0:
                    return number
                rows_before -= 1
        return line


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
                blank = width > 1 and len(row) == 1 and not row[0].strip()  # skipped by the reader
                if row and len(row) != width and not blank:
                    return UserError(f"{path}: line {line}: {len(row)} fields, the header has {width} ({detail})")
    except (OSError, csv.Error):
        pass
    return UserError(f"{path}: cannot read as CSV ({detail})")


def _open_csv(path: Path, columns: list[str], column_types: dict, source=None):
    """(pyarrow's streaming reader of the named columns, each as its ``column_types`` type, line
    of the first data row); the header is checked first: missing or repeated names are one
    error line. ``source``: what pyarrow reads (``arrow_file``), default ``path``."""
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
    # Blank lines are skipped, as the JSON Lines readers skip them: empty ones by pyarrow, those of
    # spaces or tabs (a row of one field where the header has more) by _blank_row; a row's line
    # number counts them on an error's path only (CsvLines).
    reader = pacsv.open_csv(
        path if source is None else source,
        # our cleaned header names replace the file's (which may carry spaces or quotes)
        read_options=pacsv.ReadOptions(block_size=1 << 24, encoding="utf8", column_names=header,
                                       skip_rows=skipped + 1),
        parse_options=pacsv.ParseOptions(ignore_empty_lines=True, newlines_in_values=False,
                                         invalid_row_handler=_blank_row if len(header) > 1 else None),
        convert_options=pacsv.ConvertOptions(
            include_columns=columns, column_types=column_types,
            strings_can_be_null=False, quoted_strings_can_be_null=False),
    )
    return reader, skipped + 2


def _blank_row(row) -> str:
    """pyarrow's verdict on a row whose number of fields is wrong: a line of spaces or tabs is
    skipped, any other is an error (named with its line by ``_csv_error``)."""
    return "skip" if not row.text.strip() else "error"


def csv_lines(path: Path, first: int) -> CsvLines:
    """``CsvLines`` as ``_open_csv`` reads ``path``: spaces make a line blank where the header
    has more than one column."""
    return CsvLines(path, first, spaces=len(csv_header(path)) > 1)


def _grouped(reader, chunk_rows: int, on_error) -> Iterator[list]:
    """pyarrow record batches from ``reader`` in groups of at least ``chunk_rows`` rows (the
    last group may be smaller); a read error becomes ``on_error(e)``."""
    import pyarrow as pa

    pending: list = []
    n_pending = 0
    while True:
        try:
            rb = reader.read_next_batch()
        except StopIteration:
            break
        except pa.ArrowInvalid as e:
            raise on_error(e) from None
        pending.append(rb)
        n_pending += rb.num_rows
        if n_pending >= chunk_rows:
            yield pending
            pending, n_pending = [], 0
    if pending:
        yield pending


def csv_batches(path: Path, columns: list[str], chunk_rows: int = CHUNK_ROWS) -> Iterator[Batch]:
    """The named columns of a CSV file, as strings, ``chunk_rows`` rows at a time."""
    import polars as pl
    import pyarrow as pa

    # NOTE: every column is read as text and converted by us, so a bad value is reported with its line
    with arrow_file(path) as source:
        try:
            reader, start = _open_csv(path, columns, {c: pa.string() for c in columns}, source)
        except (pa.ArrowInvalid, UnicodeDecodeError) as e:
            raise _csv_error(path, e) from None
        line_of = csv_lines(path, start)
        for group in _grouped(reader, chunk_rows, lambda e: _csv_error(path, e)):
            frame = pl.concat([pl.from_arrow(rb) for rb in group])
            yield Batch(frame, np.arange(start, start + frame.height), "line", line_of)
            start += frame.height


def _numeric(columns: list[str], arrays: list, text: tuple[str, ...]) -> NumericColumns:
    """pyarrow arrays (one per column) as float64 numpy columns, those named in ``text`` as
    pyarrow text; a null gives up."""
    cols = {}
    for c, a in zip(columns, arrays):
        if a.null_count:
            raise NotNumeric(c)
        cols[c] = a if c in text else np.asarray(a.to_numpy(), dtype=np.float64)
    return NumericColumns(cols, len(arrays[0]))


def numeric_batches(path: Path, columns: list[str], chunk_rows: int = CHUNK_ROWS,
                    text: tuple[str, ...] = ()) -> Iterator[Batch]:
    """The named columns of a CSV or Parquet file as float64 (those in ``text``: pyarrow text),
    ``chunk_rows`` rows at a time; ``NotNumeric`` at the first batch that is not all numbers
    (text, empty, a Parquet column of another type), and before any batch if the file cannot be
    read this way."""
    import pyarrow as pa

    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        names = parquet_columns(path)  # (a file Parquet cannot read is one error line)
        with arrow_file(path) as src:
            pf = pq.ParquetFile(src)
            schema = pf.schema_arrow

            def fits(c: str) -> bool:  # a number, or text for a date-time column
                t = schema.field(c).type
                if c in text:
                    return arrow_is_text(t)
                return pa.types.is_integer(t) or pa.types.is_floating(t)

            if any(c not in names or not fits(c) for c in columns):
                raise NotNumeric(path)
            start = 1
            for rb in pf.iter_batches(batch_size=chunk_rows, columns=columns):
                frame = _numeric(columns, [rb.column(c) for c in columns], text)
                yield Batch(frame, np.arange(start, start + frame.height), "row")
                start += frame.height
        return
    with arrow_file(path) as source:
        try:
            reader, start = _open_csv(path, columns, {c: pa.string() if c in text else pa.float64() for c in columns},
                                      source)
        except (pa.ArrowInvalid, UnicodeDecodeError) as e:
            raise NotNumeric(path) from e
        line_of = csv_lines(path, start)
        for group in _grouped(reader, chunk_rows, lambda e: NotNumeric(path)):
            frame = _numeric(columns, [pa.chunked_array([rb.column(c) for rb in group]) for c in columns], text)
            yield Batch(frame, np.arange(start, start + frame.height), "line", line_of)
            start += frame.height


def parquet_columns(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    try:
        with arrow_file(path) as src:
            return pq.ParquetFile(src).schema_arrow.names
    except Exception as e:
        raise UserError(f"{path}: cannot read as Parquet ({str(e).splitlines()[0]})") from None


def parquet_batches(path: Path, columns: list[str], chunk_rows: int = CHUNK_ROWS) -> Iterator[Batch]:
    import pyarrow.parquet as pq

    names = parquet_columns(path)
    missing = [c for c in columns if c not in names]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}; the file has {shown_columns(names)}")
    import polars as pl

    start = 1
    with arrow_file(path) as src:
        for rb in pq.ParquetFile(src).iter_batches(batch_size=chunk_rows, columns=columns):
            frame = pl.from_arrow(rb)
            yield Batch(frame, np.arange(start, start + frame.height), "row")
            start += frame.height


def _polars_type(tag: str):
    import polars as pl

    return {"f64": pl.Float64, "i64": pl.Int64, "str": pl.String, "ids": pl.List(pl.Int64)}[tag]


# the bytes ``bytes.strip`` removes: a line of only these is blank (JSON Lines carry no record there)
_BLANK_BYTES = np.zeros(256, dtype=bool)
_BLANK_BYTES[list(b" \t\n\r\x0b\x0c")] = True
READ_BYTES = 1 << 24
# "[" and "{" on one JSON line beyond which the numeric reader leaves it to the general one
MAX_OPEN_BRACKETS = 256


def _non_blank(data: bytes, first_line: int) -> tuple[bytes, np.ndarray, np.ndarray, int]:
    """Of ``data`` (whole lines, each ending with a newline; the first is line ``first_line``):
    (its non-blank lines, their 1-based numbers, the end offset of each in those bytes, the
    number of lines)."""
    u8 = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(u8 == 10) + 1
    starts = np.concatenate(([0], ends[:-1]))
    # a line whose first byte is not blank is not; the others (indented or blank) are looked at whole
    filled = ~_BLANK_BYTES[u8[starts]]
    for i in np.flatnonzero(~filled).tolist():
        filled[i] = bool(data[starts[i]:ends[i]].strip())
    numbers = np.flatnonzero(filled) + first_line
    if filled.all():
        return data, numbers, ends, len(ends)
    kept = np.repeat(filled, ends - starts)
    return u8[kept].tobytes(), numbers, np.cumsum((ends - starts)[filled]), len(ends)


def _jsonl_lines(path: Path, chunk_rows: int) -> Iterator[tuple[bytes, np.ndarray]]:
    """(``chunk_rows`` non-blank lines of a JSON Lines file, each ending with a newline; their
    1-based numbers), in file order; the file is read ``READ_BYTES`` at a time, and its lines
    split with numpy (a Python loop over the lines was a third of reading a 1M-line trace)."""
    pending: list[bytes] = []
    numbers: list[np.ndarray] = []
    n_pending = 0
    line = 1  # the number of the first line not yet split
    rest: list[bytes] = []  # the reads since the last newline (a line may be longer than a read)
    with open(path, "rb") as f:
        while True:
            block = f.read(READ_BYTES)
            if not block:  # the end: a last line without a newline gets one
                data = b"".join(rest)
                data = data if not data or data.endswith(b"\n") else data + b"\n"
            else:
                cut = block.rfind(b"\n") + 1
                if not cut:
                    rest.append(block)
                    continue
                data, rest = b"".join([*rest, block[:cut]]), [block[cut:]]
            if data:
                kept, nos, ends, n_lines = _non_blank(data, line)
                line += n_lines
                start = 0  # offset of the first line of ``kept`` not yet handed on
                i = 0
                while n_pending + len(nos) - i >= chunk_rows:
                    j = i + chunk_rows - n_pending
                    pending.append(kept[start:ends[j - 1]])
                    numbers.append(nos[i:j])
                    yield b"".join(pending), np.concatenate(numbers)
                    pending, numbers, n_pending = [], [], 0
                    start, i = int(ends[j - 1]), j
                if i < len(nos):
                    pending.append(kept[start:])
                    numbers.append(nos[i:])
                    n_pending += len(nos) - i
            if not block:
                break
    if n_pending:
        yield b"".join(pending), np.concatenate(numbers)


def jsonl_batches(path: Path, schema: dict[str, str], chunk_rows: int = CHUNK_ROWS,
                  flatten=None) -> Iterator[Batch]:
    """JSON Lines, one object per line; only the ``schema`` fields are kept (field name -> "f64",
    "i64", "str" or "ids": float, integer, text, list of integers).

    A batch is parsed by polars; if that fails, line by line with ``json`` to name the bad line.
    ``flatten(obj) -> dict`` maps a nested record to flat fields (slow path only).
    """
    for data, lines in _jsonl_lines(path, chunk_rows):
        yield _parse_jsonl(path, data, lines, schema, flatten)


def _arrow_type(tag: str):
    import pyarrow as pa

    return {"f64": pa.float64(), "i64": pa.int64(), "str": pa.string(), "ids": pa.list_(pa.int64())}[tag]


def jsonl_numeric_batches(path: Path, schema: dict[str, str], chunk_rows: int = CHUNK_ROWS,
                          flatten=None) -> Iterator[Batch]:
    """``jsonl_batches`` without polars: each batch parsed by pyarrow's JSON reader with the
    ``schema`` types (a frame of pyarrow arrays, nulls where a field is missing); with
    ``flatten``, line by line with ``json`` as the general reader does. ``NotNumeric`` at the
    first batch the general reader might read otherwise (``_arrow_jsonl``), which then reads it
    and names a bad line."""
    import pyarrow as pa

    types = {k: _arrow_type(tag) for k, tag in schema.items()}
    for data, lines in _jsonl_lines(path, chunk_rows):
        if flatten is not None:
            cols = _json_columns(path, data, lines, schema, flatten)
            try:
                frame = NumericColumns({k: pa.array(v, type=types[k]) for k, v in cols.items()}, len(lines))
            except pa.ArrowException as e:  # (values pyarrow cannot hold as the field's type)
                raise NotNumeric("JSON Lines") from e
        else:
            frame = _arrow_jsonl(data, len(lines), types)
        yield Batch(frame, lines, "line")


def _left_to_general(data: bytes) -> bool:
    """Whether JSON Lines text (each line ending with a newline) has what pyarrow reads and
    the general reader refuses or reads otherwise, as far as the bytes show it before parsing."""
    u8 = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(u8 == 10)
    starts = np.concatenate(([0], newlines[:-1] + 1))
    # Each line whole records: starting with "{" (pyarrow 26 crashes on a block that starts
    # with null) and ending with "}" (pyarrow reads a record across lines; with two records on
    # another line, the count of rows would not tell).
    if not (u8[starts] == 123).all():
        return True
    last, before = u8[newlines - 1], u8[np.maximum(newlines - 2, 0)]
    whole = (last == 125) | ((last == 13) & (before == 125) & (newlines - starts >= 2))  # "}" or "}\r"
    for i in np.flatnonzero(~whole).tolist():  # (a "}" then spaces: looked at whole)
        if not data[starts[i]:newlines[i]].rstrip(b" \t\r").endswith(b"}"):
            return True
    # Over MAX_OPEN_BRACKETS "[" and "{" on a line: an upper bound of its nesting, which
    # Python's ``json`` cannot read past ~1,000 levels.
    opens = np.flatnonzero((u8 == 91) | (u8 == 123))  # (offsets, in order: their count per line below)
    if np.diff(np.searchsorted(opens, np.append(starts, len(u8)))).max() > MAX_OPEN_BRACKETS:
        return True
    # An integer of more digits than Python converts (``sys.get_int_max_str_digits``, 4,300):
    # ``json`` refuses it; only a line that long can hold one.
    limit = sys.get_int_max_str_digits()
    if limit:
        digits = re.compile(rb"[0-9]{%d}" % (limit + 1))
        for i in np.flatnonzero(newlines - starts > limit).tolist():
            if digits.search(data, starts[i], newlines[i]):
                return True
    # Inf and -NaN, which pyarrow reads and ``json`` refuses, even in a field the format
    # ignores (NaN and Infinity, which both read, are checked where they are kept)
    if b"Inf" in data or b"-NaN" in data:
        return True
    if not data.isascii():
        # a byte-order mark: polars refuses the batch, and the general reader parses it with
        # ``json`` and its own checks (``_coerce``), not polars'
        if b"\xef\xbb\xbf" in data:
            return True
        try:
            data.decode("utf-8")  # (pyarrow's reader does not check text it does not keep)
        except UnicodeDecodeError:
            return True
    return False


def _arrow_jsonl(data: bytes, rows: int, types: dict) -> NumericColumns:
    """JSON Lines text of ``rows`` records parsed by pyarrow (fields not in ``types`` ignored), or
    ``NotNumeric`` for any batch the general reader (polars, or ``json`` where polars gives up)
    might read otherwise: what ``_left_to_general`` finds in the bytes; text pyarrow does not
    parse (a value of another JSON type than its field's: a number where text is expected, 3.0
    for an integer; a repeated field); not one record per line; NaN or an infinity in a field it
    keeps; a null among a list's integers; -0."""
    import pyarrow as pa
    import pyarrow.json as pajson

    if _left_to_general(data):
        raise NotNumeric("JSON Lines")
    try:
        table = pajson.read_json(
            io.BytesIO(data),
            # (a record longer than a block is an error: the general reader reads that batch)
            read_options=pajson.ReadOptions(block_size=1 << 24),
            parse_options=pajson.ParseOptions(explicit_schema=pa.schema(list(types.items())),
                                              unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise NotNumeric("JSON Lines") from e
    if table.num_rows != rows:  # two records on a line
        raise NotNumeric("JSON Lines")
    cols = {k: table.column(k) for k in types}  # (chunked arrays: one chunk per block)
    for k, t in types.items():
        if pa.types.is_list(t) and arrow_list_values(cols[k]).null_count:  # [1, null]: the general reader names it
            raise NotNumeric(k)
        if t == pa.float64():
            x = cols[k].to_numpy(zero_copy_only=False)  # (NaN where null)
            # an integer beyond a double (pyarrow reads an infinity, ``json`` refuses it): only as
            # many values may not be finite as are null; -0 (pyarrow reads -0.0, polars and ``json`` 0.0)
            if (~np.isfinite(x)).sum() > cols[k].null_count or (np.signbit(x) & (x == 0)).any():
                raise NotNumeric(k)
    return NumericColumns(cols, rows)


def _parse_jsonl(path: Path, data: bytes, lines: np.ndarray, schema: dict[str, str], flatten) -> Batch:
    import polars as pl

    types = {k: _polars_type(tag) for k, tag in schema.items()}
    if flatten is None:
        try:
            frame = pl.read_ndjson(io.BytesIO(data), schema=types)
            if frame.height == len(lines):
                return Batch(frame, lines, "line")
        except Exception:
            pass
    return Batch(pl.DataFrame(_json_columns(path, data, lines, schema, flatten), schema=types), lines, "line")


def _json_columns(path: Path, data: bytes, lines: np.ndarray, schema: dict[str, str], flatten) -> dict[str, list]:
    """The ``schema`` fields of each line of ``data`` (lines ``lines``, each ending with a
    newline), parsed by ``json`` (and ``flatten``), as lists of Python values (None where
    missing); a line that is not a JSON object, or a value of the wrong type, is an error naming
    the line."""
    cols: dict[str, list] = {k: [] for k in schema}
    for raw, no in zip(data.split(b"\n"), lines.tolist()):
        try:
            # (with its newline: ``json`` guesses UTF-16 and -32 from the bytes)
            obj = json.loads(raw + b"\n", object_pairs_hook=_first_wins)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: line {no}: not valid JSON ({e.msg if hasattr(e, 'msg') else e})") from None
        except (RecursionError, ValueError) as e:
            raise UserError(f"{path}: line {no}: {json_limit(e)}") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}: line {no}: expected a JSON object, got {type(obj).__name__}")
        if flatten is not None:
            obj = flatten(obj, f"{path}: line {no}")
        for k, dtype in schema.items():
            cols[k].append(_coerce(obj.get(k), dtype, f"{path}: line {no}", k))
    return cols


def _first_wins(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose field may be written twice, as polars reads it: the first value
    (``json`` alone keeps the last), so a line reads the same whichever parser reads its batch."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        obj = {}
        for k, v in pairs:
            obj.setdefault(k, v)
    return obj


def json_limit(e: RecursionError | ValueError) -> str:
    """What a JSON text that ``json`` cannot read (past a limit of Python's) holds."""
    if isinstance(e, RecursionError):  # (Python's json parser recurses once per level)
        return "JSON nested too deeply to read"
    return f"JSON with an integer of over {sys.get_int_max_str_digits():,} digits"  # (ValueError from int())


def _coerce(v, tag: str, where: str, key: str):
    """A JSON value as the ``tag`` type; None stays None (checked later); a wrong type is an error."""
    if v is None:
        return None
    if tag == "str":
        v = str(v)
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:  # (json reads an escaped lone surrogate, "\ud800", into a str)
            raise UserError(f"{where}: {key} is {shown(v)}, not valid Unicode text") from None
        return v
    if tag == "f64":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UserError(f"{where}: {key} is {shown(v)}, expected a number")
        try:
            return float(v)
        except OverflowError:  # an integer literal beyond a double's range
            raise UserError(f"{where}: {key} is {shown(v)}, a number too large for a double") from None
    if tag == "i64":
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not _INT64_MIN <= v <= _INT64_MAX:
            raise UserError(f"{where}: {key} is {shown(v)}, expected an integer")
        return v
    if tag == "ids":
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                              and _INT64_MIN <= x <= _INT64_MAX for x in v):
            raise UserError(f"{where}: {key} is {shown(v)}, expected a list of integers")
        return v
    return v


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
