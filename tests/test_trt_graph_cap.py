"""TensorRT-LLM's CUDA-graph batch cap under trtllm-bench, and the start-up rule of the 2023
GptSession profile.

1. trtllm-bench's PyTorch backend captures decode graphs up to min(max_batch_size,
   max_num_tokens) (model_engine.py ``_filter_cuda_graph_batch_sizes`` on the perf-overview's
   ``cuda_graph_config``, sim/spec/trtllm_bench.py): each VC-14/15/24 row says so in
   ``engine.overhead.cuda_graph_max_batch``, where the rows ran the ``trt-llm`` profile's fixed
   2048 before (decode batches of 2049-4096 sequences priced eager).
2. ``trt-llm-2023`` (GptSession, v0.5-v0.7) had no start-up rule tying the token budget to
   max_model_len (vLLM's ``SchedulerConfig._verify_args``): its engine is built with
   max_input_len and max_output_len apart, and a prompt over the engine's input bound is refused
   at run time. So a budget below max_model_len runs, a longer prompt fails with its reason, and
   no TensorRT-LLM profile's refusal names vLLM's rule.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.analysis.validate import load_case_files, validation_dir
from sim.cost.engine_profile import PROFILE_NAMES, get_profile
from sim.errors import UserError
from sim.scenario import scenario_from_dict
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model
from sim.spec.trtllm_bench import (
    PERF_OVERVIEW_CUDA_GRAPH_BATCH_SIZES, filter_cuda_graph_batch_sizes, trtllm_bench_settings,
)

from tests.conftest import small_scenario

CASES = ("VC-14", "VC-15", "VC-24")


def _bench_rows():
    files = [validation_dir() / f"{c}.yaml" for c in CASES]
    return [r for r in load_case_files(files, "validation") if r.scenario and r.status == "ok"]


def test_filter_follows_model_engine():
    """_filter_cuda_graph_batch_sizes: sizes within min(max_batch_size, max_num_tokens / (1 + draft))
    kept; with padding the first size above replaced by that bound; without padding dropped."""
    sizes = PERF_OVERVIEW_CUDA_GRAPH_BATCH_SIZES
    assert filter_cuda_graph_batch_sizes(sizes, 4096, 8192, 0, True)[-3:] == [1024, 2048, 4096]
    assert filter_cuda_graph_batch_sizes(sizes, 2304, 8192, 0, True)[-2:] == [2048, 2304]
    assert filter_cuda_graph_batch_sizes(sizes, 2304, 8192, 0, False)[-1] == 2048
    assert filter_cuda_graph_batch_sizes(sizes, 640, 2048, 0, True)[-1] == 640
    assert filter_cuda_graph_batch_sizes(sizes, 4096, 3000, 2, True)[-1] == 1000  # 3000 / (1 + 2)
    assert filter_cuda_graph_batch_sizes((1, 2, 4), 8, 8192, 0, True) == [1, 2, 4]  # none above: no pad size


def test_every_trtllm_bench_row_graphs_every_decode_batch_it_can_schedule():
    """Each row's engine.overhead.cuda_graph_max_batch is what its engine captures up to
    (trtllm_bench_settings), and that is every decode batch it can form: min(max_num_seqs,
    max_num_batched_tokens). The profile resolved for the row carries it."""
    rows = _bench_rows()
    assert len(rows) >= 70
    capped_above_2048 = 0
    for r in rows:
        e = r.scenario["engine"]
        model = replace(get_model(r.scenario["model"]), quantization=e.get("quantization"))
        syn = r.scenario["workload"]["synthetic"]
        isl, osl = syn["input_tokens"]["value"], syn["output_tokens"]["value"]
        tp = r.scenario.get("cluster", {}).get("tensor_parallel_size", 1)
        pp = r.scenario.get("cluster", {}).get("pipeline_parallel_size", 1)
        want = trtllm_bench_settings(model, get_gpu(r.scenario["hardware"]["gpu"]), tp, pp, e.get("kv_cache_dtype"),
                                     isl, osl, max_isl=isl, max_seq_len=isl + osl,
                                     kv_fraction=e["gpu_memory_utilization"])
        cap = (e.get("overhead") or {}).get("cuda_graph_max_batch")
        assert cap == want.cuda_graph_max_batch == min(e["max_num_seqs"], e["max_num_batched_tokens"]), r.id
        assert get_profile(e["profile"], {"cuda_graph_max_batch": cap}).graphed(e["max_num_seqs"], False), r.id
        capped_above_2048 += cap > 2048
    assert capped_above_2048 >= 5  # the rows the profile's fixed 2048 priced eager


def test_the_4096_row_replays_a_graph_for_a_3000_sequence_decode():
    """VC-14 H100 128/128 (max_batch_size 4096) as simulated: a decode-only step of 3,000
    sequences replays the engine's captured graph (no eager launches); a step with a prompt
    does not (graphs are decode-only)."""
    from sim.engine.deployment import engine_profile

    row = next(r for r in _bench_rows() if r.id == "VC-14/h100-sxm/128-128")
    p = engine_profile(scenario_from_dict(row.scenario).engine)
    assert p.cuda_graph_max_batch == 4096 and p.graphed(3000, False) and not p.graphed(3000, True)
    assert p.host_terms(3000, False, 1, 32)[1] == 0.0


def _trt2023(budget: int, prompt: int, max_model_len: int = 4096) -> dict:
    over = small_scenario(engine={"policy": "static", "profile": "trt-llm-2023", "max_num_batched_tokens": budget,
                                  "max_num_seqs": 4, "max_model_len": max_model_len, "api_server": False})
    over["workload"] = {"max_tokens": "output", "synthetic": {
        "num_requests": 4, "request_rate": 100, "input_tokens": {"dist": "fixed", "value": prompt},
        "output_tokens": {"dist": "fixed", "value": 16}}}
    return over


def test_gptsession_budget_need_not_cover_max_model_len():
    """trt-llm-2023 under static batching: a budget (the engine's max_input_len / max_num_tokens)
    below max_model_len (max_input_len + max_output_len) starts; prompts within it complete."""
    from sim.run import run_scenario

    assert get_profile("trt-llm-2023").budget_covers_max_model_len is False
    res = run_scenario(scenario_from_dict(_trt2023(2048, 1024)))
    assert int((res.requests["status"] == "completed").sum()) == 4


def test_gptsession_fails_a_prompt_above_its_input_bound_with_its_reason():
    from sim.run import run_scenario

    res = run_scenario(scenario_from_dict(_trt2023(2048, 3000)))
    assert int((res.requests["status"] == "failed").sum()) == 4
    reason = str(res.requests["fail_reason"][0])
    assert "max_num_batched_tokens 2048" in reason and "TensorRT-LLM" in reason and "vLLM" not in reason


@pytest.mark.parametrize("profile", [p for p in PROFILE_NAMES if p.startswith("trt-llm")])
def test_no_tensorrt_llm_profile_applies_vllms_start_up_rule(profile):
    """Every TensorRT-LLM profile: a budget below max_model_len without chunked prefill is never
    refused with vLLM's SchedulerConfig rule, under any whole-prompt policy."""
    assert get_profile(profile).budget_covers_max_model_len is False
    for policy in ("static", "continuous"):
        over = small_scenario(engine={"policy": policy, "profile": profile, "max_num_batched_tokens": 2048,
                                      "max_num_seqs": 4, "max_model_len": 4096})
        try:
            scenario_from_dict(over)
        except UserError as e:  # any other refusal must not be vLLM's max_model_len rule
            assert "max_model_len" not in str(e) or "SchedulerConfig" not in str(e), (profile, policy, str(e))
