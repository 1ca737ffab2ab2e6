"""Pipeline and expert parallelism (issue 11): stage split, memory per stage, pipelined step
time and send/recv, expert-parallel MoE cost, checked against figures computed by hand."""

import pytest

from sim.core.batch import Batch
from sim.cost.pipeline import PipelineCostModel, split_batch
from sim.cost.roofline import RooflineCostModel
from sim.engine.deployment import build_deployment
from sim.errors import UserError
from sim.analysis.explain import explain
from sim.spec.hardware import get_gpu
from sim.spec.memory import plan_memory, stage_layers
from sim.spec.models import get_model
from sim.scenario import scenario_from_dict


def _scn(model, gpu="h100-sxm", **cluster):
    return scenario_from_dict({"model": model, "hardware": {"gpu": gpu, "cost_model": "roofline"}, "cluster": cluster,
                               "engine": {"max_model_len": 8192, "allow_long_max_model_len": True},
                               "workload": {"synthetic": {"num_requests": 40, "request_rate": 4.0,
                                                          "input_tokens": {"dist": "fixed", "value": 512},
                                                          "output_tokens": {"dist": "fixed", "value": 64}}}})


def test_stage_layers_as_vllm_get_pp_indices():
    assert stage_layers(126, 2) == (63, 63)
    assert stage_layers(80, 3) == (27, 27, 26)   # the remainder goes to the stages before the last
    assert stage_layers(61, 4) == (15, 15, 16, 15)  # vLLM docs: DeepSeek 61 layers at PP4


def test_405b_tp8_pp2_weights_and_kv_per_gpu_by_hand():
    m = get_model("llama-3.1-405b")
    # per layer: attention 16384 x (16384 + 2 x 1024) + 16384^2, MLP 3 x 16384 x 53248, 2 norms
    layer = 16384 * 18432 + 16384**2 + 3 * 16384 * 53248 + 2 * 16384
    assert layer == 3_187_703_808
    embed = 128_256 * 16_384
    last = (63 * layer + embed + 16_384) * 2 / 8  # LM head and final norm on the last stage
    p = plan_memory(m, get_gpu("h100-sxm"), 8, 16, 0.9, 8192, 256, pp=2)
    assert p.stage_weight_bytes == ((63 * layer + embed) * 2 / 8, last)
    assert p.weight_bytes_per_gpu == last == 50_731_675_648
    # 63 layers x 1 KV head per GPU (8 heads / TP 8) x 128 x 2 (K, V) x 2 bytes per token
    assert p.kv_block_bytes_per_gpu == 16 * 63 * 2 * 128 * 2
    with pytest.raises(UserError, match="does not fit"):
        plan_memory(m, get_gpu("h100-sxm"), 8, 16, 0.9, 8192, 256, pp=1)


def test_falcon_180b_tp4_pp2_and_405b_tp8_pp2_run():
    from sim.run import run_scenario

    for model, tp in (("falcon-180b", 4), ("llama-3.1-405b", 8)):
        r = run_scenario(_scn(model, tensor_parallel_size=tp, pipeline_parallel_size=2))
        assert r.requests["status"].to_list().count("completed") == 40
        assert isinstance(r.deployment.cost, PipelineCostModel)


def test_pipelining_halves_a_compute_bound_round_but_not_one_sequence():
    m, g = get_model("llama-3.1-70b"), get_gpu("h100-sxm")
    one = RooflineCostModel(m, g, 4)
    pp = PipelineCostModel(m, 2, lambda s: RooflineCostModel(s, g, 4), g.nvlink_bw_bytes_per_s)
    big = Batch(prefill_chunks=((4096, 0),) * 4, num_logits=4)
    # two micro-batches of 2 prompts chase each other: each stage does half the layers of all
    # four prompts; the round is one stage's work, about half of the whole model's
    ratio = pp.run_durations_s(big)[0] / one.run_durations_s(big)[0]
    assert 0.45 < ratio < 0.6
    # a single decode sequence cannot be split: its token crosses both stages in turn
    solo = Batch(num_decode_seqs=1, decode_context_tokens=1000, num_logits=1)
    assert pp.run_durations_s(solo)[0] == pytest.approx(one.run_durations_s(solo)[0], rel=0.05)


