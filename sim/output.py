"""``write_run``: the run directory of DESIGN.md section 5."""

from __future__ import annotations

import json
import math
from pathlib import Path

from sim.atomic import atomic_path, write_text
from sim.errors import UserError

REQUEST_COLUMNS = (
    "request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "input_tokens",
    "output_tokens", "ttft_s", "tpot_s", "e2el_s", "queue_s", "num_preemptions", "replica", "status",
    "fail_reason", "prefix_hit_tokens", "kv_transfer_s", "decode_wait_s", "decode_rounds_waited", "ttft_wait_batch_s", "ttft_wait_kv_s", "ttft_prefill_s",
    "ttft_interference_s", "ttft_overhead_s", "ttft_preempt_s", "ttft_kv_transfer_s", "ttft_decode_s",
)
STEP_COLUMNS = (
    "replica", "start_s", "duration_s", "num_steps", "num_seqs", "prefill_tokens", "decode_tokens",
    "kv_blocks_used", "num_waiting", "first_step_duration_s", "last_step_duration_s", "multi_step",
)


def write_run(result, summary: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # each file whole or absent (sim/atomic.py): a full disk leaves no truncated file behind
    # result.json last: a directory holding it holds the whole run
    with atomic_path(out / "requests.parquet") as tmp:
        _write_parquet(tmp, result.num_requests, _request_group(result))
    with atomic_path(out / "steps.parquet") as tmp:
        _write_parquet(tmp, result.num_step_rows, lambda a, b: result.step_frame(a, b, STEP_COLUMNS))
    write_text(out / "scenario.resolved.yaml", result.scenario.to_yaml())
    write_text(out / "result.json", json.dumps(_json_safe(summary), indent=2, allow_nan=False) + "\n")
    return out


def _request_group(result):
    import polars as pl

    def rows(start: int, stop: int):
        # a time that never happened (a failed request's first token) is null, not NaN
        return result.request_frame(start, stop, REQUEST_COLUMNS).with_columns(pl.col(pl.Float64).fill_nan(None))
    return rows


def row_group_rows(num_rows: int) -> list[int]:
    """The rows of each row group polars' ``write_parquet`` gives a frame of ``num_rows`` rows
    (its defaults: the split depends on the row count alone, not on the columns), read off
    the file its Parquet sink (which ``write_parquet`` runs) writes for a column of nulls that
    long (a few kilobytes; 40 ms at 10M rows)."""
    import io

    import polars as pl

    from sim.parquet_rows import row_group_rows as footer_rows

    buf = io.BytesIO()
    pl.select(pl.repeat(None, num_rows, dtype=pl.Int8).alias("x")).lazy().sink_parquet(buf, statistics=False)
    return footer_rows(buf.getvalue())


def _write_parquet(path: Path, num_rows: int, rows) -> None:
    """A Parquet file of ``num_rows`` rows, ``rows(start, stop)`` giving a polars frame of rows
    [start, stop), written one row group at a time (memory: one row group, ~130,000 rows).

    The bytes are those of ``rows(0, num_rows).write_parquet(path, statistics=False)``, which
    is what writes a frame of one row group or none (up to ~150,000 rows). A longer one goes
    a row group at a time: polars writes a frame through its streaming Parquet sink, which
    makes one row group of each morsel it gets (when near its 122,880-row target); fed the
    row groups that write would have made (``row_group_rows``) as morsels from a Python
    source, it writes the same file (tests/test_output_stream.py compares the two)."""
    from polars.io.plugins import register_io_source

    sizes = row_group_rows(num_rows)
    if len(sizes) <= 1:
        rows(0, num_rows).write_parquet(path, statistics=False)
        return
    first = [rows(0, sizes[0])]
    schema = first[0].schema

    def source(with_columns, predicate, n_rows, batch_size):
        # a sink reads every column and row: no projection, filter or limit reaches here
        assert with_columns is None and predicate is None and n_rows is None
        start = 0
        for size in sizes:
            yield first.pop() if start == 0 else rows(start, start + size)
            start += size

    register_io_source(source, schema=schema).sink_parquet(path, statistics=False)


def _json_safe(v):
    """NaN and infinities become null: JSON has no such numbers, and a figure that does not exist is null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def check_new_run_dir(path: str | Path, force: bool, flag: str = "--force") -> None:
    """Refuse to write into a directory that already holds files, unless ``force``: a second run
    must not silently replace the first one's results."""
    p = Path(path)
    if not force and p.is_dir() and any(p.iterdir()):
        raise UserError(f"{p}: already exists and is not empty; pass {flag} to overwrite it, or --out another directory")
