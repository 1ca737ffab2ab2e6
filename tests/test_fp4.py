"""FP4 weights (issue 40 item 2): NVFP4 (vLLM ``modelopt_fp4``) and MXFP4 (``mxfp4``, gpt-oss's
experts): bytes per weight with their block scales, the GEMM peak they run at per GPU, the
measured NVFP4 GEMM table on B200, refusals where vLLM refuses, and ``explain``'s figures."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from sim.analysis.explain import EXPLAIN_KEYS, explain
from sim.core.batch import Batch
from sim.cost.floor import floor_model, gpu_step_s, step_floor_s
from sim.cost.roofline import RooflineCostModel
from sim.errors import UserError
from sim.spec.hardware import capped, custom_gpu, get_gpu
from sim.spec.models import get_model, with_quantization
from sim.spec.quantization import METHODS
from tests.conftest import ROOT, small_scenario

GEMMS = ("gemm_qkv", "gemm_o", "gemm_mlp_up", "gemm_mlp_down")


def _dep(model="llama-3-8b", gpu="b200", tp=1, **engine):
    from sim.engine.deployment import build_deployment
    from sim.scenario import scenario_from_dict
    return build_deployment(scenario_from_dict(small_scenario(
        model=model, hardware={"gpu": gpu}, cluster={"tensor_parallel_size": tp, "replicas": 1},
        engine={"policy": "continuous", **engine})))


def _gemm_s(ops_s: dict) -> float:
    return sum(ops_s[k] for k in GEMMS)


def test_block_scaled_fp4_bytes_per_weight():
    """NVFP4: 4-bit values + one E4M3 scale per 16 = 4.5 bits; MXFP4: + one E8M0 scale per 32 =
    4.25 bits (OCP MX v1.0). Only the linear layers take them; the rest stays bf16."""
    assert METHODS["modelopt_fp4"].weight_bits == 4.5
    assert METHODS["mxfp4"].weight_bits == 4.25
    m = with_quantization(get_model("llama-3.3-70b"), "modelopt_fp4", "t")
    assert m.quantized_params == m.linear_params
    assert m.weight_bytes() == m.linear_params * 0.5625 + (m.num_params - m.linear_params) * 2


def test_gpt_oss_ships_mxfp4_experts_and_bf16_attention():
    """The catalogue's gpt-oss carries its checkpoint's quantization_config (mxfp4): the routed
    experts at 4.25 bits, everything else bf16 (vLLM Mxfp4Config: LinearBase unquantized)."""
    m = get_model("gpt-oss-120b")
    assert m.quantization == "mxfp4"
    assert m.quantized_params == m.routed_expert_linear_params < m.linear_params
    assert m.weight_bytes() == m.quantized_params * 0.53125 + (m.num_params - m.quantized_params) * 2
    assert 60 < m.weight_bytes() / 2**30 < 62  # the published checkpoint: ~65 GB
    # an attention projection costs what the bf16 model's does; a decode's experts read ~4.25/16
    gpu = get_gpu("h100-sxm")
    mem = RooflineCostModel.ideal(m, gpu, 1, bound="memory")
    bf16 = RooflineCostModel.ideal(replace(m, quantization=None), gpu, 1, bound="memory")
    dec = Batch(num_decode_seqs=1, decode_context_tokens=512, num_logits=1)
    q, b = mem.step_time(dec).ops_s, bf16.step_time(dec).ops_s
    assert q["gemm_qkv"] == b["gemm_qkv"] and q["gemm_o"] == b["gemm_o"]
    assert q["gemm_mlp_up"] / b["gemm_mlp_up"] == pytest.approx(4.25 / 16, rel=0.01)


def test_mxfp4_on_hopper_is_weight_only_bf16_compute():
    """vLLM 0.11 runs gpt-oss's MXFP4 experts with bf16 activations (Marlin / Triton /
    FlashInfer MXFP4xBF16): a compute-bound prefill's expert GEMMs cost what bf16 ones do."""
    m, gpu = get_model("gpt-oss-20b"), get_gpu("h100-sxm")
    pre = Batch(prefill_chunks=((4096, 0),), num_logits=1)
    q = RooflineCostModel.ideal(m, gpu, 1, bound="compute").step_time(pre).ops_s
    b = RooflineCostModel.ideal(replace(m, quantization=None), gpu, 1, bound="compute").step_time(pre).ops_s
    assert _gemm_s(q) == pytest.approx(_gemm_s(b), rel=1e-9)
    assert METHODS["mxfp4"].gemm_peak_flops_per_s(gpu) == gpu.bf16_flops_per_s
    assert METHODS["mxfp4"].gemm_peak_flops_per_s(get_gpu("b200")) == get_gpu("b200").bf16_flops_per_s


