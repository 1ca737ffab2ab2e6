"""Writing ARCHITECTURE.md section 6's normalised Parquet, with provenance in its metadata."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.files.text import arrow_file
from sim.workload.arrays import RequestArrays

ROW_GROUP_ROWS = 1_000_000


def _table(arrays: RequestArrays, first_id: int):
    import pyarrow as pa

    cols = {
        "request_id": np.arange(first_id, first_id + len(arrays), dtype=np.int64),
        "arrival_s": arrays.arrival_s.astype(np.float64),
        "input_tokens": arrays.input_tokens.astype(np.int64),
        "output_tokens": arrays.output_tokens.astype(np.int64),
    }
    if arrays.hash_ids is not None:
        lens = np.fromiter((len(h) for h in arrays.hash_ids), np.int32, len(arrays))
        flat = np.concatenate(arrays.hash_ids).astype(np.int64) if lens.sum() else np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        cols["hash_ids"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
    if arrays.session_id is not None:
        cols["session_id"] = arrays.session_id.astype(np.int64)
    if arrays.priority is not None:
        cols["priority"] = arrays.priority.astype(np.int64)
    if arrays.max_tokens is not None:
        cols["max_tokens"] = arrays.max_tokens.astype(np.int64)
    if arrays.abort_s is not None:  # (null where a request is not aborted)
        cols["abort_s"] = pa.array(arrays.abort_s.astype(np.float64), from_pandas=True)
    for k, v in (arrays.measured or {}).items():
        cols[k] = pa.array([x.tolist() for x in v], type=pa.list_(pa.float64())) if isinstance(v, list) else v
    return pa.table(cols)


def write_normalized(arrays: RequestArrays, path: str | Path, metadata: dict | None = None) -> None:
    """Write the normalised schema in row groups; ``hash_block_size`` goes into the metadata."""
    import pyarrow.parquet as pq

    meta = {k: str(v) for k, v in (metadata or {}).items()}
    if arrays.hash_ids is not None:
        meta["hash_block_size"] = str(arrays.hash_block_size)
    from sim.files.atomic import atomic_path

    with atomic_path(path) as tmp, arrow_file(tmp, "wb") as sink:  # whole or absent (sim/files/atomic.py)
        writer = None
        try:
            for start in range(0, max(len(arrays), 1), ROW_GROUP_ROWS):
                part = arrays.take(np.arange(start, min(start + ROW_GROUP_ROWS, len(arrays))))
                table = _table(part, start)
                if writer is None:
                    table = table.replace_schema_metadata(meta)
                    writer = pq.ParquetWriter(sink, table.schema, compression="zstd")
                writer.write_table(table.replace_schema_metadata(meta))
        finally:
            if writer is not None:
                writer.close()
