"""``write_run``: the run directory of ARCHITECTURE.md section 5."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from sim.files.atomic import atomic_path, simsrv_leftover, write_text
from sim.files.text import arrow_file

REQUEST_COLUMNS = (
    "request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "input_tokens",
    "output_tokens", "ttft_s", "tpot_s", "e2el_s", "queue_s", "num_preemptions", "replica", "status",
    "fail_reason", "prefix_hit_tokens", "kv_transfer_s", "decode_wait_s", "decode_rounds_waited", "ttft_wait_batch_s", "ttft_wait_kv_s", "ttft_prefill_s",
    "ttft_interference_s", "ttft_overhead_s", "ttft_preempt_s", "ttft_kv_transfer_s", "ttft_decode_s",
    "ttft_kv_load_s", "ttft_frontend_s", "priority",
)
STEP_COLUMNS = (
    "replica", "start_s", "duration_s", "num_steps", "num_seqs", "prefill_tokens", "decode_tokens",
    "kv_blocks_used", "num_waiting", "first_step_duration_s", "last_step_duration_s", "multi_step",
)


# rows per Parquet row group, and per slice of the results read to write one (memory: one group)
ROW_GROUP_ROWS = 1 << 17


def write_run(result, summary: dict, out_dir: str | Path) -> Path:
    """The run's files in ``out_dir``. Callers write into the directory that
    ``sim.files.atomic.replacing_dir`` gives, so that the run directory is replaced whole."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # each file whole or absent (sim/files/atomic.py): a full disk leaves no truncated file behind
    # result.json last: a directory holding it holds the whole run
    _write_file(out / "requests.parquet", result.num_requests, lambda a, b: request_table(result, a, b))
    _write_file(out / "steps.parquet", result.num_step_rows,
                lambda a, b: _table({c: result.step_column(c, a, b) for c in STEP_COLUMNS}))
    write_text(out / "scenario.resolved.yaml", result.scenario.to_yaml())
    write_text(out / "result.json", json.dumps(_json_safe(summary), indent=2, allow_nan=False) + "\n")
    return out


def _write_file(path: Path, num_rows: int, rows) -> None:
    """``write_parquet`` to ``path``, whole or absent; an error names ``path`` (Arrow's own
    name no file: "Error writing bytes to file. Detail: [errno 28] ...")."""
    with atomic_path(path) as tmp:
        try:
            write_parquet(tmp, num_rows, rows)
        except OSError as e:
            if e.filename:
                raise
            raise OSError(e.errno, os.strerror(e.errno) if e.errno else str(e), str(path)) from e


def request_table(result, start: int, stop: int):
    """Rows [start, stop) of requests.parquet as an Arrow table: REQUEST_COLUMNS in order, a time
    that never happened (NaN: a failed request's first token) as null, ``status`` and
    ``fail_reason`` as strings."""
    ok = result.completed(start, stop)
    return _table({c: result.request_column(c, start, stop, ok) for c in REQUEST_COLUMNS})


def _table(cols: dict):
    """An Arrow table of numpy columns, in the dict's order: float64 (NaN written as null), int64,
    or object arrays of str (large_string, as polars writes strings). Numbers are wrapped
    buffer by buffer: ``pa.array`` of a numpy array imports numpy.ma (~0.01 s of start-up)."""
    import numpy as np
    import pyarrow as pa

    def arrow(v: np.ndarray):
        if v.dtype == object:
            return pa.array(v.tolist(), pa.large_string())
        kind = {np.dtype(np.float64): pa.float64(), np.dtype(np.int64): pa.int64()}.get(v.dtype)
        if kind is None:  # no column has another type today; pyarrow converts any other
            return pa.array(v, from_pandas=v.dtype.kind == "f")
        data = pa.py_buffer(np.ascontiguousarray(v))
        valid = ~np.isnan(v) if v.dtype == np.float64 else None
        if valid is None or valid.all():
            return pa.Array.from_buffers(kind, len(v), [None, data], 0)
        mask = pa.py_buffer(np.packbits(valid, bitorder="little"))
        return pa.Array.from_buffers(kind, len(v), [mask, data], int(len(v) - valid.sum()))

    return pa.table({c: arrow(v) for c, v in cols.items()})


def write_parquet(path, num_rows: int, rows) -> None:
    """A Parquet file of ``num_rows`` rows, ``rows(start, stop)`` giving rows [start, stop) as an
    Arrow table, written one row group of ``ROW_GROUP_ROWS`` at a time (memory: one group).
    pyarrow writes it (no statistics): importing pyarrow.parquet costs a run's start-up
    ~0.05 s of CPU where polars costs ~0.15 s (bench/startup.py). The bytes depend only on the
    rows, not on how the caller's store is split (tests/test_output_stream.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    first = rows(0, min(num_rows, ROW_GROUP_ROWS))
    # zstd level 1: at 1M chunked 512 requests (3.6M step rows) it writes requests.parquet in
    # 0.51 s of CPU where level 3 (polars' default) took 0.60, 1% larger (bench/README.md,
    # "Compiled core, tenth round"). Dictionary pages only for the string columns. The counts
    # are DELTA_BINARY_PACKED (bit-packed differences) and the floats BYTE_STREAM_SPLIT (each
    # value's bytes spread over 8 streams, so zstd meets runs of alike exponent bytes): both
    # standard Parquet encodings, read by polars and pyarrow. At 200k requests (chunked 512,
    # 720k step rows) they write both files in 0.26 s of CPU where plain pages took 0.49 s, and
    # 34.2 MB where plain took 38.2 (bench/README.md, "Compiled core, ninth round").
    strings, encodings = [], {}
    for f in first.schema:
        if f.type == pa.large_string():
            strings.append(f.name)
        elif f.type == pa.int64():
            encodings[f.name] = "DELTA_BINARY_PACKED"
        elif f.type == pa.float64():
            encodings[f.name] = "BYTE_STREAM_SPLIT"
    # a path that is not UTF-8 (caf\xe9/) opened by Python: Arrow refuses it (sim/files/text.py)
    with arrow_file(path, "wb") as sink, pq.ParquetWriter(sink, first.schema, compression="zstd",
                                                          compression_level=1, use_dictionary=strings,
                                                          column_encoding=encodings,
                                                          write_statistics=False) as writer:
        writer.write_table(first, row_group_size=ROW_GROUP_ROWS)
        for start in range(ROW_GROUP_ROWS, num_rows, ROW_GROUP_ROWS):
            writer.write_table(rows(start, min(start + ROW_GROUP_ROWS, num_rows)), row_group_size=ROW_GROUP_ROWS)


def _json_safe(v):
    """NaN and infinities become null: JSON has no such numbers, and a figure that does not exist is null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


RUN_FILES = ("requests.parquet", "steps.parquet", "scenario.resolved.yaml", "result.json")


def not_run_files(path: Path) -> list[str]:
    """The entries of ``path`` that are not a run directory's files (nor a temporary that
    sim/files/atomic.py left): what ``--force`` must not remove (sim.files.atomic.replacing_dir)."""
    return sorted(n for n in os.listdir(path) if n not in RUN_FILES and not simsrv_leftover(n))


def not_report_files(path: Path) -> list[str]:
    """The entries of ``path`` that are neither ``report.html`` nor a run directory: the
    output directory of ``compare`` (one run directory per policy) or ``diagnose`` (``run/``)."""
    def ours(name: str) -> bool:
        p = path / name
        return (name in ("report.html", "compare.json") or simsrv_leftover(name)
                or (p.is_dir() and not p.is_symlink() and not not_run_files(p)))
    return sorted(n for n in os.listdir(path) if not ours(n))
