"""SGLang 0.3 admission (sim/policies/admission.py): the new_token_ratio estimate, the exact
ignore_eos check with the radix cache off, retract_decode, and the default left as it was."""

from __future__ import annotations

import pytest

from sim.metrics.summary import summarize
from sim.core.kv import KVBlockManager
from sim.core.request import Request
from sim.errors import UserError
from sim.policies import admission as adm
from sim.policies.base import EngineLimits
from sim.policies.continuous import ContinuousScheduler
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from tests.conftest import without_wall_clock


def _sched(blocks: int, prefix_caching: bool, **kw) -> ContinuousScheduler:
    # bench_serving's requests: max_new_tokens = the output length, ignore_eos (the Request's
    # fifth argument; EngineLimits.ignore_eos)
    return ContinuousScheduler(EngineLimits(max_num_batched_tokens=4096, admission="sglang", ignore_eos=True, **kw),
                               KVBlockManager(blocks, 16, enable_prefix_caching=prefix_caching))


def _drain(s: ContinuousScheduler, t: float = 0.0) -> float:
    while s.running or s.waiting:
        t += 0.01
        plan = s.schedule(t)
        if plan.idle:
            break
        s.on_step_done(plan, t)
    return t


def test_ratio_estimate_admission_by_hand():
    # 20 blocks x 16 = 320 free tokens. a (100 in, 100 out) is admitted alone: 100 + 100 < 320.
    s = _sched(20, prefix_caching=True)
    a, b = Request(0, 0.0, 100, 100, 100), Request(1, 0.0, 100, 100, 100)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    plan = s.schedule(0.0)
    # in the same round b needs 100 + 100 = 200 of 320 - 200 = 120 left: not admitted
    assert [r.request_id for r, _ in plan.chunks] == [0] and list(s.waiting) == [b]
    s.on_step_done(plan, 0.01)
    # next round: free = 20 - ceil(100/16)=7 blocks -> 13 x 16 = 208 tokens; a has 99 to go at
    # ratio 0.7: 208 - 69.3 = 138.7; b needs 200 >= 138.7 -> still waits
    assert s.admission.new_token_ratio == pytest.approx(0.7)
    plan = s.schedule(0.01)
    assert not plan.chunks and plan.num_decode_seqs == 1


def test_ratio_decays_per_decode_step_and_resets_when_idle():
    s = _sched(100, prefix_caching=True)
    s.add_request(Request(0, 0.0, 20, 51, 51), 0.0)
    s.on_step_done(s.schedule(0.0), 0.01)
    plan = s.schedule(0.01)         # a run of 50 decode steps to its end
    assert plan.num_steps == 50
    s.on_step_done(plan, 0.5)
    assert s.admission.new_token_ratio == pytest.approx(0.7 - 50 * 0.001)
    assert s.schedule(0.6).idle     # idle: back to the initial ratio
    assert s.admission.new_token_ratio == adm.INIT_NEW_TOKEN_RATIO


def _one_running(prefix_caching: bool) -> ContinuousScheduler:
    s = _sched(40, prefix_caching)
    s.add_request(Request(0, 0.0, 16, 201, 201), 0.0)  # prefilled: 1 block, 200 tokens to go
    s.on_step_done(s.schedule(0.0), 0.01)
    s.add_request(Request(1, 0.01, 500, 10, 10), 0.01)
    return s


def test_exact_check_admits_what_the_estimate_refuses():
    # 39 free blocks = 624 tokens. Estimate: 624 - 200 x 0.7 = 484 < 500 + 10 -> refused.
    est = _one_running(prefix_caching=True)
    a = est.admission
    a.start_round(est)
    assert a._total_tokens == 624 and a._rem_tokens == pytest.approx(484.0)
    assert not a.admits(est, est.waiting[0])
    assert not est.schedule(0.01).chunks
    # radix cache off: the same quick check fails, then the exact one over (left, held) sorted:
    # b (10, 500), a (200, 17): i=0: 624 - 200 x 2 = 224 > 0; i=1: 624 + 500 - 200 > 0 -> admitted
    ex = _one_running(prefix_caching=False)
    a = ex.admission
    a.start_round(ex)
    assert a.admits(ex, ex.waiting[0])
    assert a._states == [(10, 500), (200, 17)]
    assert [r.request_id for r, _ in ex.schedule(0.01).chunks] == [1]


