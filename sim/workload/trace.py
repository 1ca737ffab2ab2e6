"""Reading traces (ARCHITECTURE.md section 6): detect the format, read in batches, order, stream.

Why: users replay the traces they have; each is read as it is (``readers.py`` maps its
columns), every bad row is reported with its file and line, rows out of time order are sorted
with a warning saying how many moved, and nothing is dropped without a warning.
Formats: see ``formats.TRACE_FORMATS`` and traces/README.md.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from sim.errors import UserError
from sim.limits import MAX_TRACE_SPAN_S, check_last_arrival_s
from sim.files.text import arrow_file
from sim.workload.arrays import RequestArrays, concat
from sim.workload.formats import TRACE_FORMATS, format_names
from sim.workload.readers import OPTIONAL_NORMALIZED, ReadOptions, ReadState, converter, flattener
from sim.workload.sources import (CHUNK_ROWS, Batch, NotNumeric, check_exists, csv_batches, csv_header,
                                  first_line, json_limit, jsonl_batches, jsonl_numeric_batches, looks_binary, numeric_batches,
                                  parquet_batches, parquet_columns, shown_columns)
from sim.workload.staged import readable

# formats whose needed columns are numbers (times, token counts) or text the numeric reader hands
# over as pyarrow text (``numeric_text``: date-times, BurstGPT's model; generic's arrival with
# time unit datetime) are read by the numeric reader when the file has no other column to read:
# ``numeric`` in their registry entry (sim/workload/formats.py)
# JSON Lines traces up to this size are read by the numeric reader: it saves polars' import
# (~0.13 s of CPU) but costs ~0.006 s more per MB than polars (its checks before parsing); the
# two cross near 36 MB (bench/README.md, "JSON Lines traces without polars")
JSONL_NUMERIC_MAX_BYTES = 32 << 20


class TraceWarning(UserWarning):
    """Something the user should know about their trace (rows sorted, rows left out)."""


def _columns(path: Path) -> tuple[str, list[str]]:
    """(file kind, column or key names) from the file's header or first record."""
    check_exists(path)
    if path.suffix == ".parquet":
        return "table", parquet_columns(path)
    if looks_binary(path):
        raise UserError(f"{path}: binary data{_compression(path)}, not a trace (expected CSV, JSON Lines, vLLM bench "
                        "JSON or Parquet named *.parquet, or any of them gzip-compressed)")
    line = first_line(path)
    _refuse_json_array(path, line)
    if line.startswith("{"):
        if path.suffix == ".json":
            return "json", []
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise UserError(f"{path}: line 1: not valid JSON") from None
        except (RecursionError, ValueError) as e:
            raise UserError(f"{path}: line 1: {json_limit(e)}") from None
        return "jsonl", list(obj) if isinstance(obj, dict) else []
    return "table", csv_header(path)


# the magic bytes of compressions simsrv does not read (gzip it does: sim/workload/staged.py)
_COMPRESSED = {b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"PK\x03\x04": "zip",
               b"\x04\x22\x4d\x18": "lz4"}


def _compression(path: Path) -> str:
    """ " (zstd-compressed: decompress it first)" for a file that starts with the magic bytes of
    a compression simsrv does not read; "" otherwise."""
    with open(path, "rb") as f:
        head = f.read(6)
    for magic, name in _COMPRESSED.items():
        if head.startswith(magic):
            return f" ({name}-compressed: decompress it first, or gzip it)"
    return ""


def _refuse_json_array(path: Path, line: str) -> None:
    """A file that starts with a JSON array (``[1, 2]``, ``[{...}, ...]``, a lone ``[``) is one
    error line, where its first line was read as a CSV header (``columns ['[1', '2]']``)."""
    if not line.startswith("["):
        return
    if line.rstrip() == "[" or line[1:].lstrip()[:1] in ("{", "[", '"'):
        is_array = True
    else:
        try:
            is_array = isinstance(json.loads(line), list)
        except (ValueError, RecursionError):
            is_array = False
    if is_array:
        raise UserError(f"{path}: line 1: a JSON array, not a trace; simsrv reads JSON Lines (one JSON object per "
                        "line), a vLLM bench JSON object, CSV with a header row, or Parquet")


def detect_format(path: str | Path) -> str:
    """The format whose columns the file has; an error lists what each format needs."""
    path = readable(path)
    kind, cols = _columns(path)
    if kind == "json":
        return "vllm_bench"
    have = set(cols)
    for fmt, spec in TRACE_FORMATS.items():
        if spec.kind == kind and spec.columns and set(spec.columns) <= have:
            return fmt
    if kind == "jsonl" and {"input_length", "output_length"} <= have:
        return "mooncake"
    known = "; ".join(f"{f}: {', '.join(spec.columns)}" for f, spec in TRACE_FORMATS.items() if spec.columns)
    # NOTE: a first line with no comma is not a CSV header: it is not echoed (it may be a line
    # of any file given by mistake)
    found = f"columns {shown_columns(cols)}" if len(cols) > 1 or kind == "jsonl" else "no CSV header or JSON object"
    raise UserError(f"{path}: unknown trace format: {found}; expected one of {known}; or give "
                    "format generic with the column names and time unit")