def test_send_recv_by_hand():
    m, g = get_model("llama-3.1-405b"), get_gpu("h100-sxm")
    pp = PipelineCostModel(m, 2, lambda s: RooflineCostModel(s, g, 8), 50e9)
    # hidden states + residual, 2 x 1000 tokens x 16384 x 2 bytes, 1/8 per GPU, over 0.8 x 50 GB/s
    assert pp.send_s(1000) == pytest.approx(10e-6 + 2 * 1000 * 16384 * 2 / 8 / 40e9)
    d = build_deployment(_scn("llama-3.1-405b", tensor_parallel_size=8, pipeline_parallel_size=2))
    assert d.cost.link_bytes_per_s == pytest.approx(0.8 * 50e9)  # 16 GPUs: two nodes, 400 Gb/s NIC per GPU


def test_split_batch_keeps_every_token():
    b = Batch(num_decode_seqs=7, decode_context_tokens=7000, prefill_chunks=((300, 0), (200, 50)), num_logits=8)
    parts = split_batch(b, 3)
    assert sum(p.num_decode_seqs for p in parts) == 7 and sum(p.prefill_tokens for p in parts) == 500
    assert sum(p.num_logits for p in parts) == 8
    assert sum(p.decode_context_tokens for p in parts) == pytest.approx(7000, abs=2)


def test_pp_errors_and_gpu_count():
    with pytest.raises(UserError, match="pipeline_parallel_size: 81 stages"):
        build_deployment(_scn("llama-3.1-70b", pipeline_parallel_size=81))
    from sim.metrics.summary import num_gpus

    assert num_gpus(_scn("llama-3.1-70b", replicas=2, tensor_parallel_size=4, pipeline_parallel_size=2)) == 16


def test_expert_parallel_balanced_matches_tp_and_imbalance_slows_the_experts():
    m, g = get_model("mixtral-8x7b"), get_gpu("h100-sxm")
    tp = RooflineCostModel(m, g, 4)
    ep = RooflineCostModel(m, g, 4, enable_expert_parallel=True)
    skew = RooflineCostModel(m, g, 4, enable_expert_parallel=True, expert_load_imbalance=1.5)
    assert ep.ep == 4 and ep._eup == (4096, 2 * 14336)  # whole experts, 8 / 4 = 2 per GPU
    big = 8192  # compute bound: the same FLOPs per GPU when balanced
    assert ep._gemms(big)[2] == pytest.approx(tp._gemms(big)[2], rel=0.01)
    assert skew._gemms(big)[2] == pytest.approx(1.5 * ep._gemms(big)[2], rel=0.01)
    # decode of 1 token: 2 experts touched of 8, on the slowest rank 2/4 x (k=2 experts) read
    assert ep._gemms(1)[2] == pytest.approx(tp._gemms(1)[2], rel=0.01)


def test_explain_shows_parallelism_and_architecture():
    d = build_deployment(_scn("llama-3.1-405b", tensor_parallel_size=8, pipeline_parallel_size=2))
    e = explain(d, 8192, 1)
    assert e["pipeline_parallel_size"] == 2 and e["max_layers_per_stage"] == 63
    assert e["pp_send_bytes_per_token_per_gpu"] == 2 * 16384 * 2 / 8
    assert e["kv_bytes_per_token_per_gpu"] == 63 * 2 * 128 * 2
    assert e["gpu_memory_bytes"] == (81_559 - 551) * 2**20  # what CUDA reports, 79.11 GiB
    e = explain(build_deployment(_scn("deepseek-v3", "b200", tensor_parallel_size=8, enable_expert_parallel=True)),
                4096, 1)
    assert e["kv_bytes_per_token"] == e["kv_bytes_per_token_per_gpu"] == 70_272
    assert (e["expert_parallel_size"], e["experts_per_gpu"]) == (8, 32)
    e = explain(build_deployment(_scn("gemma-2-9b")), 8192, 1)
    assert (e["num_sliding_layers"], e["sliding_window_tokens"]) == (21, 4096)
    assert e["kv_bytes_per_seq_at_context"] == (21 * 8192 + 21 * 4096) * 2 * 8 * 256 * 2


def test_parallelism_keys_that_would_be_ignored_are_errors():
    with pytest.raises(UserError, match="needs cluster.enable_expert_parallel"):
        _scn("mixtral-8x7b", expert_load_imbalance=1.3)
    with pytest.raises(UserError, match="colocated replicas"):
        scenario_from_dict({"cluster": {"pipeline_parallel_size": 2}, "engine": {"policy": "disaggregated"},
                            "workload": {"synthetic": {}}})
