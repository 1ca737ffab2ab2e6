"""Closed-loop clients against TensorRT-LLM (issue 37, "Closed-loop clients phase-lock").

A TensorRT-LLM measurement simulated with vLLM's scheduler defaults (policy ``chunked``,
capacity scheduler ``max_utilization``) splits a second waiting context across two 8,192-token
steps, so a closed-loop client queues behind more than one other client's prefill. TensorRT-LLM's
own defaults run each context whole, one per step beside the decodes: in-flight batching without
context chunking (ExecutorConfig enableChunkedContext = false, cpp/include/tensorrt_llm/executor/
executor.h; TensorRT-LLM docs "Long Sequences": chunked context is enabled by setting
enable_chunked_prefill) and the GUARANTEED_NO_EVICT capacity scheduler (docs "Useful Runtime
Options": the default). Every validation case of a TensorRT-LLM engine states them.
"""

from __future__ import annotations

import copy

import pytest

from sim.analysis.validate import load_rows, validation_dir
from sim.run import run_scenario
from sim.scenario import scenario_from_dict

TRTLLM_PROFILES = ("trt-llm", "trt-llm-2023")
IN_FLIGHT_POLICIES = ("continuous", "chunked")


def _trtllm_rows():
    return [r for r in load_rows() if r.scenario and (r.scenario.get("engine") or {}).get("profile") in TRTLLM_PROFILES]


def test_trtllm_cases_state_their_scheduler():
    """No TensorRT-LLM case inherits vLLM's scheduler defaults: each names its policy, and an
    in-flight-batching one its capacity scheduler policy too."""
    rows = _trtllm_rows()
    assert rows
    for r in rows:
        engine = r.scenario["engine"]
        assert "policy" in engine or "enable_chunked_prefill" in engine, f"{r.id}: engine.policy not given"
        if engine.get("policy") in IN_FLIGHT_POLICIES:
            assert "capacity_scheduler_policy" in engine, f"{r.id}: engine.capacity_scheduler_policy not given"


def _vc43(concurrency: int, num_requests: int):
    row = next(r for r in load_rows() if r.id == "VC-43/c25/ttft")
    scen = copy.deepcopy(row.scenario)
    scen["workload"]["synthetic"].update(num_requests=num_requests, max_concurrency=concurrency, warmup_requests=0)
    return run_scenario(scenario_from_dict(scen, "VC-43 test", base_dir=str(validation_dir())))


def test_trtllm_runs_each_context_whole_one_per_step():
    """Without context chunking, a 5,000-token context under max_num_tokens 8,192 runs in one
    step of its own (beside the decodes): no step holds part of one or two of them."""
    res = _vc43(10, 40)
    assert set(res.step_column("prefill_tokens").tolist()) <= {0, 5000}


@pytest.mark.parametrize("concurrency", [10, 25, 50])
def test_closed_loop_client_waits_behind_at_most_one_prefill(concurrency):
    """Once every client is running (after the first wave, which all arrive at once), a request
    arriving during another client's prefill step waits for that step and then runs its own:
    its TTFT is at most two prefill steps (plus the front end's milliseconds), never a chain."""
    res = _vc43(concurrency, 3 * concurrency)
    prefill = res.step_column("prefill_tokens") > 0
    longest_prefill_step_s = float(res.step_column("duration_s")[prefill].max())
    ttft_s = (res.request_column("first_token_s") - res.request_column("arrival_s"))[concurrency:]
    assert ttft_s.max() <= 2 * longest_prefill_step_s + 0.05
