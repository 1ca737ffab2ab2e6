"""Speculative decoding's drafter in memory and in the step (issue 40 item 1): the drafter's
weights come out of the KV cache (vLLM loads it before sizing the cache), and the EAGLE-1 /
EAGLE-3 / MTP heads are priced from their structure (sim/cost/speculative.py ``DraftHead``)."""

import pytest

from sim.analysis.explain import explain
from sim.cost.speculative import (EAGLE3_DRAFT_VOCAB_TOKENS, draft_head, draft_weight_bytes_per_gpu)
from sim.engine.deployment import build_deployment
from sim.scenario import scenario_from_dict
from sim.spec.models import get_model

SPECS = {
    "eagle": {"method": "eagle", "num_speculative_tokens": 3, "acceptance_length": 2.2},
    "eagle3": {"method": "eagle3", "num_speculative_tokens": 3, "acceptance_length": 2.6},
    "mtp": {"method": "mtp", "num_speculative_tokens": 1, "acceptance_length": 1.8},
    "draft_model": {"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 3,
                    "acceptance_length": 2.0},
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "acceptance_length": 1.5},
}


def _raw(spec=None, tp=1, model="llama-3.1-8b", **engine):
    eng = {"policy": "chunked", **engine}
    if spec is not None:
        eng["speculative_config"] = spec
    return {"name": "sm", "seed": 0, "model": model, "hardware": {"gpu": "h100-sxm"}, "engine": eng,
            "cluster": {"tensor_parallel_size": tp},
            "workload": {"synthetic": {"num_requests": 4, "request_rate": 1.0,
                                       "input_tokens": {"dist": "fixed", "value": 100},
                                       "output_tokens": {"dist": "fixed", "value": 20}}}}


