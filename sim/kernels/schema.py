"""The one compact schema of ``kernels_profile/*.parquet``: one row per measured kernel shape.

Why: calibration fits every source the same way; ``simsrv profile`` writes rows that
``simsrv calibrate`` reads without conversion. Unused shape columns are null.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from sim.cost.calibration import ENGINE_ATTN_OPS
from sim.errors import UserError

# op: gemm | gemm_fp8 (W8A8 fp8 GEMM, vLLM's CUTLASS scaled_mm) | gemm_nvfp4 (W4A4 NVFP4 GEMM) | linear (a model's projection, vidur per-layer) | attn_prefill | attn_decode |
#     allreduce | custom_allreduce (vLLM's custom all-reduce) | elementwise | overhead |
#     attn_prefill_<engine>[_fp8] / attn_decode_<engine>[_fp8kv]: an engine's own attention kernels
#     (``ENGINE_ATTN_OPS``; _fp8: FP8 context FMHA, _fp8kv: an fp8 KV cache)
SCHEMA: dict[str, pl.DataType] = {
    "gpu": pl.Utf8,           # simsrv GPU key (a100-80g, h100-sxm, ...) or a profile name
    "op": pl.Utf8,
    "detail": pl.Utf8,        # sub-operator (e.g. mlp_up_proj, input_layernorm, schedule)
    "model": pl.Utf8,         # model the shape came from, when any
    "m": pl.Int64,            # GEMM rows (tokens); elementwise tokens
    "n": pl.Int64,            # GEMM output width; elementwise row width
    "k": pl.Int64,            # GEMM reduction width
    "batch": pl.Int64,        # sequences (attention, overhead)
    "seq_tokens": pl.Int64,   # prefill: new tokens per sequence
    "context_tokens": pl.Int64,  # tokens already in the KV cache per sequence
    "num_heads": pl.Int64,    # query heads on the measured GPU
    "num_kv_heads": pl.Int64,
    "head_dim": pl.Int64,
    "tp": pl.Int64,           # tensor-parallel degree / GPUs in a collective
    "size_bytes": pl.Int64,   # collective message size
    "time_ms": pl.Float64,
    "source": pl.Utf8,
}

OPS = ("gemm", "gemm_fp8", "gemm_nvfp4", "linear", "attn_prefill", "attn_decode", "allreduce", "custom_allreduce", "elementwise",
       "overhead") + ENGINE_ATTN_OPS


def empty_frame() -> pl.DataFrame:
    return pl.DataFrame(schema=SCHEMA)


def conform(df: pl.DataFrame) -> pl.DataFrame:
    """Add missing schema columns as nulls and cast to the schema, in schema order."""
    cols = [pl.col(c).cast(t) if c in df.columns else pl.lit(None, dtype=t).alias(c) for c, t in SCHEMA.items()]
    return df.select(cols)


def read_profiles(path: Path) -> pl.DataFrame:
    """Every ``*.parquet`` under ``path`` (a file or a folder), concatenated and checked."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(path.rglob("*.parquet"))
    if not files:
        raise UserError(f"{path}: no kernel profile (*.parquet) found")
    frames = []
    for f in files:
        df = pl.read_parquet(f)
        missing = [c for c in ("gpu", "op", "time_ms", "source") if c not in df.columns]
        if missing:
            raise UserError(f"{f}: not a kernel profile, missing columns {', '.join(missing)}")
        frames.append(conform(df))
    return pl.concat(frames)
