"""Sliding-window layers hold KV only for the window (issue 11): vLLM V1's KV cache groups,
block ids per sequence, the decode set's look-ahead with window-filling sequences, and runs
of Gemma-2, gpt-oss and Mistral-7B-v0.1; figures computed by hand from the published configs."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.kv import KVBlockManager, KVGroups
from sim.core.request import Request
from sim.engine.deployment import build_deployment
from sim.spec.hardware import get_gpu
from sim.spec.memory import kv_groups, plan_memory
from sim.spec.models import get_model
from sim.policies.decode_set import DecodeSet
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from sim.analysis.explain import explain
from sim.metrics.summary import summarize


def test_kv_groups_as_vllm_groups_layers():
    # Gemma-2-9B: 21 global + 21 local (window 4096) layers: two groups of 21; a sliding group
    # holds at most ceil(4095 / 16) + 1 = 257 blocks
    assert kv_groups(get_model("gemma-2-9b"), 16) == (KVGroups(1, 1, 257, 4096), 21)
    # Gemma-3-27B: 10 global, 52 local (window 1024): groups of 10, six local ones (8 padding layers)
    assert kv_groups(get_model("gemma-3-27b"), 16) == (KVGroups(1, 6, 65, 1024), 10)
    # gpt-oss-120b: 18 full + 18 sliding (window 128): ceil(127 / 16) + 1 = 9
    assert kv_groups(get_model("gpt-oss-120b"), 16) == (KVGroups(1, 1, 9, 128), 18)
    # Mistral-7B-v0.1: every layer slides over 4096 tokens: one sliding group of 32 layers
    assert kv_groups(get_model("mistral-7b-v0.1-window"), 16) == (KVGroups(0, 1, 257, 4096), 32)
    assert kv_groups(get_model("llama-3.1-8b"), 16) == (KVGroups(), 32)


def test_block_ids_per_sequence_by_hand():
    g = KVGroups(1, 1, 257)
    assert g.blocks(1000, 16) == 63 + 63
    assert g.blocks(8192, 16) == 512 + 257      # was 1,024 blocks of all 42 layers' halves
    assert KVGroups(0, 1, 257).blocks(100_000, 16) == 257
    assert KVGroups().blocks(100_000, 16) == 6250


def test_gemma2_memory_plan_blocks_are_pages_of_21_layers():
    m, gpu = get_model("gemma-2-9b"), get_gpu("h100-sxm")
    p = plan_memory(m, gpu, 1, 16, 0.9, 8192, 256)
    layer = 2 * 8 * 256 * 2                      # K and V of 8 heads x 256 in bf16: 8,192 bytes
    assert p.kv_block_bytes_per_gpu == 16 * 21 * layer == 2_752_512
    assert p.num_kv_blocks == int((p.usable_bytes - p.weight_bytes_per_gpu - p.activation_reserve_bytes)
                                  // 2_752_512)
    assert p.kv_capacity_tokens == p.num_kv_blocks // 2 * 16  # vLLM's logged "GPU KV cache size"


def _scn(model, **engine):
    return scenario_from_dict({"model": model, "hardware": {"gpu": "h100-sxm", "cost_model": "roofline"},
                               "engine": {"max_model_len": 8192, **engine},
                               "workload": {"synthetic": {"num_requests": 4, "input_tokens": {"dist": "fixed", "value": 64},
                                                          "output_tokens": {"dist": "fixed", "value": 8}}}})


def test_explain_shows_groups_and_more_sequences_at_long_context():
    d = build_deployment(_scn("gemma-2-9b"))
    e = explain(d, 8192, 8)
    assert (e["kv_full_groups"], e["kv_sliding_groups"], e["kv_layers_per_group"]) == (1, 1, 21)
    assert e["kv_blocks_per_seq_at_context"] == 769
    assert e["max_seqs_at_context"] == d.memory.num_kv_blocks // 769
    e = explain(build_deployment(_scn("gpt-oss-20b")), 100_000, 1)
    assert e["kv_blocks_per_seq_at_context"] == 6250 + 9  # 12 full + 12 sliding layers, window 128


def test_block_manager_charges_the_window_only():
    kv = KVBlockManager(10_000, 16, groups=KVGroups(1, 1, 9, 128))  # gpt-oss: window 128
    r = Request(0, 0.0, 1000, 10)
    assert kv.allocate(r, 1000)  # KV that exists whole: the window's 9 blocks
    assert kv.blocks_held(r) == kv.num_used == 63 + 9
    assert kv.allocate(r, 1600)
    assert kv.blocks_held(r) == kv.num_used == 100 + 9
    kv.free(r)
    assert kv.num_used == 0


def test_a_long_chunk_holds_its_blocks_until_the_window_moves_on():
    """vLLM frees a sliding group's blocks before token computed - window + 1, then allocates
    the chunk's (remove_skipped_blocks before allocate_slots)."""
    kv = KVBlockManager(10_000, 16, groups=KVGroups(1, 1, 9, 128))
    r = Request(0, 0.0, 4096, 10)
    assert kv.allocate(r, 2048, computed=0)          # first chunk: tokens 0 .. 2047
    assert kv.blocks_held(r) == 128 + 128
    r.num_computed = 2048
    assert kv.allocate(r, 4096, computed=2048)       # blocks before token 1921 (120 of them) freed
    assert kv.blocks_held(r) == kv.num_used == 256 + (256 - 1921 // 16)
    kv.trim(r, kv.blocks_for(4096))                  # joining decode: the window's 9 remain
    assert kv.blocks_held(r) == kv.num_used == 256 + 9


@settings(max_examples=200, deadline=None)
@given(bs=st.sampled_from([1, 4, 16]), groups=st.sampled_from([(1, 0, 0), (1, 1, 3), (1, 6, 2), (0, 1, 4), (2, 1, 5)]),
       steps0=st.integers(0, 100), seqs=st.lists(st.tuples(st.integers(1, 120), st.integers(1, 8), st.integers(0, 40)),
                                                 min_size=1, max_size=20),
       ks=st.lists(st.integers(0, 60), min_size=1, max_size=4), free=st.integers(0, 300))
def test_decode_set_look_ahead_with_sliding_groups_matches_brute_force(bs, groups, steps0, seqs, ks, free):
    g = KVGroups(*groups)
    kv = KVBlockManager(10**7, bs, groups=g)
    ds = DecodeSet(kv)
    ds.steps = steps0
    ns = []
    for i, (p, gen, hit) in enumerate(seqs):
        r = Request(i, 0.0, p, 10_000)
        r.num_generated = gen
        h = min(hit, (p - 1) // bs)  # a prefix-cache hit never covers the last token
        kv.table(r).hit_blocks = h
        assert kv.allocate(r, p + gen - 1)
        assert kv.blocks_held(r) == g.blocks(p + gen - 1, bs, shared=h)
        ds.add(r)
        assert kv.blocks_held(r) == 0  # the decode set's blocks are counted together
        ns.append((p + gen - 1, h))
    done = 0  # steps advanced so far

    def brute(k):
        return sum(g.blocks(n + done + j + 1, bs, shared=h) - g.blocks(n + done + j, bs, shared=h)
                   for n, h in ns for j in range(k))

    for k in ks:
        change = ds.steps_to_next_change()
        k = min(k, change)
        assert ds.blocks_needed(k) == brute(k)
        km = ds.max_steps_within(free)
        if km < change:
            assert brute(km) <= free < brute(km + 1)
        kv.allocate_blocks(brute(k))
        assert ds.advance(k) == []
        done += k
    assert kv.decode_blocks == kv.num_used == sum(g.blocks(n + done, bs, shared=h) for n, h in ns)


@pytest.mark.parametrize("model", ["gemma-2-9b", "gpt-oss-20b", "mistral-7b-v0.1-window", "gemma-3-1b"])
def test_runs_under_kv_pressure_fast_forward_exactly(model):
    raw = {"model": model, "hardware": {"gpu": "l4", "cost_model": "roofline"},
           "engine": {"policy": "chunked", "max_num_seqs": 64, "max_num_batched_tokens": 1024,
                      "max_model_len": 8192, "gpu_memory_utilization": 0.95, "enable_prefix_caching": False},
           "workload": {"synthetic": {"num_requests": 40, "request_rate": math.inf,
                                      "input_tokens": {"dist": "lognormal", "mean": 1500, "sigma": 0.8, "max": 6000},
                                      "output_tokens": {"dist": "lognormal", "mean": 300, "sigma": 0.6, "max": 1500}}}}
    if model == "gpt-oss-20b":  # 12.8 GiB of weights (MXFP4 experts): ~2,000 blocks left on an H100
        raw["hardware"]["gpu"] = "h100-sxm"
        raw["engine"]["gpu_memory_utilization"] = 0.185
    if model == "gemma-3-1b":
        raw["engine"]["gpu_memory_utilization"] = 0.16
    ff = run_scenario(scenario_from_dict(raw))
    single = run_scenario(scenario_from_dict(raw), max_run_steps=1)
    a, b = summarize(ff), summarize(single)
    assert a["completed"] == b["completed"] == 40
    assert a["simsrv_num_preemptions"] == b["simsrv_num_preemptions"] > 0  # under KV pressure
    for key in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms"):
        assert a[key] == pytest.approx(b[key], rel=1e-3), key
    for s in ff.schedulers:  # every block given back
        assert s.kv.num_used == 0


def test_sliding_window_frees_capacity_a_full_charge_would_not(tmp_path):
    """Gemma-2-9B on one H100 at 6,000-token prompts and 1,000-token answers: 438 + 257 = 695
    instead of 2 x 438 = 876 block ids (pages of 21 layers) per 7,000-token sequence: fewer
    preemptions than the same config with its window taken away (every layer charged in full)."""
    import json
    from pathlib import Path

    cfg = json.loads((Path(__file__).parent / "fixtures" / "hf" / "gemma-2-9b" / "config.json").read_text())
    cfg["sliding_window"] = None
    (tmp_path / "config.json").write_text(json.dumps(cfg))

    def run(model):
        raw = {"model": model, "hardware": {"gpu": "h100-sxm", "cost_model": "roofline"},
               "engine": {"policy": "chunked", "max_num_seqs": 64, "max_num_batched_tokens": 2048,
                          "max_model_len": 8192},
               "workload": {"synthetic": {"num_requests": 40, "request_rate": math.inf,
                                          "input_tokens": {"dist": "fixed", "value": 6000},
                                          "output_tokens": {"dist": "fixed", "value": 1000}}}}
        r = run_scenario(scenario_from_dict(raw))
        return summarize(r), r.deployment.memory

    (windowed, mw), (full, mf) = run({"hf_config": str(Path(__file__).parent / "fixtures" / "hf" / "gemma-2-9b" / "config.json")}), \
        run({"hf_config": str(tmp_path / "config.json")})
    assert mw.kv_block_bytes_per_gpu * 2 == mf.kv_block_bytes_per_gpu  # pages of 21 layers, not 42
    assert mw.num_kv_blocks // 2 == mf.num_kv_blocks
    assert windowed["completed"] == full["completed"] == 40
    # more sequences fit at once: the batch drains sooner (50.0 s against 56.6 s)
    assert windowed["duration"] < 0.95 * full["duration"]
    assert windowed["mean_ttft_ms"] < full["mean_ttft_ms"]


def test_all_sliding_model_says_prefix_caching_is_not_modelled():
    raw = {"model": "mistral-7b-v0.1-window", "hardware": {"gpu": "h100-sxm", "cost_model": "roofline"},
           "engine": {"max_model_len": 8192},
           "workload": {"synthetic": {"num_requests": 4, "input_tokens": {"dist": "fixed", "value": 64},
                                      "output_tokens": {"dist": "fixed", "value": 8}}}}
    w = summarize(run_scenario(scenario_from_dict(raw)))["simsrv_warnings"]
    assert any("enable_prefix_caching: not modelled" in x for x in w)


def test_disaggregated_pools_charge_sliding_layers_in_full():
    """A KV connector disables vLLM's hybrid KV cache manager: one group of all 42 layers."""
    raw = {"model": "gemma-2-9b", "hardware": {"gpu": "h100-sxm", "cost_model": "roofline"},
           "engine": {"policy": "disaggregated", "max_model_len": 8192},
           "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
           "workload": {"synthetic": {"num_requests": 4, "input_tokens": {"dist": "fixed", "value": 64},
                                      "output_tokens": {"dist": "fixed", "value": 8}}}}
    r = run_scenario(scenario_from_dict(raw))
    assert r.deployment.memory.kv_groups == KVGroups()
    assert r.deployment.memory.kv_block_bytes_per_gpu == 16 * 42 * 8192


def test_prefill_attention_on_sliding_layers_spans_the_window_only():
    from sim.core.batch import Batch
    from sim.cost.roofline import RooflineCostModel

    m, g = get_model("gpt-oss-20b"), get_gpu("h100-sxm")  # 64 heads x 64, 24 layers, 12 slide over 128
    cm = RooflineCostModel.ideal(m, g, 1, bound="compute")
    full = 4096 * 4097 / 2
    window = 128 * 129 / 2 + 128 * (4096 - 128)   # sum of min(t, 128) for t = 1 .. 4096
    t = cm.step_time(Batch(prefill_chunks=((4096, 0),), num_logits=1)).ops_s["attn_prefill"]
    assert t == pytest.approx(4 * 64 * 64 * (12 * full + 12 * window) / g.bf16_flops_per_s, rel=1e-12)
    # a chunk wholly past the window: every query attends 128 keys on sliding layers
    t = cm.step_time(Batch(prefill_chunks=((512, 2048),), num_logits=1)).ops_s["attn_prefill"]
    pairs = 12 * 512 * (2048 + 513 / 2) + 12 * 512 * 128
    assert t == pytest.approx(4 * 64 * 64 * pairs / g.bf16_flops_per_s, rel=1e-12)


def test_a_prefix_hit_shares_the_sliding_pages_of_the_prefix():
    """Gemma-2 pages (window 4096: 257 blocks): a request of 4,100 tokens (257 blocks) whose
    first 250 blocks (4,000 tokens) are a cache hit holds 257 global pages (250 of them the
    shared hit) and, of the sliding group, only the 7 pages past the hit: the hit's are shared."""
    g = KVGroups(1, 1, 257, 4096)
    assert g.blocks(4100, 16, shared=250) == 257 + 7
    assert g.blocks(4100, 16) == 257 + 257
    # decoding on, its own sliding pages grow until the window holds none of the hit's
    assert g.blocks(8000, 16, shared=250) == 500 + 250
    assert g.blocks(8192, 16, shared=250) == 512 + 257


@pytest.mark.parametrize("model", ["gemma-2-9b", "gpt-oss-20b"])
def test_shared_prefix_runs_fast_forward_exactly(model):
    raw = {"model": model, "hardware": {"gpu": "l4" if model == "gemma-2-9b" else "h100-sxm", "cost_model": "roofline"},
           "engine": {"policy": "chunked", "max_num_batched_tokens": 1024, "max_num_seqs": 256, "max_model_len": 8192,
                      "gpu_memory_utilization": 0.95 if model == "gemma-2-9b" else 0.515},
           "workload": {"synthetic": {"num_requests": 120, "request_rate": 4, "shared_prefix_tokens": 2000, "num_prefixes": 3,
                                      "input_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.5, "max": 800},
                                      "output_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.5, "max": 800}}}}
    ff = run_scenario(scenario_from_dict(raw))
    single = run_scenario(scenario_from_dict(raw), max_run_steps=1)
    a, b = summarize(ff), summarize(single)
    assert a["completed"] == b["completed"] == 120
    assert a["simsrv_prefix_cache_hit_rate"] == b["simsrv_prefix_cache_hit_rate"] > 0.5
    assert a["simsrv_num_preemptions"] == b["simsrv_num_preemptions"]
    for key in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms"):
        assert a[key] == pytest.approx(b[key], rel=1e-3), key
