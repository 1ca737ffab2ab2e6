"""Normalise the public kernel measurements into ``kernels_profile/<gpu>.parquet``.

Why: the raw sources (vidur, aiconfigurator, Frontier; provenance and licenses in
``kernels_profile/README.md``) use five schemas and three units; calibration reads one.
This is a developer tool run once over a copy of the sources
(``python -m sim.kernels.ingest SRC_DIR kernels_profile/``); simsrv never reads SRC_DIR at run time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

from sim.kernels.schema import conform

AIC_GPUS = {"a100_sxm": "a100-80g", "h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200",
            "l40s": "l40s"}
VIDUR_GPUS = {"a100": "a100-80g", "h100": "h100-sxm"}
LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEM_OPS = ("input_layernorm", "post_attention_layernorm", "add", "attn_rope", "mlp_act")
OVERHEAD_PARTS = ("schedule", "sampler_e2e", "prepare_inputs_e2e", "process_model_outputs")


def _one(folder: Path, name: str) -> Path:
    hits = sorted(folder.rglob(name))
    if len(hits) != 1:
        raise FileNotFoundError(f"{folder}: expected one {name}, found {len(hits)}")
    return hits[0]


def aiconfigurator(src: Path) -> list[pl.DataFrame]:
    out = []
    for folder, gpu in AIC_GPUS.items():
        root = src / "aiconfigurator" / folder
        tag = lambda p: f"aiconfigurator/{folder}/" + "/".join(p.relative_to(root).parts[:3])  # noqa: E731
        f = _one(root / "gemm", "gemm_perf.parquet")
        g = pl.read_parquet(f).filter(pl.col("gemm_dtype") == "bfloat16")
        out.append(conform(g.select("m", "n", "k", pl.col("latency").alias("time_ms"))
                           .with_columns(gpu=pl.lit(gpu), op=pl.lit("gemm"), source=pl.lit(tag(f)))))
        # fp8 W8A8 (per-tensor scales, vLLM CutlassFP8ScaledMMLinearKernel) where measured (not A100)
        g8 = pl.read_parquet(f).filter(pl.col("gemm_dtype") == "fp8")
        if len(g8):
            out.append(conform(g8.select("m", "n", "k", pl.col("latency").alias("time_ms"))
                               .with_columns(gpu=pl.lit(gpu), op=pl.lit("gemm_fp8"), detail=pl.lit("fp8"),
                                             source=pl.lit(tag(f)))))
        # NVFP4 W4A4 (vLLM FlashInferCuteDslNvFp4LinearKernel: NVFP4 weights and activations, one
        # E4M3 scale per 16 values, bf16 out) where measured (B200)
        g4 = pl.read_parquet(f).filter(pl.col("gemm_dtype") == "nvfp4")
        if len(g4):
            out.append(conform(g4.select("m", "n", "k", pl.col("latency").alias("time_ms"))
                               .with_columns(gpu=pl.lit(gpu), op=pl.lit("gemm_nvfp4"), detail=pl.lit("nvfp4"),
                                             source=pl.lit(tag(f)))))
        for kind, op in (("context", "attn_prefill"), ("generation", "attn_decode")):
            f = _one(root / "attention", f"{kind}_attention_perf.parquet")
            a = pl.read_parquet(f).filter((pl.col("head_dim") == 128) & (pl.col("kv_cache_dtype") == "bfloat16"))
            if "window_size" in a.columns:
                a = a.filter(pl.col("window_size") == 0)
            # One kernel per GPU: the one vLLM picks by default there (most rows), e.g. FA3 on Hopper.
            kern = a.group_by("kernel_source").len().sort("len", descending=True)["kernel_source"][0]
            a = a.filter(pl.col("kernel_source") == kern)
            seq = pl.col("isl") if op == "attn_prefill" else pl.lit(1)
            ctx = pl.lit(0) if op == "attn_prefill" else pl.col("step")
            out.append(conform(a.select(
                pl.col("batch_size").alias("batch"), seq.alias("seq_tokens"), ctx.alias("context_tokens"),
                pl.col("num_heads"), pl.col("num_key_value_heads").alias("num_kv_heads"), "head_dim",
                pl.col("latency").alias("time_ms"), pl.col("kernel_source").alias("detail"),
            ).with_columns(gpu=pl.lit(gpu), op=pl.lit(op), source=pl.lit(tag(f)))))
        f = _one(root / "comm" / "nccl", "nccl_perf.parquet")
        c = pl.read_parquet(f).filter((pl.col("op_name") == "all_reduce") & (pl.col("nccl_dtype") == "half"))
        # message_size is in elements (SOURCES.md section 4); half = 2 bytes.
        out.append(conform(c.select(pl.col("num_gpus").alias("tp"), (pl.col("message_size") * 2).alias("size_bytes"),
                                    pl.col("latency").alias("time_ms"))
                           .with_columns(gpu=pl.lit(gpu), op=pl.lit("allreduce"), detail=pl.lit("nccl"),
                                         source=pl.lit(tag(f)))))
        # vLLM's custom all-reduce, timed under CUDA graphs (how vLLM runs it); L40S has none.
        hits = sorted((root / "comm").rglob("custom_allreduce_perf.parquet"))
        if hits:
            f = hits[0]
            c = pl.read_parquet(f).filter((pl.col("backend") == "vllm_graph") & (pl.col("allreduce_dtype") == "bfloat16"))
            out.append(conform(c.select(pl.col("num_gpus").alias("tp"), (pl.col("message_size") * 2).alias("size_bytes"),
                                        pl.col("latency").alias("time_ms"))
                               .with_columns(gpu=pl.lit(gpu), op=pl.lit("custom_allreduce"), detail=pl.lit("vllm_graph"),
                                             source=pl.lit(tag(f)))))
    return out


# aiconfigurator-core's engine attention tables (``aiconfigurator_core-<v>`` wheel, package data
# ``systems/data/<gpu>/attention/<framework>/<version>/``): (framework, kind, attn_dtype,
# kv_cache_dtype, kernel_source or None for any) -> op. TensorRT-LLM's generation rows time its
# XQA decode kernel; the context rows its context FMHA, bf16, and FP8 (attn_dtype fp8, with an
# fp8 KV cache: FP8 context FMHA). SGLang's rows time the attention backend its collector built,
# logged as ``kernel_source`` (ai-dynamo/aiconfigurator collector/sglang/collect_attn.py:
# ``kernel_source=attn_backend_name``): only the rows of its FlashInfer backend (L40S; part of
# B200's grid) measure FlashInfer; H100/H200 rows are SGLang's FA3 backend, A100's its
# flash_attention backend, B200's others its TRT-LLM MHA backend, so they are not FlashInfer's.
ENGINE_ATTN = {("trtllm", "context", "bfloat16", "bfloat16", None): "attn_prefill_trtllm",
               ("trtllm", "context", "fp8", "fp8", None): "attn_prefill_trtllm_fp8",
               ("trtllm", "generation", "bfloat16", "bfloat16", None): "attn_decode_trtllm",
               ("trtllm", "generation", "bfloat16", "fp8", None): "attn_decode_trtllm_fp8kv",
               ("sglang", "context", "bfloat16", "bfloat16", "flashinfer"): "attn_prefill_flashinfer",
               ("sglang", "generation", "bfloat16", "bfloat16", "flashinfer"): "attn_decode_flashinfer",
               ("sglang", "generation", "bfloat16", "fp8", "flashinfer"): "attn_decode_flashinfer_fp8kv"}
CORE_TAG = "aiconfigurator-core"


def aiconfigurator_core(data: Path, version: str) -> list[pl.DataFrame]:
    """Engine attention tables of the aiconfigurator-core wheel's data folder ``data``
    (``<gpu>/attention/<framework>/<version>/``): head_dim 128, no sliding window, beam 1, as the
    vLLM tables; latency in ms (the same unit as the vLLM tables: FA3 and TensorRT-LLM agree
    within ~10% at the shapes both measure on H100). Source tag
    ``aiconfigurator-core/<version>/<gpu>/attention/<framework>/<framework version>``."""
    out = []
    for folder, gpu in AIC_GPUS.items():
        for (fw, kind, adt, kdt, kern), op in ENGINE_ATTN.items():
            for f in sorted((data / folder / "attention" / fw).glob(f"*/{kind}_attention_perf.parquet")):
                a = pl.read_parquet(f).filter((pl.col("head_dim") == 128) & (pl.col("beam_width") == 1)
                                              & (pl.col("attn_dtype") == adt) & (pl.col("kv_cache_dtype") == kdt))
                if "window_size" in a.columns:
                    a = a.filter(pl.col("window_size") == 0)
                if kern is not None:
                    a = a.filter(pl.col("kernel_source") == kern)
                if a.is_empty():
                    continue
                seq = pl.col("isl") if kind == "context" else pl.lit(1)
                ctx = pl.lit(0) if kind == "context" else pl.col("step")
                tag = f"{CORE_TAG}/{version}/{folder}/attention/{fw}/{f.parent.name}"
                out.append(conform(a.select(
                    pl.col("batch_size").alias("batch"), seq.alias("seq_tokens"), ctx.alias("context_tokens"),
                    pl.col("num_heads"), pl.col("num_key_value_heads").alias("num_kv_heads"), "head_dim",
                    pl.col("latency").alias("time_ms"), (pl.lit(f"{fw}_{kind}_{adt}_{kdt}_") + pl.col("kernel_source")).alias("detail"),
                ).with_columns(gpu=pl.lit(gpu), op=pl.lit(op), source=pl.lit(tag))))
    return out


def _write(allrows: pl.DataFrame, dest: Path) -> dict[str, int]:
    dest.mkdir(parents=True, exist_ok=True)
    counts = {}
    for gpu in sorted(allrows["gpu"].unique().to_list()):
        part = allrows.filter(pl.col("gpu") == gpu).sort("op", "source", "detail", "model", "m", "n", "k", "batch",
                                                        "seq_tokens", "context_tokens", "num_heads", "num_kv_heads",
                                                        "tp", "size_bytes", nulls_last=True)
        part.write_parquet(dest / f"{gpu}.parquet", compression="zstd", compression_level=19, statistics=False)
        counts[gpu] = len(part)
    return counts


def add_core(data: Path, version: str, dest: Path) -> dict[str, int]:
    """``dest``'s profiles with their aiconfigurator-core rows replaced by ``data``'s
    (``aiconfigurator_core``); the other sources' rows unchanged."""
    old = pl.concat([pl.read_parquet(f) for f in sorted(dest.glob("*.parquet"))])
    old = old.filter(~pl.col("source").str.starts_with(CORE_TAG + "/"))
    new = pl.concat(aiconfigurator_core(data, version)).filter(pl.col("time_ms") > 0)
    return _write(pl.concat([old, new]), dest)


