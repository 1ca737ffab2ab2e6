"""Data-parallel attention with expert parallelism (issue 11's last gap): the all-to-all
arithmetic by hand from DeepSeek-V3's published config (hidden 7168, 256 routed experts,
top-8, 1 shared expert), the group's routed tokens on every rank, lockstep rounds, memory,
scenario checks and determinism."""

import json
import subprocess
import sys

import numpy as np
import pytest

from sim.analysis.explain import EXPLAIN_KEYS, explain
from sim.core.batch import Batch
from sim.cost.all2all import All2AllLinks, all2all_layer_bytes, all2all_layer_s, dispatch_bytes_per_copy
from sim.cost.arch import moe_mlp_s
from sim.cost.dp_ep import DataParallelEPCostModel
from sim.cost.roofline import RooflineCostModel
from sim.engine.deployment import build_deployment
from sim.engine.dp_group import DUMMY_BATCH, DataParallelLayout, round_s
from sim.engine.topology import ColocatedLayout, layout_for
from sim.errors import UserError
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from sim.workload.arrays import RequestArrays

H, K = 7168, 8  # DeepSeek-V3 hidden size, routed experts per token
FP8_COPY = H + (H // 128) * 4  # 7,392 bytes: fp8 values + one fp32 scale per 128
BF16_COPY = H * 2  # 14,336 bytes


def _scenario(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, tp=1, router="round_robin", **engine):
    return scenario_from_dict({
        "name": "dp", "seed": 1, "model": model, "hardware": {"gpu": gpu},
        "cluster": {"tensor_parallel_size": tp, "data_parallel_size": dp, "enable_expert_parallel": True,
                    "router": router},
        "engine": {"policy": "chunked", "max_num_batched_tokens": 2048, "max_model_len": 16384, **engine},
        "workload": {"synthetic": {"num_requests": 40, "request_rate": 10,
                                   "input_tokens": {"dist": "lognormal", "mean": 600, "sigma": 0.6, "max": 4000},
                                   "output_tokens": {"dist": "lognormal", "mean": 60, "sigma": 0.6, "max": 400}}}})


def test_all2all_bytes_and_time_for_deepseek_v3_by_hand():
    assert dispatch_bytes_per_copy(H, True, 2) == FP8_COPY == 7392
    assert dispatch_bytes_per_copy(H, False, 2) == BF16_COPY
    # 128 tokens per GPU, EP 8 in one node: each token's 8 experts sit on another GPU with
    # probability 7/8: 7 copies per token, all over NVLink
    di, dx, ci, cx = all2all_layer_bytes(128, H, K, 8, 8, True, 2)
    assert (di, dx) == (128 * 7 * 7392, 0) == (6_623_232, 0)
    assert (ci, cx) == (128 * 7 * 14336, 0) == (12_845_056, 0)
    nv = All2AllLinks(450e9 * 0.8, 50e9 * 0.8, 8, 10e-6)  # H200 NVLink, 400 Gb/s NIC, at 0.8
    t = all2all_layer_s(128, H, K, 8, nv, True, 2)
    assert t == pytest.approx(2 * 10e-6 + 6_623_232 / 360e9 + 12_845_056 / 360e9)
    assert t * 1e6 == pytest.approx(74.08, abs=0.01)
    # EP 16 over two nodes: 8 x 7/16 = 3.5 copies stay in the node, 8 x 8/16 = 4 cross the NIC,
    # the slower domain bounds each direction: 128 x 4 x 7392 / 40e9 + 128 x 4 x 14336 / 40e9
    di, dx, ci, cx = all2all_layer_bytes(128, H, K, 16, 8, True, 2)
    assert (di, dx, ci, cx) == (128 * 3.5 * 7392, 128 * 4 * 7392, 128 * 3.5 * 14336, 128 * 4 * 14336)
    t16 = all2all_layer_s(128, H, K, 16, nv, True, 2)
    assert t16 * 1e6 == pytest.approx(20 + 3_784_704 / 40e3 + 7_340_032 / 40e3, abs=1e-6)
    assert t16 * 1e6 == pytest.approx(298.1, abs=0.1)  # DeepEP low-latency EP16, H800: 118 + 195 us
    assert all2all_layer_s(128, H, K, 1, nv, True, 2) == 0.0 and all2all_layer_s(0, H, K, 8, nv, True, 2) == 0.0
    # the busiest GPU receives 1.5x the mean's copies: the byte terms grow, the call latency does not
    t15 = all2all_layer_s(128, H, K, 8, nv, True, 2, load_imbalance=1.5)
    assert t15 == pytest.approx(2 * 10e-6 + 1.5 * (6_623_232 + 12_845_056) / 360e9)


def test_rank_cost_charges_the_all2all_of_its_tokens_in_every_moe_layer():
    dep = build_deployment(_scenario("deepseek-v3", "h200", dp=8, quantization="fp8", max_num_seqs=64))
    cm = dep.cost
    assert isinstance(cm, DataParallelEPCostModel) and cm.ep == 8 and cm.fp8_dispatch
    assert cm.links.nvlink_bytes_per_s == pytest.approx(450e9 * 0.8)
    assert cm.all2all_layer_s(128) * 1e6 == pytest.approx(74.08, abs=0.01)
    # the all-to-all is in the communication class: 58 MoE layers of it on top of the TP all-reduce (0 at TP 1)
    b = Batch(num_decode_seqs=128, decode_context_tokens=128 * 2000, num_logits=128)
    assert cm.step_time(b).ops_s["allreduce"] == pytest.approx(58 * cm.all2all_layer_s(128))
    e = explain(dep, 2000, 128)
    assert tuple(e) == EXPLAIN_KEYS
    assert e["data_parallel_size"] == 8 and e["experts_per_gpu"] == 32
    assert e["all2all_dispatch_bytes_per_layer_per_gpu"] == 6_623_232
    assert e["all2all_combine_bytes_per_layer_per_gpu"] == 12_845_056
    assert e["all2all_ms_per_layer"] == pytest.approx(0.07408, abs=1e-5)


def test_expert_load_imbalance_slows_the_all2all_and_the_expert_gemms():
    flat = build_deployment(_scenario("deepseek-v3", "h200", dp=8, quantization="fp8")).cost
    s = _scenario("deepseek-v3", "h200", dp=8, quantization="fp8")
    s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"expert_load_imbalance": 1.5})})
    skew = build_deployment(s).cost
    assert skew.all2all_layer_s(128) - 2 * 10e-6 == pytest.approx(1.5 * (flat.all2all_layer_s(128) - 2 * 10e-6))
    b = Batch(num_decode_seqs=128, decode_context_tokens=128 * 2000, num_logits=128)
    assert skew.step_time(b).ops_s["gemm_mlp_up"] > flat.step_time(b).ops_s["gemm_mlp_up"]


