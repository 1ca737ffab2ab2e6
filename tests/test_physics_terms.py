"""Issue 10 section 3: physics terms (quantized weights, custom all-reduce, MHA decode attention,
skinny GEMM waves, launch floors and carried calibrations, explain reading the cost model)."""

import pytest

from sim.core.batch import Batch
from sim.cost.calibration import load_calibration
from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model


def _cm(model, gpu, tp=1, **kw):
    cal = load_calibration(gpu)
    return RooflineCostModel(get_model(model), get_gpu(gpu), tp, None, Efficiencies(), calibration=cal, **kw)


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
    from sim.engine.deployment import build_deployment
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
    """A100 (no FP8: FP8 Marlin, weight-only): prefill GEMMs unchanged, a batch-1 decode's
    about half (half the weight bytes); int8 W8A8 on A100 runs at the 624 TOPS INT8 peak (half
    the bf16 time, compute bound)."""
    pre = Batch(prefill_chunks=((4096, 0),), num_logits=1)
    dec = Batch(num_decode_seqs=1, decode_context_tokens=512, num_logits=1)
    for gpu, q, pre_ratio in (("a100-80g", "fp8", 1.0), ("a100-80g", "int8", 0.5)):
        base, quant = _dep(gpu=gpu).cost, _dep(gpu=gpu, quantization=q).cost
        assert _gemm_s(quant.step_time(pre)) / _gemm_s(base.step_time(pre)) == pytest.approx(pre_ratio, rel=0.03), (gpu, q)
        assert 0.45 < _gemm_s(quant.step_time(dec)) / _gemm_s(base.step_time(dec)) < 0.75, (gpu, q)
        assert quant.step_time(dec).ops_s["lm_head"] == base.step_time(dec).ops_s["lm_head"]  # LM head stays bf16


def test_fp8_gemms_follow_the_measured_fp8_table():
    """H100 has measured fp8 W8A8 GEMMs (vLLM's CUTLASS scaled_mm, aiconfigurator): Llama-3-8B's
    O projection (4096 x 4096) at 1,024 tokens costs the measured fp8 time, per layer; the
    measured kernel is far from 2x the bf16 one (0.039 against 0.043 ms), which a peak ratio
    alone would predict."""
    import polars as pl

    from sim.kernels.schema import read_profiles
    from tests.conftest import ROOT
    rows = read_profiles(ROOT / "kernels_profile").filter(
        (pl.col("gpu") == "h100-sxm") & (pl.col("op") == "gemm_fp8") & (pl.col("m") == 1024)
        & (pl.col("n") == 4096) & (pl.col("k") == 4096))
    cm = _dep(gpu="h100-sxm", quantization="fp8").cost
    o = cm.step_time(Batch(prefill_chunks=((1024, 0),))).ops_s["gemm_o"] / 32
    assert o * 1e3 == pytest.approx(rows["time_ms"].median(), rel=0.02)
    base = _dep(gpu="h100-sxm").cost.step_time(Batch(prefill_chunks=((1024, 0),))).ops_s["gemm_o"] / 32
    assert 0.7 < o / base < 1.0


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
    from sim.analysis.explain import EXPLAIN_KEYS, explain
    m, g = get_model("llama-3-8b"), get_gpu("h100-sxm")
    n = 2048
    e = explain(_dep(), context_tokens=n, batch=1)
    assert tuple(e) == EXPLAIN_KEYS
    flops = 2 * m.linear_params * n + 2 * m.hidden_size * m.vocab_size + 4 * m.num_layers * m.q_size * n * (n + 1) / 2
    # the FLOPs alone (the compute bound of sim/cost/floor.py's floor); explain's floor is the
    # full one, each operator at its larger bound (elementwise and the LM head read bytes)
    from sim.core.batch import Batch
    from sim.cost.floor import floor_model, step_floor_s
    compute_s = step_floor_s(floor_model(_dep().cost, "compute"), Batch(prefill_chunks=((n, 0),), num_logits=1))
    assert compute_s == pytest.approx(flops / g.bf16_flops_per_s, rel=1e-9)
    assert e["prefill_floor_ms"] > compute_s * 1e3
    q = explain(_dep(quantization="fp8"), context_tokens=n, batch=1)
    assert q["weight_bytes_per_gpu"] == _dep(quantization="fp8").memory.weight_bytes_per_gpu
    assert 0.5 < q["decode_step_floor_ms"] / e["decode_step_floor_ms"] < 0.6


# -- all-reduce: vLLM's custom kernel for small buffers ----------------------------------------------

def test_small_allreduces_take_vllms_custom_kernel():
    """Llama-3-8B at TP8 on H100, batch 1: each all-reduce of 8 KiB costs the measured custom
    all-reduce under CUDA graphs (5.3 us at 8 KiB, aiconfigurator), not NCCL's ring (16.6 us);
    a 4,096-token prefill (32 MiB, above vLLM's 8 MiB max_size) stays on NCCL."""
    from sim.cost.fit import custom_allreduce_link_bytes, uses_custom_allreduce
    m = get_model("llama-3-8b")
    cm = _cm("llama-3-8b", "h100-sxm", tp=8)
    # the allreduce operator also carries the LM head's logits gather (tests/test_lm_head_gather.py)
    ar = cm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=16, num_logits=1)).ops_s["allreduce"]
    assert (ar - cm._logits_gather_s(1)) / (2 * m.num_layers) == pytest.approx(5.3e-6, rel=0.1)
    big = cm.step_time(Batch(prefill_chunks=((4096, 0),), num_logits=1)).ops_s["allreduce"] / (2 * m.num_layers)
    assert big > 100e-6
    assert not uses_custom_allreduce(8, 32 * 2**20, True) and uses_custom_allreduce(8, 8192, True)
    assert not uses_custom_allreduce(4, 8192, False) and uses_custom_allreduce(2, 8192, False)  # PCIe: 2 GPUs only
    assert not uses_custom_allreduce(3, 8192, True)
    # one-shot: every rank reads all peers' buffers; two-shot past 256 KiB at 8 GPUs
    assert float(custom_allreduce_link_bytes(8, 8192)) == 7 * 8192
    assert float(custom_allreduce_link_bytes(8, 2**20)) == pytest.approx(2 * 7 / 8 * 2**20)