def _vidur_layers(f: Path, gpu: str, model: str, source: str) -> list[pl.DataFrame]:
    d = pl.read_csv(f)
    # num_tokens 2048/4096 appear twice per TP degree (SOURCES.md 1a): keep the mean.
    keys = ["num_tokens", "num_tensor_parallel_workers", "n_head", "n_kv_head", "n_embd", "n_expanded_embd",
            "use_gated_mlp"]
    med = [c for c in d.columns if c.startswith("time_stats.") and c.endswith(".median")]
    d = d.group_by(keys).agg([pl.col(c).mean() for c in med])
    out = []
    for r_op in LINEAR_OPS + ELEM_OPS:
        col = f"time_stats.{r_op}.median"
        if col not in d.columns:
            continue
        tp = pl.col("num_tensor_parallel_workers")
        hd = pl.col("n_embd") // pl.col("n_head")
        q = pl.col("n_embd") // tp
        kv = pl.max_horizontal(pl.col("n_kv_head") // tp, pl.lit(1)) * hd
        inter = pl.col("n_expanded_embd") // tp
        gated = pl.col("use_gated_mlp").cast(pl.Boolean)
        # (n, k) of x[m, k] @ W[k, n] per GPU (Megatron sharding), or the row width of an elementwise op.
        n, k = {
            "attn_pre_proj": (q + 2 * kv, pl.col("n_embd")),
            "attn_post_proj": (pl.col("n_embd"), q),
            "mlp_up_proj": (pl.when(gated).then(2 * inter).otherwise(inter), pl.col("n_embd")),
            "mlp_down_proj": (pl.col("n_embd"), inter),
            "input_layernorm": (pl.col("n_embd"), None), "post_attention_layernorm": (pl.col("n_embd"), None),
            "add": (pl.col("n_embd"), None), "attn_rope": (q + kv, None),
            "mlp_act": (pl.when(gated).then(inter).otherwise(inter), None),
        }[r_op]
        op = "linear" if r_op in LINEAR_OPS else "elementwise"
        detail = pl.lit(r_op) if r_op != "mlp_act" else pl.when(gated).then(pl.lit("mlp_act_gated")).otherwise(pl.lit("mlp_act"))
        sel = d.select(pl.col("num_tokens").alias("m"), n.alias("n"),
                       (k if k is not None else pl.lit(None, pl.Int64)).alias("k"),
                       tp.alias("tp"), pl.col("n_head").alias("num_heads"), pl.col("n_kv_head").alias("num_kv_heads"),
                       pl.col(col).alias("time_ms"), detail.alias("detail"))
        out.append(conform(sel.with_columns(gpu=pl.lit(gpu), op=pl.lit(op), model=pl.lit(model), source=pl.lit(source))))
    return out


def vidur(src: Path) -> list[pl.DataFrame]:
    out = []
    for vg, gpu in VIDUR_GPUS.items():
        root = src / "vidur" / "compute" / vg
        for f in sorted(root.rglob("mlp.csv")):
            model = "/".join(f.parent.relative_to(root).parts)
            out += _vidur_layers(f, gpu, model, f"vidur/compute/{vg}/{model}/mlp.csv")
    f = src / "vidur" / "legacy" / "a100" / "cpu_overheads.csv"
    d = pl.read_csv(f)
    for part in OVERHEAD_PARTS:
        out.append(conform(d.select(pl.col("batch_size").alias("batch"), pl.col("tensor_parallel_degree").alias("tp"),
                                    pl.col("model_name").alias("model"), pl.col(f"{part}_median").alias("time_ms"))
                           .with_columns(gpu=pl.lit("a100-80g"), op=pl.lit("overhead"), detail=pl.lit(part),
                                         source=pl.lit("vidur/legacy/a100/cpu_overheads.csv"))))
    return out


def frontier(src: Path) -> list[pl.DataFrame]:
    """Llama-2-7B attention on A800 (an A100-80GB with NVLink cut: same SMs and HBM)."""
    f = src / "frontier" / "compute" / "a800" / "meta-llama" / "Llama-2-7b-hf" / "attention.csv"
    d = pl.read_csv(f)
    base = dict(num_heads=pl.col("n_q_head"), num_kv_heads=pl.col("n_kv_head"),
                head_dim=pl.col("n_embd") // pl.col("n_q_head"), tp=pl.col("num_tensor_parallel_workers"))
    pre = d.filter(pl.col("is_prefill")).select(
        batch=pl.col("batch_size"), seq_tokens=pl.col("prefill_chunk_size"), context_tokens=pl.col("kv_cache_size"),
        time_ms=pl.col("time_stats.attn_prefill.median"), **base).with_columns(op=pl.lit("attn_prefill"))
    dec = d.filter(~pl.col("is_prefill")).select(
        batch=pl.col("batch_size"), seq_tokens=pl.lit(1), context_tokens=pl.col("kv_cache_size"),
        time_ms=pl.col("time_stats.attn_decode.median"), **base).with_columns(op=pl.lit("attn_decode"))
    tag = "frontier/compute/a800/meta-llama/Llama-2-7b-hf/attention.csv"
    return [conform(x.with_columns(gpu=pl.lit("a100-80g"), model=pl.lit("meta-llama/Llama-2-7b-hf"),
                                   detail=pl.lit("flashinfer"), source=pl.lit(tag))) for x in (pre, dec)]


def ingest(src: Path, dest: Path) -> dict[str, int]:
    frames = aiconfigurator(src) + vidur(src) + frontier(src)
    return _write(pl.concat(frames).filter(pl.col("time_ms") > 0), dest)


if __name__ == "__main__":
    # python -m sim.kernels.ingest SRC_DIR DEST_DIR, then
    # python -m sim.kernels.ingest --core VERSION DATA_DIR DEST_DIR (aiconfigurator-core's tables)
    if len(sys.argv) == 5 and sys.argv[1] == "--core":
        counts = add_core(Path(sys.argv[3]), sys.argv[2], Path(sys.argv[4]))
    elif len(sys.argv) == 3:
        counts = ingest(Path(sys.argv[1]), Path(sys.argv[2]))
    else:
        sys.exit("usage: python -m sim.kernels.ingest SRC_DIR DEST_DIR | --core VERSION DATA_DIR DEST_DIR")
    for g, n in counts.items():
        print(f"{g}: {n:,} rows")
