"""Issue 11 leftovers: MLA attention FLOPs as vLLM runs them, the MLA latent whole on every
TP rank in diagnose, expert parallelism's communication at data_parallel_size 1, GPU counts
of disaggregated pools and the model modules' import order; figures computed by hand from
the published DeepSeek-V3 config (128 heads, qk_nope 128, qk_rope 64, v 128, kv_lora 512)."""

import subprocess
import sys
from types import SimpleNamespace

import polars as pl
import pytest

from sim.core.batch import Batch
from sim.cost.roofline import RooflineCostModel
from sim.engine.deployment import build_deployment
from sim.engine.topology import layout_for
from sim.errors import UserError
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model
from sim.scenario import scenario_from_dict

WORKLOAD = {"synthetic": {"num_requests": 4, "input_tokens": {"dist": "fixed", "value": 256},
                          "output_tokens": {"dist": "fixed", "value": 16}}}


def _attn_s(cm, batch, op):
    return cm.step_time(batch).ops_s[op]


def test_mla_prefill_flops_are_mha_192_128_not_4_x_head_dim():
    m, g = get_model("deepseek-v3"), get_gpu("h200")
    cm = RooflineCostModel.ideal(m, g, 8, bound="compute")
    # 16 heads per GPU: QK^T over 128 + 64 = 192, PV over v_head_dim 128, 2 FLOPs per MAC
    per_pair = 2 * 16 * (192 + 128)
    assert per_pair == 10_240  # was 4 x 16 x 192 = 12,288: 20% high
    pairs = 4096 * (4096 + 1) / 2
    t = _attn_s(cm, Batch(prefill_chunks=((4096, 0),), num_logits=1), "attn_prefill")
    assert t == pytest.approx(61 * per_pair * pairs / g.bf16_flops_per_s, rel=1e-12)
    # a chunk after 1,024 cached tokens also up-projects their latent with kv_b:
    # 2 x 512 x 16 x (128 + 128) FLOPs per cached token per layer
    up = 2 * 512 * 16 * (128 + 128)
    t = _attn_s(cm, Batch(prefill_chunks=((1024, 1024),), num_logits=1), "attn_prefill")
    assert t == pytest.approx(61 * (per_pair * 1024 * (1024 + 1025 / 2) + up * 1024) / g.bf16_flops_per_s, rel=1e-12)


def test_mla_decode_is_absorbed_over_the_latent():
    m, g = get_model("deepseek-v3"), get_gpu("h200")
    flops = RooflineCostModel.ideal(m, g, 8, bound="compute")
    mem = RooflineCostModel.ideal(m, g, 8, bound="memory")
    b = Batch(num_decode_seqs=4, decode_context_tokens=4 * 2000, num_logits=4)
    # QK^T over kv_lora + rope = 576, PV over kv_lora = 512, 16 heads per GPU
    assert _attn_s(flops, b, "attn_decode") == pytest.approx(61 * 2 * 16 * (576 + 512) * 8000 / g.bf16_flops_per_s)
    # the cache read is the latent, whole on every rank: 576 x 2 bytes per token per layer,
    # plus q read and o written (16 heads x 192 each, 4 sequences)
    bytes_ = 8000 * 576 * 2 + 2 * 4 * 16 * 192 * 2
    assert _attn_s(mem, b, "attn_decode") == pytest.approx(61 * bytes_ / g.hbm_bw_bytes_per_s)


def test_non_mla_attention_flops_unchanged():
    m, g = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    cm = RooflineCostModel.ideal(m, g, 1, bound="compute")
    t = _attn_s(cm, Batch(prefill_chunks=((2048, 0),), num_logits=1), "attn_prefill")
    assert t == pytest.approx(32 * 4 * 32 * 128 * 2048 * 2049 / 2 / g.bf16_flops_per_s, rel=1e-12)


def _scn(model, gpu, **cluster):
    return scenario_from_dict({"model": model, "hardware": {"gpu": gpu, "cost_model": "roofline"},
                               "cluster": cluster, "engine": {"max_model_len": 8192}, "workload": WORKLOAD})