@pytest.mark.parametrize("method", sorted(SPECS))
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_kv_capacity_falls_by_exactly_the_draft_weights(method, tp):
    """Every method, every TP: the KV blocks are what the off plan's free memory less the
    drafter's bytes per GPU holds (gpu_worker ``determine_available_memory``: the drafter is
    loaded when the cache is sized), and ``explain`` shows those bytes."""
    off = build_deployment(scenario_from_dict(_raw(None, tp))).memory
    dep = build_deployment(scenario_from_dict(_raw(SPECS[method], tp)))
    on = dep.memory
    model = get_model("llama-3.1-8b")
    draft = get_model("llama-3.2-1b") if method == "draft_model" else None
    d = draft_weight_bytes_per_gpu(method, model, tp, draft)
    assert on.draft_weight_bytes_per_gpu == d
    assert (d == 0.0) == (method == "ngram")
    free_off = off.usable_bytes - off.weight_bytes_per_gpu - off.activation_reserve_bytes
    assert on.kv_block_bytes_per_gpu == off.kv_block_bytes_per_gpu
    assert on.num_kv_blocks == int((free_off - d) // on.kv_block_bytes_per_gpu)
    if d:
        assert on.num_kv_blocks < off.num_kv_blocks
    e = explain(dep, 1000, 1)
    assert e["spec_draft_weight_bytes_per_gpu"] == d
    assert explain(build_deployment(scenario_from_dict(_raw(None, tp))), 1000, 1)[
        "spec_draft_weight_bytes_per_gpu"] == 0.0


def test_draft_weights_follow_each_heads_structure():
    """Llama-3.1-8B (h 4096, q 4096, kv 1024, I 14336, vocab 128,256, bf16): EAGLE-1 is its fc
    (2h x h) and one decoder layer, embedding and LM head the target's; EAGLE-3 its fc (3h x h),
    a layer whose QKV reads 2h, its hidden norm, its own 32,000-token LM head and the int64 d2t
    map; the fc, norms and d2t map whole on every TP rank, the rest split."""
    m = get_model("llama-3.1-8b")
    h, q, kv, inter = 4096, 4096, 1024, 14336
    layer = h * (q + 2 * kv) + q * h + 3 * h * inter + 2 * h
    eagle = (2 * h * h + layer) * 2
    eagle3_split = layer + h * (q + 2 * kv) + EAGLE3_DRAFT_VOCAB_TOKENS * h
    eagle3_whole = 3 * h * h + h
    for tp in (1, 2, 8):
        assert draft_weight_bytes_per_gpu("eagle", m, tp) == pytest.approx(
            ((layer) / tp + 2 * h * h) * 2)
        assert draft_weight_bytes_per_gpu("eagle3", m, tp) == pytest.approx(
            (eagle3_split / tp + eagle3_whole) * 2 + EAGLE3_DRAFT_VOCAB_TOKENS * 8)
    assert draft_weight_bytes_per_gpu("eagle", m, 1) == eagle
    # the published EAGLE-3 Llama-3.1-8B head is ~811 MiB of weights (fc, layer, LM head)
    assert 800 * 2**20 < draft_weight_bytes_per_gpu("eagle3", m, 1) < 820 * 2**20
    assert draft_weight_bytes_per_gpu("ngram", m, 1) == 0.0


def test_draft_heads():
    """The structure of each head (vLLM llama_eagle.py, llama_eagle3.py, deepseek_mtp.py)."""
    e1, e3, mtp = draft_head("eagle", 128_256), draft_head("eagle3", 128_256), draft_head("mtp", 128_256)
    assert (e1.fc_in_hidden, e1.fc_every_pass, e1.qkv_in_hidden, e1.lm_vocab_tokens, e1.own_lm_head) == (
        2, True, 1, 128_256, False)
    assert (e3.fc_in_hidden, e3.fc_every_pass, e3.qkv_in_hidden, e3.lm_vocab_tokens, e3.own_lm_head,
            e3.d2t_entries) == (3, False, 2, 32_000, True, 32_000)
    assert (mtp.fc_in_hidden, mtp.fc_every_pass, mtp.own_lm_head) == (2, True, True)
    # a target vocabulary smaller than the draft's: the head's is the target's, no d2t map
    small = draft_head("eagle3", 20_000)
    assert (small.lm_vocab_tokens, small.d2t_entries) == (20_000, 0)


def _spec(method, **engine):
    return build_deployment(scenario_from_dict(_raw(SPECS[method], **engine))).cost.spec_run


def test_eagle3_pass_prices_its_structure():
    """At batch 1 a pass reads the head's weights: EAGLE-3's 32k LM head (0.26 GB) against the
    target's (1.05 GB) outweighs its wider QKV, so its later passes are cheaper than EAGLE-1's;
    its first pass alone carries the 3h -> h fc, EAGLE-1's 2h -> h fc is in every pass."""
    e1, e3 = _spec("eagle"), _spec("eagle3")
    ctx = 1000
    assert e3.head_pass_s(1, 1, ctx, (), False) < e1.head_pass_s(1, 1, ctx, (), False)
    assert e3.head_pass_s(1, 1, ctx, (), True) > e3.head_pass_s(1, 1, ctx, (), False)
    assert e1.head_pass_s(1, 1, ctx, (), True) == e1.head_pass_s(1, 1, ctx, (), False)
    # the weights a batch-1 pass reads, at HBM bandwidth, bound its time from below
    bw = e1.target.mem_bw
    m = get_model("llama-3.1-8b")
    lm_bytes = m.vocab_size * m.hidden_size * 2
    assert e1.head_pass_s(1, 1, ctx, (), False) >= (draft_weight_bytes_per_gpu("eagle", m, 1) + lm_bytes) / bw
    assert e3.head_pass_s(1, 1, ctx, (), True) >= (draft_weight_bytes_per_gpu("eagle3", m, 1)
                                                   - EAGLE3_DRAFT_VOCAB_TOKENS * 8) / bw


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_draft_is_k_sequential_passes(method):
    """vLLM V1's speculator: a first pass over the target step's tokens (k + 1 per decode, padded,
    plus the prompt chunks), then k - 1 one-token passes, each paid in full."""
    spec = _spec(method)
    k, n, ctx = spec.k, 8, 8 * 1000
    chunks = ((256, 0),)
    first = spec.head_pass_s(n * (k + 1) + 256, n, ctx, chunks, True)
    rest = spec.head_pass_s(n, n, ctx, (), False)
    assert spec.draft_s(n, ctx, chunks) == pytest.approx(first + (k - 1) * rest)
    assert first > rest > 0


@pytest.mark.parametrize("method", ["eagle", "eagle3", "draft_model"])
def test_eager_draft_passes_pay_their_launches(method):
    """Without CUDA graphs every draft pass launches its layers' kernels (the engine profile's
    per-layer launch time, as the target's step pays): at batch 1 with a long launch time the
    draft costs k passes x layers x that time; with graphs, the GPU time alone."""
    eager = _spec(method, overhead={"cuda_graph_decode": False})
    graphed = _spec(method)
    n, ctx = 1, 500
    layers = eager.draft.model.num_layers if method == "draft_model" else 1
    launch = eager.target.engine.eager_launch_per_layer_s * layers
    assert launch > 0
    assert eager.draft_s(n, ctx, ()) >= eager.k * launch
    assert graphed.draft_s(n, ctx, ()) <= eager.draft_s(n, ctx, ())
