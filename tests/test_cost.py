"""Roofline cost model: regimes, scaling, and exactness of fast-forwarded runs."""

import pytest

from sim.core.batch import Batch
from sim.cost.roofline import OPS, RooflineCostModel
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model


@pytest.fixture
def cm():
    return RooflineCostModel(get_model("llama-3-8b"), get_gpu("h100-sxm"), 1)


def test_breakdown_has_every_operator(cm):
    c = cm.step_time(Batch(num_decode_seqs=4, decode_context_tokens=4000, prefill_chunks=((256, 0),), num_logits=5))
    assert tuple(c.ops_s) == OPS
    assert all(v > 0 for k, v in c.ops_s.items() if k != "allreduce")
    assert c.ops_s["allreduce"] == 0.0  # no TP


def test_batch1_decode_is_bandwidth_bound(cm):
    """Batch-1 decode reads every weight but the embedding table (only one row of it is
    looked up): 15 GB at 3.35 TB/s x 0.8 is 5.6 ms in the GEMMs and LM head; KV, norms and
    sampling add their launch floors (2 us per kernel)."""
    c = cm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=1000, num_logits=1))
    m = get_model("llama-3-8b")
    floor_s = (m.num_params - m.embedding_params) * 2 / 3.35e12
    assert c.total_s > floor_s
    gemm = sum(c.ops_s[k] for k in ("gemm_qkv", "gemm_o", "gemm_mlp_up", "gemm_mlp_down", "lm_head"))
    assert gemm == pytest.approx(floor_s / 0.8, rel=0.02)
    assert c.total_s - c.ops_s["overhead"] < 1.15 * floor_s / 0.8  # 225 elementwise kernels: +0.45 ms


def test_decode_batching_is_nearly_free_until_kv_dominates(cm):
    one = cm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=512, num_logits=1)).total_s
    many = cm.step_time(Batch(num_decode_seqs=64, decode_context_tokens=64 * 512, num_logits=64)).total_s
    assert many < 1.5 * one  # 64x the tokens for < 1.5x the time


def test_prefill_is_compute_bound_and_linear(cm):
    """Prefill GEMM time at 4096 tokens ~ 2 * params * tokens / (peak * eff)."""
    c = cm.step_time(Batch(prefill_chunks=((4096, 0),), num_logits=1)).ops_s
    gemm = c["gemm_qkv"] + c["gemm_o"] + c["gemm_mlp_up"] + c["gemm_mlp_down"]
    m = get_model("llama-3-8b")
    layer_params = m.num_layers * (m.attn_params_per_layer + m.mlp_params_per_layer)
    assert gemm == pytest.approx(2 * layer_params * 4096 / (989e12 * 0.85), rel=0.01)
    t2 = cm.step_time(Batch(prefill_chunks=((2048, 0),), num_logits=1)).ops_s
    assert (t2["gemm_mlp_up"] / c["gemm_mlp_up"]) == pytest.approx(0.5, rel=0.01)


def test_causal_prefill_attention_is_quadratic(cm):
    a = cm.step_time(Batch(prefill_chunks=((8192, 0),))).ops_s["attn_prefill"]
    b = cm.step_time(Batch(prefill_chunks=((4096, 0),))).ops_s["attn_prefill"]
    assert a / b == pytest.approx(4.0, rel=0.01)
    # a chunk after 4096 cached tokens attends to all of them: 3x the pairs of the first chunk
    c = cm.step_time(Batch(prefill_chunks=((4096, 4096),))).ops_s["attn_prefill"]
    assert c / b == pytest.approx(3.0, rel=0.01)


def test_run_of_k_steps_equals_sum_of_single_steps(cm):
    """A fast-forwarded run is exact: step time is affine in the growing decode context."""
    b, ctx, k = 37, 37 * 700, 50
    total = cm.step_time(Batch(num_decode_seqs=b, decode_context_tokens=ctx, num_logits=b, num_steps=k)).total_s
    singles = sum(cm.step_time(Batch(num_decode_seqs=b, decode_context_tokens=ctx + j * b, num_logits=b)).total_s
                  for j in range(k))
    assert total == pytest.approx(singles, rel=1e-12)
    rc = cm.run_cost(Batch(num_decode_seqs=b, decode_context_tokens=ctx, num_logits=b, num_steps=k))
    assert rc.num_steps == k and abs(rc.curve_s) < 1e-15  # the roofline run is one straight piece
    assert k * (rc.first_s + rc.last_s) / 2 == pytest.approx(total, rel=1e-12)


def test_tensor_parallel_adds_two_allreduces_per_layer():
    m, g = get_model("llama-3-70b"), get_gpu("h100-sxm")
    cm = RooflineCostModel(m, g, 4)
    tp4 = cm.step_time(Batch(num_decode_seqs=8, decode_context_tokens=8000, num_logits=8))
    # the allreduce operator also carries the LM head's logits gather (tests/test_lm_head_gather.py)
    ar = tp4.ops_s["allreduce"] - cm._logits_gather_s(8)
    # 128 KiB: vLLM's custom one-shot all-reduce (each GPU reads its 3 peers' buffers)
    assert ar == pytest.approx(2 * 80 * (5e-6 + 3 * 8 * 8192 * 2 / (450e9 * 0.8)), rel=1e-9)
    big = cm.step_time(Batch(prefill_chunks=((1024, 0),), num_logits=1)).ops_s["allreduce"] - cm._logits_gather_s(1)
    # 16 MiB: NCCL's ring, Simple protocol, its tuning model's latency 8.4 + 2 (4 - 1) x 3.4 us
    # (sim/cost/nccl_tuning.py; was a flat 10 us: 80 us against the 99 us nccl-tests measure)
    assert big == pytest.approx(2 * 80 * (28.8e-6 + 1.5 * 1024 * 8192 * 2 / (450e9 * 0.8)), rel=1e-9)


def test_moe_reads_only_touched_experts():
    m, g = get_model("mixtral-8x7b"), get_gpu("h100-sxm")
    cm = RooflineCostModel(m, g, 1)
    one = cm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=100, num_logits=1)).ops_s["gemm_mlp_up"]
    big = cm.step_time(Batch(num_decode_seqs=256, decode_context_tokens=25600, num_logits=256)).ops_s["gemm_mlp_up"]
    # batch 1 touches 2 of 8 experts; a batch of 256 touches all 8: ~4x the weight reads
    assert big / one == pytest.approx(4.0, rel=0.1)