def test_retraction_frees_twenty_steps_per_decode_and_resets_the_ratio():
    # 12 blocks; three requests of 16 in, 100 out are admitted at ratio 0.7 with room to start,
    # then run out of KV while decoding: SGLang retracts instead of preempting the tail.
    s = _sched(12, prefix_caching=False)
    reqs = [Request(i, 0.0, 16, 100, 100) for i in range(3)]
    for r in reqs:
        s.add_request(r, 0.0)
    _drain(s)
    assert all(r.status == "completed" and r.num_generated == r.output_tokens for r in reqs)
    assert s.kv.num_used == 0
    assert s.admission.num_retractions == s.num_preemptions


def test_retract_decode_by_hand():
    # 12 blocks. a (16 in, 100 out) and b (30 in, 100 out) start together (admitted as vLLM
    # would, to reach the shortage fast); at their ends they would need 8 + 9 blocks
    s = ContinuousScheduler(EngineLimits(max_num_batched_tokens=4096), KVBlockManager(12, 16))
    a, b = Request(0, 0.0, 16, 100, 100), Request(1, 0.0, 30, 100, 100)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    s.on_step_done(s.schedule(0.0), 0.01)
    s.admission = adm.SGLangAdmission(exact_lengths=False)
    t = 0.01
    while not s.num_preemptions:
        t += 0.01
        s.on_step_done(s.schedule(t), t)
    # equal output counts: the longer prompt (b) leaves, to the back of the queue; the last one
    # always stays; the ratio becomes (a's decoded + 20) / a's max_new_tokens, counted before
    # the step that followed (one token ago), and that step does not decay it
    assert b.status == "waiting" and a.status == "running" and list(s.waiting) == [b]
    assert b.num_preemptions == 1 and s.admission.num_retractions == 1
    g = a.g_join + s.decode.steps - a.step_join - 1
    assert s.admission.new_token_ratio == pytest.approx(min(1.0, (g + 20) / 100))
    _drain(s, t)
    assert a.num_generated == 100 and b.num_generated == 100 and s.kv.num_used == 0


def test_a_lone_request_is_admitted_even_above_the_estimate():
    # SGLang clips max_new_tokens so that prompt + max_new_tokens fits the pool; here a request
    # alone is let in whatever the estimate says (9 blocks = 144 < 16 + 200)
    s = _sched(9, prefix_caching=True)
    r = Request(0, 0.0, 16, 112, 112)
    s.add_request(r, 0.0)
    _drain(s)
    assert r.status == "completed"


def _run(engine: dict, n=60) -> dict:
    raw = {"name": "adm", "model": "llama-3-8b", "hardware": {"gpu": "a100-80g"},
           "engine": {"policy": "continuous", "profile": "sglang", "separate_prefill_steps": True,
                      "gpu_memory_utilization": 0.25, **engine},
           "workload": {"max_tokens": "output", "synthetic": {"num_requests": n, "request_rate": float("inf"),
                                      "input_tokens": {"dist": "lognormal", "mean": 400, "sigma": 1.0,
                                                       "max": 2000},
                                      "output_tokens": {"dist": "lognormal", "mean": 300, "sigma": 0.9,
                                                        "max": 2000}}}}
    return summarize(run_scenario(scenario_from_dict(raw)))


def test_default_is_vllm_and_unchanged():
    assert EngineLimits().admission == "vllm"
    assert without_wall_clock(_run({})) == without_wall_clock(_run({"admission": "vllm"}))


@pytest.mark.parametrize("caching", [True, False])
def test_sglang_admission_is_deterministic_and_differs(caching):
    a = _run({"admission": "sglang", "enable_prefix_caching": caching})
    b = _run({"admission": "sglang", "enable_prefix_caching": caching})
    assert without_wall_clock(a) == without_wall_clock(b)
    assert without_wall_clock(a) != without_wall_clock(_run({"enable_prefix_caching": caching}))


def test_admission_needs_a_v1_style_policy():
    raw = {"name": "x", "engine": {"policy": "static", "admission": "sglang"},
           "workload": {"synthetic": {"num_requests": 2, "request_rate": 1.0}}}
    with pytest.raises(UserError, match="admission"):
        scenario_from_dict(raw)
