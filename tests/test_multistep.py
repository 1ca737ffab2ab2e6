"""Engine scheduling modes of older engines: vLLM 0.6 multi-step scheduling
(``engine.num_scheduler_steps``), prompts in steps of their own (``separate_prefill_steps``:
vLLM V0 without chunked prefill, SGLang without --enable-mixed-chunk) and TensorRT-LLM's
GUARANTEED_NO_EVICT capacity scheduler (``capacity_scheduler_policy``)."""

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sim.metrics.summary import summarize
from sim.core.kv import KVBlockManager
from sim.core.request import Request
from sim.cost.engine_fit import fit_output_processing
from sim.cost.engine_profile import get_profile
from sim.errors import UserError
from sim.policies.base import EngineLimits
from sim.policies.continuous import ContinuousScheduler
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from tests.conftest import without_wall_clock

ROOT = Path(__file__).resolve().parents[1]


def _sched(**kw) -> ContinuousScheduler:
    blocks = kw.pop("blocks", 1000)
    return ContinuousScheduler(EngineLimits(max_num_batched_tokens=4096, **kw), KVBlockManager(blocks, 16))


def test_a_multi_step_block_runs_all_its_steps_past_a_finish():
    s = _sched(num_scheduler_steps=10)
    a, b = Request(0, 0.0, 20, 4), Request(1, 0.0, 20, 30)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    s.on_step_done(s.schedule(0.0), 0.01)       # both prefilled: first tokens
    plan = s.schedule(0.01)
    assert plan.block and plan.num_steps == 10  # not cut at a's finish (3 more tokens)
    finished = s.on_step_done(plan, 0.2)
    assert finished == [a] and a.finish_s == 0.2
    assert a.num_generated == 4                 # tokens past its end are dropped
    assert s.tokens_emitted == 2 + 3 + 10
    assert s.burst_gaps_s == [pytest.approx(0.19)] * 2  # one gap per sequence, to the block's end


def test_multi_step_frees_every_kv_block():
    s = _sched(num_scheduler_steps=8)
    reqs = [Request(i, 0.0, 17 + 5 * i, 3 + 7 * i) for i in range(6)]
    for r in reqs:
        s.add_request(r, 0.0)
    t = 0.0
    while s.running or s.waiting:
        t += 0.01
        s.on_step_done(s.schedule(t), t)
    assert all(r.status == "completed" and r.num_generated == r.output_tokens for r in reqs)
    assert s.kv.num_used == 0 and s.tokens_emitted == sum(r.output_tokens for r in reqs)


@pytest.mark.parametrize("key", [{"num_scheduler_steps": 4}, {"separate_prefill_steps": True}])
def test_a_waiting_prompt_gets_a_step_of_its_own(key):
    s = _sched(**key)
    a = Request(0, 0.0, 20, 50)
    s.add_request(a, 0.0)
    s.on_step_done(s.schedule(0.0), 0.01)
    s.add_request(Request(1, 0.01, 30, 5), 0.01)
    plan = s.schedule(0.01)
    assert [r.request_id for r, _ in plan.chunks] == [1] and plan.num_decode_seqs == 0  # decodes paused
    s.on_step_done(plan, 0.02)
    assert a.num_generated == 1                     # a got no token in that step
    assert s.schedule(0.02).num_decode_seqs == 2    # then both decode


def test_without_the_keys_a_prompt_joins_the_decodes():
    s = _sched()
    s.add_request(Request(0, 0.0, 20, 50), 0.0)
    s.on_step_done(s.schedule(0.0), 0.01)
    s.add_request(Request(1, 0.01, 30, 5), 0.01)
    plan = s.schedule(0.01)
    assert plan.num_decode_seqs == 1 and len(plan.chunks) == 1 and not plan.block


def _run(engine: dict, n=40, rate=4.0, out=120, **kw) -> dict:
    raw = {"name": "ms", "model": "llama-3-8b", "hardware": {"gpu": "a100-80g"},
           "engine": {"policy": "continuous", "profile": "vllm-v0", **engine},
           "workload": {"synthetic": {"num_requests": n, "request_rate": rate,
                                      "input_tokens": {"dist": "fixed", "value": 200},
                                      "output_tokens": {"dist": "fixed", "value": out}}}}
    return summarize(run_scenario(scenario_from_dict(raw), **kw))


def test_multi_step_bursts_itl_and_delays_first_tokens():
    """vLLM 0.6.0 with --num-scheduler-steps 10 (sglang benchmark_vllm_060): median ITL about
    10 x TPOT (tokens come out once per block) and a TTFT that waits for the running block: on
    average a fraction of a block (the mean over 120 arrivals: the median of 40 moved from just
    above 0.3 blocks to under it with a 10% change of the step's GEMM time, issue 37)."""
    one, ten = _run({}, n=120), _run({"num_scheduler_steps": 10}, n=120)
    assert one["median_itl_ms"] == pytest.approx(one["median_tpot_ms"], rel=0.15)
    assert 8 <= ten["median_itl_ms"] / ten["median_tpot_ms"] <= 11
    assert ten["mean_ttft_ms"] > one["mean_ttft_ms"] + 0.3 * ten["median_itl_ms"]
    # one gap per block: (out - 1) tokens after the first in blocks of 10 (plus partial ones)
    assert ten["simsrv_num_itl_samples"] < 0.2 * one["simsrv_num_itl_samples"]


