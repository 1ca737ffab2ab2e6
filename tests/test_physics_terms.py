"""Issue 10 section 3: physics terms (quantized weights, custom all-reduce, MHA decode attention,
skinny GEMM waves, launch floors and carried calibrations, explain reading the cost model)."""

import pytest

from sim.batch import Batch
from sim.cost.calibration import default_efficiencies, load_calibration
from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.hardware import get_gpu
from sim.models import get_model


def _cm(model, gpu, tp=1, **kw):
    cal = load_calibration(gpu)
    return RooflineCostModel(get_model(model), get_gpu(gpu), tp, None, default_efficiencies(cal, Efficiencies(), tp),
                             calibration=cal, **kw)


def test_a100_skinny_gemm_is_not_padded_into_compute():
    """Llama-3-8B gate+up (4096 -> 28,672: 112 tiles of 256 on 108 SMs) at one token streams its
    weights near the measured rate of its neighbours (n = 16,384 / 65,536 at m = 1: 67-78% of
    HBM); a whole second wave of 128-row tiles made it compute bound at 56%."""
    m, g = get_model("llama-3-8b"), get_gpu("a100-80g")
    cm = _cm("llama-3-8b", "a100-80g")
    up_s = cm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=16, num_logits=1)).ops_s["gemm_mlp_up"]
    frac = m.num_layers * m.hidden_size * 2 * m.intermediate_size * 2 / up_s / g.hbm_bw_bytes_per_s
    assert 0.65 < frac < 0.95


# -- weight quantization ---------------------------------------------------------------------------

def _dep(model="llama-3-8b", gpu="h100-sxm", tp=1, **engine):
    from sim.deployment import build_deployment
    from sim.scenario import scenario_from_dict
    from tests.conftest import small_scenario
    return build_deployment(scenario_from_dict(small_scenario(
        model=model, hardware={"gpu": gpu}, cluster={"tensor_parallel_size": tp, "replicas": 1},
        engine={"policy": "continuous", **engine})))


def _gemm_s(cost):
    return sum(cost.ops_s[k] for k in ("gemm_qkv", "gemm_o", "gemm_mlp_up", "gemm_mlp_down"))


def test_quantized_weights_shrink_memory_and_grow_kv():
    """fp8/int8: one byte per linear weight; awq/gptq: 4 bits + an fp16 scale and a 4-bit zero
    per group of 128; embedding and LM head stay bf16 (vLLM)."""
    m = get_model("llama-3-8b")
    lin, rest = m.linear_params, m.num_params - m.linear_params
    bf16 = _dep().memory
    fp8 = _dep(quantization="fp8").memory
    awq = _dep(model={"name": "llama-3-8b", "quantization": "awq"}).memory
    assert fp8.weight_bytes_per_gpu == pytest.approx(lin * 1 + rest * 2)
    assert awq.weight_bytes_per_gpu == pytest.approx(lin * (0.5 + 2.5 / 128) + rest * 2)
    assert bf16.weight_bytes_per_gpu == pytest.approx(m.num_params * 2)
    assert bf16.num_kv_blocks < fp8.num_kv_blocks < awq.num_kv_blocks
    # the freed bytes become KV blocks
    freed = bf16.weight_bytes_per_gpu - fp8.weight_bytes_per_gpu
    assert fp8.num_kv_blocks - bf16.num_kv_blocks == pytest.approx(freed / bf16.kv_block_bytes_per_gpu, abs=1)


def test_fp8_gemms_run_at_the_fp8_peak_where_the_gpu_has_one():
    """H100 (FP8 tensor cores, 1,979 TFLOP/s): a 4,096-token prefill's GEMMs take half the bf16
    time (compute bound), a batch-1 decode's about half (half the weight bytes). A100 (no FP8:
    FP8 Marlin, weight-only): prefill GEMMs unchanged, decode faster; int8 W8A8 on A100 runs at
    the 624 TOPS INT8 peak."""
    pre = Batch(prefill_chunks=((4096, 0),), num_logits=1)
    dec = Batch(num_decode_seqs=1, decode_context_tokens=512, num_logits=1)
    for gpu, q, pre_ratio in (("h100-sxm", "fp8", 0.5), ("a100-80g", "fp8", 1.0), ("a100-80g", "int8", 0.5)):
        base, quant = _dep(gpu=gpu).cost, _dep(gpu=gpu, quantization=q).cost
        assert _gemm_s(quant.step_time(pre)) / _gemm_s(base.step_time(pre)) == pytest.approx(pre_ratio, rel=0.03), (gpu, q)
        assert 0.45 < _gemm_s(quant.step_time(dec)) / _gemm_s(base.step_time(dec)) < 0.75, (gpu, q)
        lm = Batch(num_decode_seqs=1, decode_context_tokens=512, num_logits=1)
        assert quant.step_time(lm).ops_s["lm_head"] == base.step_time(lm).ops_s["lm_head"]  # LM head stays bf16


def test_awq_is_weight_only_int4():
    """AWQ: dequantized to bf16 inside the GEMM: a prefill's GEMMs cost what bf16 ones do, a
    batch-1 decode reads about a quarter of the bytes."""
    pre = Batch(prefill_chunks=((4096, 0),), num_logits=1)
    base, q = _dep(gpu="h100-sxm").cost, _dep(gpu="h100-sxm", quantization="awq").cost
    assert _gemm_s(q.step_time(pre)) == pytest.approx(_gemm_s(base.step_time(pre)), rel=0.02)
    dec = Batch(num_decode_seqs=1, decode_context_tokens=512, num_logits=1)
    assert _gemm_s(q.step_time(dec)) < 0.5 * _gemm_s(base.step_time(dec))


def test_checkpoint_quantization_config_is_read(tmp_path):
    import json

    from sim.errors import UserError
    cfg = {"num_attention_heads": 32, "hidden_size": 4096, "num_hidden_layers": 32, "num_key_value_heads": 8,
           "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "float16",
           "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert get_model({"hf_config": str(p)}).quantization == "awq"
    with pytest.raises(UserError, match="contradicts"):
        get_model({"hf_config": str(p), "quantization": "fp8"})
    cfg["quantization_config"] = {"quant_method": "bitsandbytes"}
    p.write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="not modelled"):
        get_model({"hf_config": str(p)})


# -- explain reads the cost model ------------------------------------------------------------------

def test_explain_floors_are_the_cost_models():
    """The prefill floor counts the LM head on the one sampled position (the old hand formula
    counted it on every prompt token: +14.5% at 2,048 tokens), and the linear layers at 2 FLOPs
    per weight per token; quantized weights show in weight bytes and the decode floor."""
    from sim.explain import EXPLAIN_KEYS, explain
    m, g = get_model("llama-3-8b"), get_gpu("h100-sxm")
    n = 2048
    e = explain(_dep(), context_tokens=n, batch=1)
    assert tuple(e) == EXPLAIN_KEYS
    flops = 2 * m.linear_params * n + 2 * m.hidden_size * m.vocab_size + 4 * m.num_layers * m.q_size * n * (n + 1) / 2
    assert e["prefill_floor_ms"] == pytest.approx(flops / g.bf16_flops_per_s * 1e3, rel=1e-9)
    q = explain(_dep(quantization="fp8"), context_tokens=n, batch=1)
    assert q["weight_bytes_per_gpu"] == _dep(quantization="fp8").memory.weight_bytes_per_gpu
    assert 0.5 < q["decode_step_floor_ms"] / e["decode_step_floor_ms"] < 0.6