def _needed_columns(fmt: str, opts: ReadOptions) -> list[str]:
    """The columns every row of a table format has (generic: those the options name)."""
    if fmt == "generic":
        cols = [opts.arrival_column, opts.input_column, opts.output_column]
        return cols + [opts.max_tokens_column] if opts.max_tokens_column else cols
    return list(TRACE_FORMATS[fmt].columns)


def _table_columns(path: Path, fmt: str, opts: ReadOptions) -> list[str]:
    """The columns to read from a CSV or Parquet trace of a table format (errors if it is not one):
    the needed ones, then the optional ones the file has."""
    need = _needed_columns(fmt, opts)
    if path.suffix == ".parquet":
        names = parquet_columns(path) if fmt == "normalized" else []
        return need + [c for c in names if c in OPTIONAL_NORMALIZED or c.startswith("measured_")]
    line = first_line(path)
    if line.startswith("{"):
        raise UserError(f"{path}: line 1: format {fmt} expects a CSV header, found a JSON object")
    _refuse_json_array(path, line)
    header = csv_header(path) if fmt == "normalized" else []
    return need + [c for c in header if c in ("session_id", "priority", "max_tokens", "abort_s") or c.startswith("measured_")]


def _numeric_columns(path: Path, fmt: str, opts: ReadOptions) -> tuple[list[str], tuple[str, ...]] | None:
    """(the columns a CSV or Parquet trace is read from, those of them read as text: date-times,
    BurstGPT's model) when its format's columns are numbers (times, token counts) or such text:
    the numeric reader may read it. None otherwise."""
    if not TRACE_FORMATS[fmt].numeric or (fmt == "generic" and path.suffix in (".jsonl", ".ndjson")):
        return None
    cols = _table_columns(path, fmt, opts)
    if len(cols) != len(_needed_columns(fmt, opts)):  # an optional column to read
        return None
    if fmt == "generic" and opts.time_unit == "datetime":
        return cols, (opts.arrival_column,)
    return cols, TRACE_FORMATS[fmt].numeric_text


def _jsonl_fields(path: Path, fmt: str, opts: ReadOptions) -> tuple[dict[str, str], object] | None:
    """(field types, flatten function or None) of a JSON Lines trace; None for a table (an error
    if the format expects JSON Lines and the file is not)."""
    kind, schema = TRACE_FORMATS[fmt].kind, TRACE_FORMATS[fmt].schema
    if fmt == "generic" and path.suffix in (".jsonl", ".ndjson"):
        t = "str" if opts.time_unit == "datetime" else "f64"
        fields = {opts.arrival_column: t, opts.input_column: "f64", opts.output_column: "f64"}
        if opts.max_tokens_column:
            fields[opts.max_tokens_column] = "f64"
        return fields, None
    if kind != "jsonl":
        return None
    if path.suffix == ".parquet" or not first_line(path).startswith("{"):
        raise UserError(f"{path}: line 1: format {fmt} expects JSON Lines (one JSON object per line)")
    return schema, flattener(fmt)


def _numeric_batches(path: Path, fmt: str, opts: ReadOptions, chunk_rows: int,
                     fields: tuple[dict[str, str], object] | None) -> Iterator[Batch] | None:
    """The numeric reader's batches (no polars: ``sources.py``) when it may read this trace; None
    otherwise (the general reader reads it). ``fields``: ``_jsonl_fields``'s answer."""
    if fields is not None:
        if path.stat().st_size > JSONL_NUMERIC_MAX_BYTES:
            return None
        return jsonl_numeric_batches(path, fields[0], chunk_rows, fields[1])
    numeric = _numeric_columns(path, fmt, opts)
    return None if numeric is None else numeric_batches(path, numeric[0], chunk_rows, text=numeric[1])


def _batches(path: Path, fmt: str, opts: ReadOptions, chunk_rows: int, fields: tuple[dict[str, str], object] | None):
    """The general reader's batches; ``fields``: ``_jsonl_fields``'s answer."""
    if fields is not None:
        return jsonl_batches(path, fields[0], chunk_rows, fields[1])
    columns = _table_columns(path, fmt, opts)
    return parquet_batches(path, columns, chunk_rows) if path.suffix == ".parquet" else csv_batches(path, columns,
                                                                                                     chunk_rows)


def _parquet_block_size(path: Path) -> int | None:
    import pyarrow.parquet as pq

    with arrow_file(path) as src:
        meta = pq.ParquetFile(src).schema_arrow.metadata or {}
    v = meta.get(b"hash_block_size")
    return int(v) if v else None


