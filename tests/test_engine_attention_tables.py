"""An engine's own measured attention kernels price its attention backend (issue 37: price engines
from measured kernels). TensorRT-LLM's XQA generation kernel and context FMHA, measured by
aiconfigurator-core 0.12.0 (kernels_profile/README.md), price the ``trtllm`` backend where the
GPU's calibration has them: a bf16 cache its bf16-KV table, an 8-bit cache its fp8-KV table,
FP8 context FMHA (fp8 quantization + fp8 KV on SM >= 89) its FP8 prefill table. Other backends
(FlashAttention, trtllm-mmha) keep the GPU's main tables exactly; a calibration without the
engine's tables prices ``trtllm`` as before."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pytest

from sim.core.batch import Batch
from sim.cost.calibration import ENGINE_ATTN_OPS, Calibration, load_calibration
from sim.cost.engine_profile import get_profile
from sim.cost.roofline import RooflineCostModel
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model

PROFILES = Path(__file__).resolve().parent.parent / "kernels_profile"


def _stripped(gpu: str) -> Calibration:
    """The GPU's calibration without any engine's own attention tables (today's pricing)."""
    raw = load_calibration(gpu).raw
    return Calibration({k: v for k, v in raw.items() if k not in ENGINE_ATTN_OPS})


def _cm(model, kv_bytes: int, backend: str, gpu: str = "h100-sxm", cal: Calibration | None = None,
        profile: str = "trt-llm") -> RooflineCostModel:
    g = get_gpu(gpu)
    m = get_model(model) if isinstance(model, str) else model
    return RooflineCostModel(m, g, 1, kv_bytes, engine=get_profile(profile, {"attention_backend": backend}),
                             calibration=cal or load_calibration(g.key))


def _decode_s(cm: RooflineCostModel, n: int, ctx: int) -> float:
    return cm.step_time(Batch(num_decode_seqs=n, decode_context_tokens=n * ctx, num_logits=n)).ops_s["attn_decode"]


def _measured_ms(gpu: str, op: str, **shape) -> float:
    d = pl.read_parquet(PROFILES / f"{gpu}.parquet").filter(pl.col("op") == op)
    for k, v in shape.items():
        d = d.filter(pl.col(k) == v)
    assert len(d) == 1, (op, shape, len(d))
    return float(d["time_ms"][0])


# Llama-3-8B: 32 query heads, 8 KV heads, head_dim 128 (a measured head configuration)
@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "b200"])
@pytest.mark.parametrize("n,ctx", [(64, 1024), (8, 4096), (256, 256)])
@pytest.mark.parametrize("kv_bytes,op", [(2, "attn_decode_trtllm"), (1, "attn_decode_trtllm_fp8kv")])
def test_trtllm_decode_is_its_measured_kernel(gpu, n, ctx, kv_bytes, op):
    """At a measured shape (batch, heads, context = cached step + the new token) a decode step's
    attention per layer is the XQA kernel's measured time (the table's node: one row, log
    efficiency rounded to 1e-5), and an 8-bit cache reads the fp8-KV table."""
    cm = _cm("llama-3-8b", kv_bytes, "trtllm", gpu)
    per_layer_ms = _decode_s(cm, n, ctx) / cm.model.num_layers * 1e3
    meas = _measured_ms(gpu, op, batch=n, num_heads=32, num_kv_heads=8, context_tokens=ctx - 1)
    assert per_layer_ms == pytest.approx(meas, rel=1e-3)
    # not vLLM's FlashAttention table (what priced it before)
    fa = _decode_s(_cm("llama-3-8b", kv_bytes, "trtllm", gpu, cal=_stripped(gpu)), n, ctx) / cm.model.num_layers * 1e3
    assert abs(fa / meas - 1) > 1e-3


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-80g"])
@pytest.mark.parametrize("s", [1024, 4096])
def test_trtllm_prefill_is_its_measured_context_fmha(gpu, s):
    """A lone prompt at a measured length and batch 1 costs the context FMHA's measured time per
    layer (bf16: no fp8 quantization)."""
    cm = _cm("llama-3-8b", 2, "trtllm", gpu)
    t = cm.step_time(Batch(prefill_chunks=((s, 0),), num_logits=1)).ops_s
    meas = _measured_ms(gpu, "attn_prefill_trtllm", batch=1, num_heads=32, num_kv_heads=8, seq_tokens=s)
    assert t["attn_prefill"] / cm.model.num_layers * 1e3 == pytest.approx(meas, rel=1e-3)


def test_fp8_context_fmha_only_with_fp8_quantization_fp8_kv_and_fp8_tensor_cores():
    """TensorRT-LLM's builder enables FP8 context FMHA with FP8 quantization and an fp8 KV cache on
    SM >= 89 (tensorrt_llm/builder.py): H100 fp8 + fp8 KV reads the FP8 table, at the FP8 peak;
    bf16 weights with an fp8 cache, or A100 (no FP8 tensor cores), read the bf16 context table."""
    m8 = dataclasses.replace(get_model("llama-3-8b"), quantization="fp8")
    h = _cm(m8, 1, "trtllm")
    assert h.cops.prefill_op == "attn_prefill_trtllm_fp8" and h._prefill_peak == get_gpu("h100-sxm").fp8_flops_per_s
    assert _cm("llama-3-8b", 1, "trtllm").cops.prefill_op == "attn_prefill_trtllm"
    assert _cm(m8, 2, "trtllm").cops.prefill_op == "attn_prefill_trtllm"
    a = _cm(m8, 1, "trtllm", "a100-80g")
    assert a.cops.prefill_op == "attn_prefill_trtllm" and a.cops.decode_op == "attn_decode_trtllm"
    # an 8-bit cache without an fp8-KV table: the bf16 table at the context of equal bytes
    assert a._kv_scale == 0.5 and h._kv_scale == 1.0


