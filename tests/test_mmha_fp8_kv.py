"""TensorRT-LLM's pre-XQA masked multi-head attention (trtllm-mmha) is priced at the kernel's own
shape: one thread block per (sequence, query head) (decoderMaskedMultiheadAttentionLaunch.h:
grid {num_heads, batch}), each streaming its KV head's cache with loads sized by the compute
type, whatever the cache's (decoderMaskedMultiheadAttentionTemplate.h: K_VEC_SIZE = 16 /
sizeof(T); an 8-bit cache's K_vec_m packs as many elements). So its calibrated efficiency is
the MHA kernel's at batch x query heads, at the context (keys per block) itself; it used to be
looked up as FlashAttention-2's grouped tile at a context stretched by the re-reads (Falcon-180B
TP8 on H100: 59% of the bandwidth bound at any context), and an 8-bit cache at half its keys
(Llama-2-7B at 128-256 cached tokens: 35-65%)."""

from __future__ import annotations

import dataclasses

import pytest

from sim.core.batch import Batch
from sim.cost.calibration import load_calibration
from sim.cost.engine_profile import get_profile
from sim.cost.roofline import RooflineCostModel
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model


def _cm(model, kv_bytes: int, backend: str = "trtllm-mmha", gpu: str = "h100-sxm", tp: int = 1) -> RooflineCostModel:
    g = get_gpu(gpu)
    m = get_model(model) if isinstance(model, str) else model
    return RooflineCostModel(m, g, tp, kv_bytes, engine=get_profile("trt-llm-2023", {"attention_backend": backend}),
                             calibration=load_calibration(g.key))


def _attn_s(cm: RooflineCostModel, n: int, ctx: int) -> float:
    return cm.step_time(Batch(num_decode_seqs=n, decode_context_tokens=n * ctx, num_logits=n)).ops_s["attn_decode"]


def _mha_twin(name: str):
    """The model with one KV head per query head (same layers, widths and head size)."""
    m = get_model(name)
    return dataclasses.replace(m, num_kv_heads=m.num_heads)


@pytest.mark.parametrize("model,gpu,tp", [("llama-2-70b", "h100-sxm", 4), ("llama-2-70b", "h200", 1),
                                          ("falcon-180b", "h100-sxm", 8)])
@pytest.mark.parametrize("n", [64, 480, 1024])
def test_gqa_under_mmha_costs_what_its_mha_twin_costs(model, gpu, tp, n):
    """With an 8-bit cache each query head's block streams its KV head's whole cache from HBM:
    a GQA model's decode attention is its MHA twin's (same blocks, same bytes, same FLOPs), at
    every batch and context; not FA2's grouped tile at a stretched context."""
    gqa, mha = _cm(model, 1, gpu=gpu, tp=tp), _cm(_mha_twin(model), 1, gpu=gpu, tp=tp)
    assert gqa.decode_kv_reads > 1 and mha.decode_kv_reads == 1
    for ctx in (128, 1152, 2176, 4096):
        assert _attn_s(gqa, n, ctx) == pytest.approx(_attn_s(mha, n, ctx), rel=1e-9)


def _bound_s(cm: RooflineCostModel, n: int, ctx: int) -> float:
    """Decode attention's roofline bound over all layers (vendor peaks), as decode_work counts it."""
    kv = n * ctx * cm.kv_layer_bytes * cm.decode_kv_reads + 2 * n * cm.q_dim * cm.dtype_bytes
    flops = n * ctx * cm._decode_pair_flops
    return cm.model.num_layers * max(flops / cm.gpu.bf16_flops_per_s, kv / cm.gpu.hbm_bw_bytes_per_s)


@pytest.mark.parametrize("model,tp", [("llama-2-7b", 1), ("llama-2-70b", 4)])
@pytest.mark.parametrize("n", [80, 768])
def test_mmha_8bit_cache_keeps_the_efficiency_of_its_key_count(model, tp, n):
    """An 8-bit cache moves half the bytes in the same loads, iterations and blocks as a 16-bit
    one: at every context its efficiency against the bound is the 16-bit cache's (it used to be
    the 16-bit one's at half the context: at short contexts, latency bound, an 8-bit step cost
    what a 16-bit one did)."""
    fp8, bf16 = _cm(model, 1, tp=tp), _cm(model, 2, tp=tp)
    for ctx in (128, 192, 256, 512, 2048):
        eff8 = _bound_s(fp8, n, ctx) / _attn_s(fp8, n, ctx)
        eff16 = _bound_s(bf16, n, ctx) / _attn_s(bf16, n, ctx)
        assert eff8 == pytest.approx(eff16, rel=1e-9)


def test_grouped_tile_kernels_keep_the_equal_bytes_lookup():
    """XQA (trtllm) folds a query-head group into one tile: looked up at the model's own KV
    heads, an 8-bit cache at the context of equal bytes where no table measured it (a calibration
    without TensorRT-LLM's own tables: tests/test_engine_attention_tables.py covers those); a GQA
    model is not its MHA twin."""
    from sim.cost.calibration import ENGINE_ATTN_OPS, Calibration
    raw = load_calibration("h100-sxm").raw
    cal = Calibration({k: v for k, v in raw.items() if k not in ENGINE_ATTN_OPS})
    g = get_gpu("h100-sxm")
    eng = get_profile("trt-llm-2023", {"attention_backend": "trtllm"})
    xqa8, xqa16 = (RooflineCostModel(get_model("llama-2-70b"), g, 1, b, engine=eng, calibration=cal) for b in (1, 2))
    twin = RooflineCostModel(_mha_twin("llama-2-70b"), g, 1, 1, engine=eng, calibration=cal)
    assert _attn_s(xqa8, 256, 2048) == pytest.approx(_attn_s(xqa16, 256, 1024), rel=0.02)
    assert _attn_s(twin, 256, 2048) > 4 * _attn_s(xqa8, 256, 2048)