def test_tp_within_a_rank_dispatches_a_token_slice_per_gpu():
    # vLLM use_sequence_parallel_moe (dp > 1, tp > 1): each GPU dispatches ceil(T / tp) tokens
    dep = build_deployment(_scenario("deepseek-v3", "h200", dp=2, tp=4, quantization="fp8"))
    cm = dep.cost
    assert cm.ep == 8
    assert cm.all2all_layer_s(128) == pytest.approx(
        all2all_layer_s(32, H, K, 8, cm.links, True, 2))


def test_routed_experts_run_the_groups_tokens_shared_expert_the_ranks():
    m, g = get_model("deepseek-v3"), get_gpu("h200")
    links = All2AllLinks(1e12, 1e12, 8, 0.0)
    cm = DataParallelEPCostModel.ideal(m, g, 1, bound="compute", dp=8, links=links)
    peak = g.bf16_flops_per_s
    T, G = 100, 800

    def up_s(group):
        cm._set_group(group)
        try:
            return cm.step_time(Batch(num_decode_seqs=T, decode_context_tokens=T, num_logits=T)).ops_s["gemm_mlp_up"]
        finally:
            cm._set_group(None)

    # per MoE layer: routed gate+up 2 x G x (8/8 experts-per-token share) x 7168 x 4096, shared
    # expert on the rank's own T tokens 2 x T x 7168 x 4096; 3 dense layers 2 x T x 7168 x 36864
    routed = 2 * G * (8 / 8) * H * 4096
    shared = 2 * T * H * 4096
    dense = 2 * T * H * 2 * 18432
    assert up_s(G) == pytest.approx((58 * (routed + shared) + 3 * dense) / peak, rel=1e-9)
    # alone (no group given) the rank stands for every rank: G = 8 x T
    assert up_s(None) == pytest.approx(up_s(8 * T), rel=1e-12)
    assert moe_mlp_s(cm, T) == moe_mlp_s(cm, T, routed_tokens=T)