def test_nvfp4_gemms_use_the_fp4_peak_on_blackwell_and_marlin_elsewhere():
    """B200 (9 PFLOPS dense FP4, 2x its FP8): a compute-bound NVFP4 prefill's GEMMs take half the
    fp8 time at the roofline; H100 (no FP4 tensor cores): vLLM's Marlin FP4 kernel, bf16 compute."""
    b200, h100 = get_gpu("b200"), get_gpu("h100-sxm")
    assert b200.fp4_flops_per_s == 9.0e15 and get_gpu("gb200").fp4_flops_per_s == 10.0e15
    assert h100.fp4_flops_per_s is None
    m = get_model("llama-3.3-70b")
    pre = Batch(prefill_chunks=((8192, 0),), num_logits=1)

    def gemms(quant, gpu):
        q = with_quantization(m, quant, "t") if quant else m
        return _gemm_s(RooflineCostModel.ideal(q, gpu, 1, bound="compute").step_time(pre).ops_s)

    assert gemms("modelopt_fp4", b200) / gemms("fp8", b200) == pytest.approx(0.5, rel=1e-9)
    assert gemms("modelopt_fp4", h100) == pytest.approx(gemms(None, h100), rel=1e-9)
    assert METHODS["modelopt_fp4"].gemm_peak_flops_per_s(b200) == 9.0e15
    assert METHODS["modelopt_fp4"].gemm_peak_flops_per_s(h100) == h100.bf16_flops_per_s
    # a power cap scales the FP4 peak with the others; a custom part may give one
    assert capped(b200, 0.5).fp4_flops_per_s == 4.5e15
    assert custom_gpu({"based_on": "h200", "fp4_flops_per_s": 1e16}).fp4_flops_per_s == 1e16


def test_nvfp4_gemms_follow_the_measured_nvfp4_table():
    """B200 has measured NVFP4 GEMMs (vLLM FlashInferCuteDslNvFp4LinearKernel, aiconfigurator):
    Llama-3-8B's O projection (4096 x 4096) at 1,024 tokens costs the measured time per layer."""
    import polars as pl

    from sim.kernels.schema import read_profiles
    rows = read_profiles(ROOT / "kernels_profile").filter(
        (pl.col("gpu") == "b200") & (pl.col("op") == "gemm_nvfp4") & (pl.col("m") == 1024)
        & (pl.col("n") == 4096) & (pl.col("k") == 4096))
    assert len(rows) == 1
    cm = _dep(gpu="b200", quantization="modelopt_fp4").cost
    o = cm.step_time(Batch(prefill_chunks=((1024, 0),))).ops_s["gemm_o"] / 32
    assert o * 1e3 == pytest.approx(rows["time_ms"].median(), rel=0.02)


def test_nvfp4_decode_step_is_cheaper_than_fp8_on_b200():
    """A memory-bound decode batch streams 4.5-bit weights instead of 8-bit ones."""
    dec = Batch(num_decode_seqs=16, decode_context_tokens=16 * 1024, num_logits=16)
    fp4 = _dep("llama-3.3-70b", quantization="modelopt_fp4").cost.step_time(dec)
    fp8 = _dep("llama-3.3-70b", quantization="fp8").cost.step_time(dec)
    assert fp4.total_s < fp8.total_s
    assert _gemm_s(fp4.ops_s) < 0.8 * _gemm_s(fp8.ops_s)