def _steps(cm: RooflineCostModel) -> list[float]:
    out = []
    for n, ctx in ((1, 17), (8, 1000), (64, 2048), (300, 700)):
        out.append(cm.step_time(Batch(num_decode_seqs=n, decode_context_tokens=n * ctx, num_logits=n)).total_s)
    for s, x in ((512, 0), (2048, 0), (256, 1024)):
        out.append(cm.step_time(Batch(prefill_chunks=((s, x),),
                                      num_logits=1)).total_s)
    return out


@pytest.mark.parametrize("gpu,backend,profile", [
    (g, b, p) for g in ("h100-sxm", "a100-80g", "l40s") for b, p in (("flash-attn", "vllm-v1"), ("trtllm-mmha", "trt-llm-2023"))
] + [("h100-sxm", "flashinfer", "sglang"), ("h200", "flashinfer", "sglang"), ("a100-80g", "flashinfer", "sglang")])
@pytest.mark.parametrize("kv_bytes", [2, 1])
def test_other_backends_unchanged(gpu, backend, profile, kv_bytes):
    """Backends without their own tables, and FlashInfer on GPUs where no FlashInfer kernel was
    measured (SGLang's H100/H200 rows time its FA3 backend, A100's its flash_attention one), price
    every step exactly as with no engine tables."""
    for model in ("llama-3-8b", "llama-2-7b"):
        new = _cm(model, kv_bytes, backend, gpu, profile=profile)
        old = _cm(model, kv_bytes, backend, gpu, cal=_stripped(gpu), profile=profile)
        assert _steps(new) == _steps(old)


@pytest.mark.parametrize("kv_bytes", [2, 1])
def test_trtllm_without_its_tables_falls_back(kv_bytes):
    """A calibration without TensorRT-LLM's tables (a GPU where they are not measured, or a
    user's own profile) prices ``trtllm`` on the main tables as before: as FlashAttention's grouped
    tile (both fold a query group into one tile), without FA2's combine kernel on Hopper."""
    cal = _stripped("h100-sxm")
    trt = _cm("llama-3-8b", kv_bytes, "trtllm", cal=cal)
    fa = _cm("llama-3-8b", kv_bytes, "flash-attn", cal=cal)
    assert trt.cops.decode_op == "attn_decode" and trt.cops.prefill_op == "attn_prefill"
    for n, ctx in ((1, 17), (64, 2048), (300, 700)):
        assert _decode_s(trt, n, ctx) == _decode_s(fa, n, ctx)
    # and where it has them, it is priced differently
    assert _decode_s(_cm("llama-3-8b", kv_bytes, "trtllm"), 64, 2048) != _decode_s(trt, 64, 2048)


def test_calibrate_reports_held_out_error_per_engine_table():
    """``simsrv calibrate``'s held-out table has a row per engine table (one head configuration
    of L40S's rows here, the GPU with every engine table, to stay fast)."""
    from sim.cost.validate import heldout_table
    d = pl.read_parquet(PROFILES / "l40s.parquet").filter((pl.col("num_heads") == 32) & (pl.col("num_kv_heads") == 8))
    rows = {r["op"]: r for r in heldout_table(d, get_gpu("l40s"), ops=ENGINE_ATTN_OPS)}
    assert set(rows) == set(ENGINE_ATTN_OPS)
    for r in rows.values():
        assert r["rows_held_out"] > 0 and r["median_pct"] is not None and r["median_pct"] < 25


@pytest.mark.parametrize("gpu", ["l40s", "b200"])
@pytest.mark.parametrize("kv_bytes,op", [(2, "attn_decode_flashinfer"), (1, "attn_decode_flashinfer_fp8kv")])
def test_flashinfer_decode_is_its_measured_kernel(gpu, kv_bytes, op):
    """SGLang's FlashInfer decode rows (kernel_source flashinfer) price the ``flashinfer``
    backend: at a measured shape (32 query / 2 KV heads: measured on both GPUs) a decode step's
    attention per layer is the measured time; an 8-bit cache reads the fp8-KV table."""
    model = dataclasses.replace(get_model("llama-3-8b"), num_kv_heads=2)
    cm = _cm(model, kv_bytes, "flashinfer", gpu, profile="sglang")
    assert cm.cops.decode_op == op
    for n, ctx in ((16, 16384), (64, 4096)):  # caches of 268 MB (16-bit): beyond L2, fitted (not left out)
        per_layer_ms = _decode_s(cm, n, ctx) / cm.model.num_layers * 1e3
        meas = _measured_ms(gpu, op, batch=n, num_heads=32, num_kv_heads=2, context_tokens=ctx - 1)
        assert per_layer_ms == pytest.approx(meas, rel=1e-3)


@pytest.mark.parametrize("backend,profile", [("trtllm", "trt-llm"), ("flashinfer", "sglang")])
@pytest.mark.parametrize("kv_bytes", [2, 1])
def test_mla_models_keep_the_main_tables(backend, profile, kv_bytes):
    """The engine tables time MHA/GQA kernels; an MLA model (DeepSeek-V3's 576-wide latent) runs
    other kernels and keeps today's pricing (with them, DeepSeek-R1 on B200 decoded 10x slower)."""
    for gpu in ("b200", "h100-sxm"):
        new = _cm("deepseek-v3", kv_bytes, backend, gpu, profile=profile)
        old = _cm("deepseek-v3", kv_bytes, backend, gpu, cal=_stripped(gpu), profile=profile)
        assert new.cops.decode_op == "attn_decode" and new.cops.prefill_op == "attn_prefill"
        assert _steps(new) == _steps(old)