def test_weights_per_gpu_hold_a_dp_share_of_the_routed_experts():
    one = build_deployment(_scenario(dp=2)).memory.weight_bytes_per_gpu
    s = _scenario(dp=2)
    s1 = s.model_copy(update={"cluster": s.cluster.model_copy(update={"data_parallel_size": 1})})
    whole = build_deployment(s1).memory.weight_bytes_per_gpu
    m = get_model("qwen3-30b-a3b")
    routed = m.num_moe_layers * m.num_experts * m.expert_params * 2
    assert whole - one == pytest.approx(routed / 2)


def test_a_round_lasts_the_slowest_rank_and_idle_ranks_run_a_dummy_batch():
    cm = build_deployment(_scenario(dp=2)).cost
    small = Batch(num_decode_seqs=4, decode_context_tokens=4 * 500, num_logits=4)
    big = Batch(prefill_chunks=((2048, 0),), num_logits=1)
    alone, (c_small, c_dummy) = round_s(cm, [small, None])
    assert c_dummy is None
    both, (cs, cb) = round_s(cm, [small, big])
    assert both == cb.first_s > cs.first_s  # the busy rank sets the pace
    assert both > alone  # a busy rank slows the other
    # CUDA graphs on: every rank runs the round's most tokens (vLLM get_dp_padding), the dummy too
    assert cm.pads_to_max
    assert alone == pytest.approx(cm.group_run_cost(small, 2 * 4, 4).first_s)
    # the decode rank pays 2048 rows of GEMMs, collectives and experts beside the prefill
    assert cs.first_s == pytest.approx(cm.group_run_cost(small, 2 * 2048, 2048).first_s)
    assert cs.first_s > 1.5 * cm.group_run_cost(small, 2048 + 4).first_s  # unpadded
    # eager (vLLM --enforce-eager): no padding; the dummy's one token is counted among the routed tokens
    eager = build_deployment(_scenario(dp=2, overhead={"cuda_graph_decode": False})).cost
    assert not eager.pads_to_max
    dur, _ = round_s(eager, [small, None])
    assert dur == pytest.approx(eager.group_run_cost(small, small.num_tokens + DUMMY_BATCH.num_tokens).first_s)


def test_lockstep_run_a_long_prefill_on_one_rank_holds_the_others_decodes():
    # offline: the requests reach the engine at their arrival times (online, the 12,000-token
    # prompt's tokenisation in the API server would hold request 1 behind it)
    s = _scenario(dp=2, api_server=False)
    assert isinstance(layout_for(s), DataParallelLayout) and layout_for(s).num_gpus == 2
    # round robin: request 0 (a long prompt, arriving later) on rank 0, request 1 (decoding) on rank 1
    arrays = RequestArrays(np.array([0.5, 0.0]), np.array([12000, 64]), np.array([2, 200]))
    res = run_scenario(s, workload=arrays)
    steps = res.steps
    rep, start, dur = (np.asarray(steps[c]) for c in ("replica", "start_s", "duration_s"))
    big = (rep == 0) & (np.asarray(steps["prefill_tokens"]) > 0)
    assert big.any()
    for st, d in zip(start[big], dur[big]):  # rank 1 steps at the same instants, for as long
        same = (rep == 1) & (start == st)
        assert same.sum() == 1 and dur[same][0] == d
    decode_only = dur[(rep == 1) & ~np.isin(start, start[rep == 0])]
    assert dur[big].min() > 5 * decode_only.max()  # the prefill chunks stall rank 1's decodes