def test_diagnose_decode_floor_keeps_the_mla_latent_whole_per_rank():
    from sim.analysis.diagnose import _decode_floor

    dep = build_deployment(_scn("deepseek-v3", "b200", tensor_parallel_size=8))
    steps = pl.DataFrame({"decode_tokens": [32], "num_steps": [1], "duration_s": [0.05]})
    reqs = pl.DataFrame({"status": ["completed"], "input_tokens": [3000], "output_tokens": [2000]})
    f = _decode_floor(SimpleNamespace(deployment=dep, steps=steps, requests=reqs), {"median_tpot_ms": 40.0})
    m = dep.model
    # 32 sequences x 4,000 tokens x 70,272 bytes (not / 8: the latent has no head axis)
    kv = 32 * 4000 * 70_272
    assert f["bytes_per_step"] == pytest.approx(m.bytes_read(32) / 8 + kv)


def test_diagnose_decode_floor_reads_only_the_window_on_sliding_layers():
    from sim.analysis.diagnose import _decode_floor

    dep = build_deployment(_scn("gemma-2-9b", "h100-sxm"))
    steps = pl.DataFrame({"decode_tokens": [8], "num_steps": [1], "duration_s": [0.05]})
    reqs = pl.DataFrame({"status": ["completed"], "input_tokens": [7000], "output_tokens": [2000]})
    f = _decode_floor(SimpleNamespace(deployment=dep, steps=steps, requests=reqs), {"median_tpot_ms": 40.0})
    # 21 global layers hold 8,000 tokens, 21 sliding layers 4,096; 8 KV heads x 256 x K,V x 2 bytes
    kv = 8 * (21 * 8000 + 21 * 4096) * 2 * 8 * 256 * 2
    assert f["bytes_per_step"] == pytest.approx(dep.model.bytes_read(8) + kv)


def test_expert_parallel_at_dp1_adds_no_all_to_all():
    """vLLM runs dispatch/combine all-to-all kernels only with data_parallel_size > 1
    (FusedMoEParallelConfig.use_all2all_kernels); TP+EP communicates by the TP all-reduce."""
    m, g = get_model("deepseek-v3"), get_gpu("h200")
    tp = RooflineCostModel(m, g, 8)
    ep = RooflineCostModel(m, g, 8, enable_expert_parallel=True)
    for b in (Batch(num_decode_seqs=64, decode_context_tokens=64 * 1000, num_logits=64),
              Batch(prefill_chunks=((8192, 0),), num_logits=1)):
        a, e = tp.step_time(b).ops_s, ep.step_time(b).ops_s
        assert e["allreduce"] == a["allreduce"] > 0
        assert set(e) == set(a)


def test_disaggregated_pools_count_tp_gpus_and_refuse_pipeline_stages():
    s = scenario_from_dict({"engine": {"policy": "disaggregated"}, "cluster": {"tensor_parallel_size": 2},
                            "disaggregation": {"prefill": {"replicas": 3},
                                               "decode": {"replicas": 2, "tensor_parallel_size": 4}},
                            "workload": WORKLOAD})
    assert layout_for(s).num_gpus == 3 * 2 + 2 * 4
    with pytest.raises(UserError, match="pipeline_parallel_size applies to colocated replicas"):
        scenario_from_dict({"engine": {"policy": "disaggregated"}, "cluster": {"pipeline_parallel_size": 2},
                            "workload": WORKLOAD})


def test_hf_config_reader_does_not_import_the_catalogue():
    code = "import sys, sim.spec.hf_config; assert 'sim.spec.models' not in sys.modules, 'import circle'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_explain_shows_mla_attention_flops_per_pair():
    from sim.analysis.explain import explain

    e = explain(build_deployment(_scn("deepseek-v3", "b200", tensor_parallel_size=8)), 4096, 1)
    assert e["prefill_attn_flops_per_pair_per_layer"] == 2 * 16 * (192 + 128)
    assert e["decode_attn_flops_per_pair_per_layer"] == 2 * 16 * (576 + 512)
    e = explain(build_deployment(_scn("llama-3.1-8b", "h100-sxm")), 4096, 1)
    assert e["prefill_attn_flops_per_pair_per_layer"] == e["decode_attn_flops_per_pair_per_layer"] == 4 * 32 * 128


def test_a_pipeline_run_summarizes():
    """``simsrv run`` of a pipeline-parallel scenario reaches its summary (the pipeline cost
    model reports its stages' carried calibration curves like a single-stage one)."""
    from sim.metrics.summary import summarize
    from sim.run import run_scenario

    s = summarize(run_scenario(_scn("llama-3.1-70b", "h100-sxm", tensor_parallel_size=2, pipeline_parallel_size=2)))
    assert s["completed"] == 4 and s["simsrv_pipeline_parallel_size"] == 2 and s["simsrv_num_gpus"] == 4