def test_roofline_allreduce_uses_the_custom_kernel_too():
    """Uncalibrated (mi300x, roofline): a batch-1 all-reduce costs the custom kernel's
    latency plus one-shot bytes, under NCCL's latency."""
    from sim.cost.roofline import Efficiencies
    m = get_model("llama-3-8b")
    cm = RooflineCostModel(m, get_gpu("mi300x"), 8)
    # the allreduce operator also carries the LM head's logits gather (tests/test_lm_head_gather.py)
    ar = cm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=16, num_logits=1)).ops_s["allreduce"]
    one = (ar - cm._logits_gather_s(1)) / (2 * m.num_layers)
    link = get_gpu("mi300x").nvlink_bw_bytes_per_s * Efficiencies().link
    assert one == pytest.approx(Efficiencies().custom_allreduce_latency_s + 7 * m.hidden_size * 2 / link)


# -- decode attention without GQA -------------------------------------------------------------------

def test_mha_decode_latency_floor_is_the_kernels():
    """Llama-2-7B (32 query = 32 KV heads) at batch 1, context 16 on A100: the kernel's latency
    floor (about what Llama-3-8B's GQA decode costs, 13 us per layer), not the 32/8 table's
    floor scaled by 4x the KV bytes (44 us); at long context the cost follows the KV bytes
    (4x Llama-3-8B's)."""
    mha, gqa = _cm("llama-2-7b", "a100-80g"), _cm("llama-3-8b", "a100-80g")
    def per_layer(cm, ctx, b=1):
        return cm.step_time(Batch(num_decode_seqs=b, decode_context_tokens=b * ctx, num_logits=b)).ops_s["attn_decode"] / 32
    assert per_layer(mha, 16) < 1.2 * per_layer(gqa, 16)
    assert per_layer(mha, 16) < 15e-6
    assert 2.5 < per_layer(mha, 8192, 32) / per_layer(gqa, 8192, 32) < 4.5
    assert mha.cops.describe()["attn_decode_heads_table"] == [8, 8]


# -- every GPU gets every operator class ---------------------------------------------------------------

def test_gpus_without_elementwise_measurements_carry_h100s_by_bandwidth():
    """H200/B200/L40S have no elementwise profile: they carry H100's measured curves, looked up
    at the bytes of equal roofline bound, so batch 1 keeps the measured launch-latency floor
    (0.6 ms for Llama-3-8B's 225 kernels, not a 0.002 ms roofline) and a large batch scales with
    bandwidth; result.json names the donor."""
    dec = Batch(num_decode_seqs=1, decode_context_tokens=16, num_logits=1)
    big = Batch(prefill_chunks=((8192, 0),), num_logits=1)
    h100, h200, l40s = _cm("llama-3-8b", "h100-sxm"), _cm("llama-3-8b", "h200"), _cm("llama-3-8b", "l40s")
    assert h200.carried_from == {"elementwise": "h100-sxm"} and h100.carried_from == {}
    e = lambda cm, b: cm.step_time(b).ops_s["elementwise"]  # noqa: E731
    assert e(h200, dec) == pytest.approx(e(h100, dec), rel=0.15) and e(h200, dec) > 0.3e-3
    bw = lambda g: get_gpu(g).hbm_bw_bytes_per_s  # noqa: E731
    assert e(h200, big) / e(h100, big) == pytest.approx(bw("h100-sxm") / bw("h200"), rel=0.1)
    assert e(l40s, big) / e(h100, big) == pytest.approx(bw("h100-sxm") / bw("l40s"), rel=0.1)


def test_result_json_names_the_carried_calibration(tmp_path):
    import json

    from tests.conftest import small_scenario
    from tests.test_cli import simsrv
    import yaml
    sc = small_scenario(hardware={"gpu": "h200"})
    sc["workload"]["synthetic"]["num_requests"] = 5
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(sc))
    r = simsrv("run", str(p), "--out", str(tmp_path / "run"), "-q")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "run" / "result.json").read_text())
    assert res["simsrv_calibration_carried_from"] == {"elementwise": "h100-sxm"}
    assert "carried: elementwise from h100-sxm" in res["simsrv_cost_model"]


def test_roofline_kernels_have_a_launch_floor():
    """Uncalibrated GPU (mi300x) at batch 1: every kernel takes at least the 2 us launch floor;
    the elementwise kernels of Llama-3-8B (7 per layer + embedding) no longer cost ~0.002 ms."""
    from sim.cost.roofline import Efficiencies
    cm = RooflineCostModel(get_model("llama-3-8b"), get_gpu("mi300x"), 1)
    c = cm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=16, num_logits=1)).ops_s
    fl = Efficiencies().kernel_floor_s
    assert c["elementwise"] == pytest.approx((7 * 32 + 1) * fl)
    assert c["attn_decode"] >= 32 * fl  # latency + streaming
    assert c["sampling"] >= fl