def test_same_seed_same_bytes(tmp_path):
    outs = []
    for name in ("a", "b"):
        p = subprocess.run([sys.executable, "-m", "sim", "run", "scenarios/deepseek_v3_dp8_ep.yaml", "--set",
                            "workload.synthetic.num_requests=40", "--out", str(tmp_path / name)],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        outs.append([(tmp_path / name / f).read_bytes() for f in ("requests.parquet", "steps.parquet")])
        r = json.loads((tmp_path / name / "result.json").read_text())
        assert r["simsrv_data_parallel_size"] == 8 and r["simsrv_num_gpus"] == 8 and r["completed"] == 40
    assert outs[0] == outs[1]


def test_a_rank_outside_the_engine_profiles_batch_range_is_reported(tmp_path):
    """Ranks' steps count their engine overhead outside the profile's measured batch range as a
    replica's do (vllm-v0 was measured over 8-128 sequences; a DP8 rank runs fewer)."""
    p = subprocess.run([sys.executable, "-m", "sim", "run", "scenarios/deepseek_v3_dp8_ep.yaml", "--set",
                        "workload.synthetic.num_requests=40", "--set", "engine.profile=vllm-v0",
                        "--out", str(tmp_path / "r")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    lo, hi = json.loads((tmp_path / "r" / "result.json").read_text())["simsrv_overhead_outside_batch_range"]
    assert 1 <= lo <= hi < 8


def test_dp1_keeps_the_colocated_layout_and_cost_model():
    s = _scenario(dp=1)
    assert type(layout_for(s)) is ColocatedLayout
    assert type(build_deployment(s).cost) is RooflineCostModel


@pytest.mark.parametrize("sets, needle", [
    (["cluster.enable_expert_parallel=false"], "needs cluster.enable_expert_parallel"),
    (["cluster.pipeline_parallel_size=2"], "pipeline_parallel_size 1"),
    (["model=llama-3-8b"], "needs a MoE model"),
    (["engine.policy=continuous", "engine.num_scheduler_steps=8"], "num_scheduler_steps"),
])
def test_bad_data_parallel_settings_exit_2_with_one_line(sets, needle, tmp_path):
    # an --out that can be written: a run claims its directory before it simulates (sim/files/atomic.py)
    args = [sys.executable, "-m", "sim", "run", "scenarios/deepseek_v3_dp8_ep.yaml", "--out", str(tmp_path / "x")]
    for x in sets:
        args += ["--set", x]
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr and needle in lines[0], p.stderr


def test_dense_model_refused_in_build():
    s = _scenario(dp=2)
    s = s.model_copy(update={"model": "llama-3-8b"})
    with pytest.raises(UserError, match="needs a MoE model"):
        build_deployment(s)


def test_diagnose_decode_floor_reads_a_dp_share_of_the_groups_touched_experts():
    import polars as pl
    from types import SimpleNamespace

    from sim.analysis.diagnose import _decode_floor

    dep = build_deployment(_scenario("deepseek-v3", "h200", dp=8, quantization="fp8", max_num_seqs=64))
    m = dep.model
    steps = pl.DataFrame({"decode_tokens": [16], "num_steps": [1], "duration_s": [0.05]})
    reqs = pl.DataFrame({"status": ["completed"], "input_tokens": [3000], "output_tokens": [2000]})
    f = _decode_floor(SimpleNamespace(deployment=dep, steps=steps, requests=reqs), {"median_tpot_ms": 40.0})
    # every rank's 16 sequences touch the experts: E (1 - (1 - 8/256)^128) of 256 per MoE layer,
    # 1/8 of them on this GPU (fp8: 1 byte per expert weight); the rest of the weights whole (TP 1)
    touched = 256 * (1 - (1 - 8 / 256) ** 128)
    routed = 58 * touched * m.expert_params * 1 / 8
    kv = 16 * 4000 * 70_272
    assert f["bytes_per_step"] == pytest.approx(m.bytes_read(0) + routed + kv)