def test_nvfp4_steps_never_cost_less_than_their_floor():
    for model, tp in (("llama-3.3-70b", 1), ("qwen3-30b-a3b", 2)):
        cm = _dep(model, tp=tp, quantization="modelopt_fp4").cost
        floor = floor_model(cm)
        for b in (Batch(prefill_chunks=((c, 0),), num_logits=1) for c in (1, 64, 2048, 8192)):
            assert gpu_step_s(cm, b) >= step_floor_s(floor, b) * (1 - 1e-9)
        for n in (1, 8, 64, 512):
            b = Batch(num_decode_seqs=n, decode_context_tokens=n * 2000, num_logits=n)
            assert gpu_step_s(cm, b) >= step_floor_s(floor, b) * (1 - 1e-9)


def test_explain_shows_fp4_weights_kv_and_floors():
    fp4 = explain(_dep("llama-3.3-70b", quantization="modelopt_fp4"), context_tokens=2048, batch=32)
    fp8 = explain(_dep("llama-3.3-70b", quantization="fp8"), context_tokens=2048, batch=32)
    bf16 = explain(_dep("llama-3-8b"), context_tokens=2048, batch=1)
    assert tuple(fp4) == EXPLAIN_KEYS
    assert fp4["quantized_bits_per_weight"] == 4.5 and fp8["quantized_bits_per_weight"] == 8.0
    assert fp4["quantized_gemm_peak_flops_per_s"] == 9.0e15 and fp8["quantized_gemm_peak_flops_per_s"] == 4.5e15
    assert bf16["quantized_params"] == 0 and bf16["quantized_bits_per_weight"] == 16.0
    assert fp4["weight_bytes_per_gpu"] < 0.6 * fp8["weight_bytes_per_gpu"]
    assert fp4["kv_capacity_tokens"] > fp8["kv_capacity_tokens"]
    assert fp4["decode_step_floor_ms"] < fp8["decode_step_floor_ms"]
    assert fp4["prefill_floor_ms"] < 0.6 * fp8["prefill_floor_ms"]
    oss = explain(_dep("gpt-oss-20b", gpu="h100-sxm"), context_tokens=2048, batch=1)
    assert oss["quantized_bits_per_weight"] == 4.25
    assert oss["quantized_gemm_peak_flops_per_s"] == get_gpu("h100-sxm").bf16_flops_per_s


def test_refusals_name_the_key():
    """vLLM's ROCm platform does not list modelopt_fp4; mxfp4 quantizes MoE experts only."""
    with pytest.raises(UserError, match=r"quantization: modelopt_fp4 is not supported on mi300x"):
        _dep(gpu="mi300x", quantization="modelopt_fp4")
    _dep("gpt-oss-20b", gpu="mi300x")  # mxfp4 runs on ROCm (Triton)
    with pytest.raises(UserError, match=r"engine.quantization: mxfp4 quantizes MoE experts only"):
        _dep(quantization="mxfp4")
    with pytest.raises(UserError, match=r"'fp8' contradicts the model's own quantization 'mxfp4'"):
        _dep("gpt-oss-20b", quantization="fp8")


def test_refusal_is_one_line_exit_2(tmp_path):
    raw = small_scenario(hardware={"gpu": "mi300x"}, engine={"quantization": "modelopt_fp4"})
    p = tmp_path / "s.yaml"
    p.write_text(json.dumps(raw))
    r = subprocess.run([sys.executable, "-m", "sim", "explain", str(p)], capture_output=True, text=True,
                       cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "modelopt_fp4" in lines[0] and "mi300x" in lines[0], r.stderr


@pytest.mark.parametrize("qc, method", [
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}, "modelopt_fp4"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "modelopt_fp4"),
    ({"quant_method": "mxfp4"}, "mxfp4"),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "FP8"}}, "fp8"),  # ModelOptFp8Config
])
def test_checkpoint_quantization_config_is_read(tmp_path, qc, method):
    """ModelOptNvFp4Config.override_quantization_method: quant_method "modelopt" with an NVFP4
    quant_algo is modelopt_fp4; gpt-oss's config.json says mxfp4."""
    from sim.spec.models import catalogue
    base = "gpt-oss-20b" if method == "mxfp4" else "llama-3.1-8b"  # (no quantization of its own)
    cfg = {k: v for k, v in catalogue()[base].items() if k not in ("source", "hf_ids", "quantization_config")}
    cfg["quantization_config"] = qc
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert get_model({"hf_config": str(p)}).quantization == method