def test_multi_step_costs_the_same_single_stepped():
    """A block is costed piece by piece; capping each piece at one step changes nothing."""
    a = _run({"num_scheduler_steps": 10}, n=25, rate=math.inf)
    b = _run({"num_scheduler_steps": 10}, n=25, rate=math.inf, max_run_steps=1)
    for k in ("mean_ttft_ms", "p99_tpot_ms", "p50_itl_ms", "p99_itl_ms", "mean_e2el_ms"):
        assert a[k] == pytest.approx(b[k], rel=1e-3), k


def test_multi_step_amortises_scheduling_not_output_processing():
    p = get_profile("vllm-v0")
    m = replace(p, num_scheduler_steps=10)
    full = p.cpu_s(100, False, 1)
    out = p.output_step_s + p.output_per_seq_s * 100
    assert 0 < out < full
    assert m.cpu_s(100, False, 1) == pytest.approx((full - out) / 10 + out)
    assert m.cpu_s(100, True, 1) == p.cpu_s(100, True, 1)  # a prompt step is a single step
    fit = fit_output_processing(ROOT / "kernels_profile")
    assert p.output_step_s * 1e3 == pytest.approx(fit["step_ms"], rel=1e-3)
    assert p.output_per_seq_s * 1e3 == pytest.approx(fit["per_seq_ms"], rel=1e-3)


def test_guaranteed_no_evict_admits_only_what_can_finish():
    # 10 blocks of 16: each request needs ceil((40 + 60 - 1) / 16) = 7 blocks at its end
    s = _sched(blocks=10, capacity_scheduler_policy="guaranteed_no_evict")
    a, b = Request(0, 0.0, 40, 60), Request(1, 0.0, 40, 60)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    plan = s.schedule(0.0)
    assert [r.request_id for r, _ in plan.chunks] == [0] and list(s.waiting) == [b]
    t = 0.0
    while s.running or s.waiting:
        t += 0.01
        s.on_step_done(s.schedule(t), t)
    assert s.num_preemptions == 0 and s.reserved_blocks == 0
    on_demand = _sched(blocks=10)
    for r in (Request(0, 0.0, 40, 60), Request(1, 0.0, 40, 60)):
        on_demand.add_request(r, 0.0)
    while on_demand.running or on_demand.waiting:
        t += 0.01
        on_demand.on_step_done(on_demand.schedule(t), t)
    assert on_demand.num_preemptions > 0  # vLLM-style: both admitted, one preempted later


@pytest.mark.parametrize("engine,words", [
    ({"policy": "chunked", "num_scheduler_steps": 8}, "num_scheduler_steps"),
    ({"policy": "continuous", "num_scheduler_steps": 8, "preemption_mode": "swap"}, "num_scheduler_steps"),
    ({"policy": "chunked", "separate_prefill_steps": True}, "separate_prefill_steps"),
    ({"policy": "static", "capacity_scheduler_policy": "guaranteed_no_evict"}, "capacity_scheduler_policy"),
])
def test_unsupported_combinations_are_clear_errors(engine, words):
    raw = {"name": "x", "engine": engine,
           "workload": {"synthetic": {"num_requests": 2, "request_rate": 1.0}}}
    with pytest.raises(UserError, match=words):
        scenario_from_dict(raw)


def test_multi_step_run_is_deterministic():
    a = _run({"num_scheduler_steps": 10}, n=30, rate=6.0)
    b = _run({"num_scheduler_steps": 10}, n=30, rate=6.0)
    assert without_wall_clock(a) == without_wall_clock(b)
    assert np.isfinite(a["median_itl_ms"])


@pytest.mark.parametrize("engine", [{}, {"separate_prefill_steps": True}, {"num_scheduler_steps": 6}])
def test_inter_token_gaps_add_up_to_each_requests_decode_time(engine):
    """Every gap between a request's consecutive outputs is counted once: the ITL samples sum to
    the requests' (finish - first token), whether decodes pause for prompt steps or tokens come
    out in multi-step bursts; one sample per token after the first unless bursts merge them."""
    raw = {"name": "gaps", "model": "llama-3-8b", "hardware": {"gpu": "a100-80g"},
           "engine": {"policy": "continuous", "profile": "vllm-v0", **engine},
           "workload": {"synthetic": {"num_requests": 60, "request_rate": 8.0,
                                      "input_tokens": {"dist": "lognormal", "mean": 400, "sigma": 0.8, "max": 2000},
                                      "output_tokens": {"dist": "lognormal", "mean": 80, "sigma": 0.8, "max": 400}}}}
    res = run_scenario(scenario_from_dict(raw))
    s = summarize(res)
    rq = res.requests
    assert s["simsrv_num_preemptions"] == 0
    decode_s = float((rq["finish_s"] - rq["first_token_s"]).sum())
    assert s["mean_itl_ms"] * s["simsrv_num_itl_samples"] / 1e3 == pytest.approx(decode_s, rel=1e-6)
    tokens_after_first = int((rq["output_tokens"] - 1).sum())
    if "num_scheduler_steps" in engine:
        assert s["simsrv_num_itl_samples"] < tokens_after_first / 3
    else:
        assert s["simsrv_num_itl_samples"] == tokens_after_first