def raw_chunks(path: str | Path, opts: ReadOptions | None = None, state: ReadState | None = None,
               chunk_rows: int = CHUNK_ROWS) -> Iterator[RequestArrays]:
    """Validated chunks in file order, arrival in absolute seconds (not sorted, not shifted)."""
    path = readable(path)  # a pipe or a gzip file: read from its copy, named as given
    opts = opts or ReadOptions()
    state = state if state is not None else ReadState()
    fmt = detect_format(path) if opts.format == "auto" else opts.format
    if fmt not in TRACE_FORMATS:
        raise UserError(f"{path}: unknown format {fmt!r}; one of {', '.join(format_names())}")
    check_exists(path)
    if fmt == "vllm_bench":
        from sim.workload.bench_json import read_vllm_bench

        if first_line(path)[:1] != "{":
            raise UserError(f"{path}: line 1: format vllm_bench expects a JSON object")
        arr, failed = read_vllm_bench(path)
        state.note("failed requests (errors / 0 output tokens): left out", failed)
        if len(arr):
            yield arr
        return
    if fmt == "normalized" and path.suffix == ".parquet" and opts.hash_block_size is None:
        opts = ReadOptions(**{**opts.__dict__, "hash_block_size": _parquet_block_size(path)})
    convert = converter(fmt)
    any_rows = False
    done_rows = 0  # rows converted by the numeric reader before it gave up
    fields = _jsonl_fields(path, fmt, opts)  # (once: both readers need it)
    numeric = _numeric_batches(path, fmt, opts, chunk_rows, fields)
    if numeric is not None:
        try:
            for batch in numeric:
                if batch.frame.height == 0:
                    continue
                # (these formats' converters note counts in ``state`` only once every check passed:
                # a batch the numeric reader gives up is converted again by the general one)
                chunk = convert(batch, path, opts, state)
                any_rows = True
                done_rows += batch.frame.height
                if len(chunk):
                    yield chunk
            if not any_rows:
                raise UserError(f"{path}: the trace has no rows")
            return
        except NotNumeric:
            pass  # the general reader goes on from the first row not converted, and names a bad line
    for batch in _batches(path, fmt, opts, chunk_rows, fields):
        if done_rows:
            skip = min(done_rows, batch.frame.height)
            batch, done_rows = batch.without_first(skip), done_rows - skip
        if batch.frame.height == 0:
            continue
        any_rows = True
        chunk = convert(batch, path, opts, state)
        if len(chunk):
            yield chunk
    if not any_rows:
        raise UserError(f"{path}: the trace has no rows")


def emit_notes(path: Path, state: ReadState) -> None:
    for what, n in state.notes.items():
        warnings.warn(TraceWarning(f"{path}: {n:,} {what}"), stacklevel=3)


def _sorted(arr: RequestArrays, state: ReadState) -> RequestArrays:
    order = np.argsort(arr.arrival_s, kind="stable")
    moved = int((order != np.arange(len(order))).sum())
    if moved:
        state.note("rows were out of time order and moved when sorting by arrival time", moved)
        arr = arr.take(order)
    return arr


def spread_in_grid(arr: RequestArrays, grid_s: float, rng: np.random.Generator) -> RequestArrays:
    """Spread requests uniformly inside their grid bucket ``[k*g, (k+1)*g)``, then re-sort.

    NOTE: Mooncake's production traces round timestamps to a ~3 s grid; replayed as they are,
    every bucket's requests arrive at the same instant.
    """
    t = np.floor(arr.arrival_s / grid_s) * grid_s + rng.random(len(arr)) * grid_s
    order = np.argsort(t, kind="stable")
    return arr.with_arrivals(t).take(order)


def nothing_left(path: Path, state: ReadState) -> UserError:
    """Every row was left out: one line saying why (the notes that would have been warnings)."""
    why = "; ".join(f"{n:,} {what}" for what, n in state.notes.items())
    return UserError(f"{path}: no requests left to replay" + (f": {why}" if why else ""))


def check_span(path: Path, first_s: float, last_s: float) -> None:
    """A trace whose arrivals spread over more than ``MAX_TRACE_SPAN_S`` has a corrupted time or
    a wrong time unit (both ``run`` and ``trace inspect`` refuse it)."""
    if last_s - first_s > MAX_TRACE_SPAN_S:
        raise UserError(f"{path}: arrivals span {last_s - first_s:.3g} s (over {MAX_TRACE_SPAN_S / 31_557_600:.0f} "
                        "years): a corrupted timestamp or a wrong time unit")


