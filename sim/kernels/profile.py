"""``simsrv profile``: time the calibration's operator grid with PyTorch on this machine.

Why: a user's own GPU has no public profile; measuring the same grid (GEMMs over (m, n, k),
prefill attention over (chunk, context), decode attention over (batch, context), all-reduce
with more than one GPU) in the schema of ``kernels_profile/`` makes it ready for
``simsrv calibrate``. On CUDA, kernels are timed with CUDA events after warm-up, median of
repeats; on CPU with ``time.perf_counter``. PyTorch is the optional extra ``simsrv[profile]``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from sim.errors import UserError
from sim.kernels.schema import conform


@dataclass(frozen=True)
class Grid:
    gemm_m: tuple[int, ...] = (1, 8, 32, 128, 512, 2048, 8192)
    gemm_nk: tuple[int, ...] = (1024, 4096, 8192, 14336)
    prefill_chunk: tuple[int, ...] = (128, 512, 2048, 8192)
    prefill_context: tuple[int, ...] = (0, 2048)
    decode_batch: tuple[int, ...] = (1, 8, 32, 128)
    decode_context: tuple[int, ...] = (128, 1024, 4096, 16384)
    heads: tuple[int, int] = (32, 8)   # query heads, KV heads (Llama-3-8B per GPU at TP 1)
    head_dim: int = 128
    allreduce_bytes: tuple[int, ...] = (2 ** 14, 2 ** 18, 2 ** 22, 2 ** 26)
    warmup: int = 3
    repeats: int = 10


TINY = Grid(gemm_m=(1, 16, 64), gemm_nk=(64, 128), prefill_chunk=(8, 16, 32, 64), prefill_context=(0, 32),
            decode_batch=(1, 4), decode_context=(16, 64), heads=(4, 2), head_dim=16,
            allreduce_bytes=(1024,), warmup=1, repeats=3)


def _torch():
    try:
        import torch
    except ImportError as e:
        raise UserError("simsrv profile needs PyTorch: pip install 'simsrv[profile]'") from e
    return torch


def _timer(torch, device):
    def run(fn, warmup: int, repeats: int) -> float:
        """Median milliseconds of ``fn`` after ``warmup`` calls."""
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    return run


def profile(gpu: str, grid: Grid = Grid(), device: str | None = None) -> pl.DataFrame:
    """Rows of the kernels_profile schema measured on ``device`` (default: CUDA if present)."""
    torch = _torch()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    source = f"simsrv profile ({name}, torch {torch.__version__}, {str(dtype).replace('torch.', '')})"
    timed = _timer(torch, dev)
    rows = []
    for m in grid.gemm_m:
        for n in grid.gemm_nk:
            for k in grid.gemm_nk:
                x = torch.randn(m, k, device=dev, dtype=dtype)
                w = torch.randn(k, n, device=dev, dtype=dtype)
                rows.append(dict(op="gemm", m=m, n=n, k=k, time_ms=timed(lambda: x @ w, grid.warmup, grid.repeats)))
    h, kvh = grid.heads
    d = grid.head_dim
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for c in grid.prefill_chunk:
        for ctx in grid.prefill_context:
            q = torch.randn(1, h, c, d, device=dev, dtype=dtype)
            kv = torch.randn(1, h, c + ctx, d, device=dev, dtype=dtype)  # GQA heads expanded, as SDPA needs
            # Causal over the chunk, full over the cached context: the mask of a chunk after ctx tokens.
            mask = torch.ones(c, c + ctx, device=dev, dtype=torch.bool).tril(diagonal=ctx)
            t = timed(lambda: sdpa(q, kv, kv, attn_mask=mask), grid.warmup, grid.repeats)
            rows.append(dict(op="attn_prefill", batch=1, seq_tokens=c, context_tokens=ctx, num_heads=h,
                             num_kv_heads=kvh, head_dim=d, time_ms=t))
    for b in grid.decode_batch:
        for ctx in grid.decode_context:
            q = torch.randn(b, h, 1, d, device=dev, dtype=dtype)
            kv = torch.randn(b, h, ctx, d, device=dev, dtype=dtype)
            t = timed(lambda: sdpa(q, kv, kv), grid.warmup, grid.repeats)
            # context_tokens: tokens already cached; the new token makes ctx attended in all.
            rows.append(dict(op="attn_decode", batch=b, seq_tokens=1, context_tokens=ctx - 1, num_heads=h,
                             num_kv_heads=kvh, head_dim=d, time_ms=t))
    if dev.type == "cuda" and torch.cuda.device_count() > 1:
        rows += _allreduce_rows(torch, grid)
    return conform(pl.DataFrame(rows).with_columns(gpu=pl.lit(gpu), source=pl.lit(source),
                                                   detail=pl.lit("torch")))


def _allreduce_rows(torch, grid: Grid) -> list[dict]:
    """NOTE: needs torch.distributed with one process per GPU (torchrun); a single process
    cannot time NCCL all-reduce across GPUs, so the collective is left to the shipped tables."""
    return []


def write_profile(df: pl.DataFrame, out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{df['gpu'][0]}.parquet"
    from sim.files.atomic import atomic_path

    with atomic_path(path) as tmp:
        df.write_parquet(tmp, compression="zstd")
    return path