def read_trace(path: str | Path, fmt: str = "auto", time_scale: float = 1.0,
               opts: ReadOptions | None = None, chunk_rows: int = CHUNK_ROWS) -> RequestArrays:
    """The whole trace, sorted, first arrival at 0, arrivals multiplied by ``time_scale``."""
    path = Path(path)
    opts = opts or ReadOptions(format=fmt)
    state = ReadState()
    chunks = list(raw_chunks(path, opts, state, chunk_rows))
    arr = concat(chunks) if chunks else None
    if arr is None or len(arr) == 0:
        raise nothing_left(path, state)
    arr = _sorted(arr, state)
    check_span(path, float(arr.arrival_s[0]), float(arr.arrival_s[-1]))
    if opts.spread_grid_s:
        arr = spread_in_grid(arr, opts.spread_grid_s, np.random.default_rng(opts.seed))
    emit_notes(path, state)
    out = arr.retimed(float(arr.arrival_s[0]), time_scale)
    check_scaled_span(out, time_scale)
    return out


def check_scaled_span(arr: RequestArrays, time_scale: float, key: str = "workload.trace.time_scale") -> None:
    """The trace's arrivals once multiplied by its time scale (or the factor a target rate gives)
    end within ``MAX_TIME_S`` (``check_last_arrival_s``)."""
    check_last_arrival_s(float(arr.arrival_s[-1]), key, f"a time scale of {time_scale:g}")


def stream_trace(path: str | Path, opts: ReadOptions | None = None, time_scale: float = 1.0,
                 chunk_rows: int = CHUNK_ROWS) -> Iterator[RequestArrays]:
    """The trace as consecutive sorted chunks (first arrival at 0), read ``chunk_rows`` at a time.

    Rows out of order inside a chunk are sorted (with a warning); a row earlier than a previous
    chunk's rows cannot be streamed: the error says to sort the trace with ``simsrv trace convert``.
    """
    path = Path(path)
    opts = opts or ReadOptions()
    state = ReadState()
    rng = np.random.default_rng(opts.seed)
    grid = opts.spread_grid_s
    carry: RequestArrays | None = None
    t0: float | None = None
    last = -math.inf
    n_out = 0
    for chunk in raw_chunks(path, opts, state, chunk_rows):
        chunk = _sorted(chunk, state)
        if chunk.arrival_s[0] < last:
            raise UserError(f"{path}: rows are out of time order across more than {chunk_rows:,} rows (request "
                            f"{n_out + 1:,} on); sort the trace first: simsrv trace convert {path} -o sorted.parquet")
        raw_max = float(chunk.arrival_s[-1])
        last = raw_max
        check_span(path, float(chunk.arrival_s[0]) if t0 is None else t0, raw_max)
        if grid:
            chunk = spread_in_grid(chunk, grid, rng)
            if carry is not None:
                chunk = concat([carry, chunk]).take(np.argsort(np.concatenate([carry.arrival_s, chunk.arrival_s]),
                                                               kind="stable"))
            # rows of the last (possibly unfinished) bucket wait for the next chunk
            cut = int(np.searchsorted(chunk.arrival_s, math.floor(raw_max / grid) * grid, side="left"))
            carry, chunk = chunk.take(np.arange(cut, len(chunk))), chunk.take(np.arange(cut))
            if len(chunk) == 0:
                continue
        if t0 is None:
            t0 = float(chunk.arrival_s[0])
        n_out += len(chunk)
        chunk = chunk.retimed(t0, time_scale)
        check_scaled_span(chunk, time_scale)
        yield chunk
    if carry is not None and len(carry):
        t0 = float(carry.arrival_s[0]) if t0 is None else t0
        n_out += len(carry)
        carry = carry.retimed(t0, time_scale)
        check_scaled_span(carry, time_scale)
        yield carry
    if n_out == 0:
        raise nothing_left(path, state)
    emit_notes(path, state)


def read_column(path: Path, column: str, where: str) -> np.ndarray:
    """One token-count column of a CSV or Parquet file (for ``dist: empirical``)."""
    from sim.workload.validate import tokens

    path = readable(path)
    check_exists(path)
    if path.suffix != ".parquet" and column not in csv_header(path):
        raise UserError(f"{where}: {path} has no column {column!r}; columns: {shown_columns(csv_header(path))}")
    try:
        parts = [tokens(b, column, path) for b in numeric_batches(path, [column])]
    except NotNumeric:  # the general reader names the line of a bad value
        batches = parquet_batches(path, [column]) if path.suffix == ".parquet" else csv_batches(path, [column])
        parts = [tokens(b, column, path) for b in batches]
    if not parts or sum(len(p) for p in parts) == 0:
        raise UserError(f"{where}: {path} has no rows")
    return np.concatenate(parts)


def write_normalized(arrays: RequestArrays, path: str | Path, metadata: dict | None = None) -> None:
    """Kept here for callers of the first version; see ``normalized.write_normalized``."""
    from sim.workload.normalized import write_normalized as write

    write(arrays, path, metadata)
