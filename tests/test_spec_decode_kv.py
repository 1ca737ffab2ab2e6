"""Speculative decoding's KV slots (issue 40 item 1): a decoding sequence holds the blocks of its
context, its k draft slots and the drafter's lookahead (vLLM V1 ``allocate_slots(...,
num_lookahead_tokens)``), rejected drafts' slots reused by the next step; KV pressure and
preemption see them (sim/policies/base.py ``spec_slots``)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.kv import KVBlockManager
from sim.core.request import Request
from sim.cost.speculative import lookahead_tokens
from sim.engine.cluster import simulate
from sim.engine.deployment import build_deployment
from sim.engine.router import make_router
from sim.policies import POLICIES, EngineLimits
from sim.policies.chunked import ChunkedScheduler
from sim.scenario import scenario_from_dict
from sim.workload import RequestArrays

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (pytest's importlib mode: tests/ is not on the path)
from test_properties import COST, _check, workloads  # noqa: E402


def _limits(k: int, lookahead: int, milli: int, **kw) -> EngineLimits:
    return EngineLimits(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=10_000, num_speculative_tokens=k,
                        spec_tokens_per_step_milli=milli, num_lookahead_tokens=lookahead, **kw)


@pytest.mark.parametrize("k,lookahead,milli,bs", [(3, 3, 2000, 4), (3, 0, 2000, 4), (2, 2, 3000, 16),
                                                  (4, 4, 1000, 1), (3, 3, 1500, 4), (5, 5, 2890, 16)])
def test_a_decode_holds_context_drafts_and_lookahead(k, lookahead, milli, bs):
    """One sequence alone: in the decode step at context m it holds the blocks of
    m + 1 + k + L slots, as vLLM V1 allocates them (1 + k scheduled tokens and L lookahead past
    the num_computed_tokens m), exactly when the step emits ceil(E) tokens and at most one slot
    fewer when it emits floor(E); never more."""
    s = ChunkedScheduler(_limits(k, lookahead, milli), KVBlockManager(10_000, bs))
    prompt, out = 37, 60
    s.add_request(Request(0, 0.0, prompt, out, out), 0.0)
    t, m, decode_steps = 0.0, prompt, 0
    while s.running or s.waiting:
        t += 0.01
        plan = s.schedule(t)
        if plan.num_decode_seqs:
            emits = s.decode.spec_step_tokens()
            vllm = -(-(m + 1 + k + lookahead) // bs)
            used = s.kv.num_used
            if emits == -(-milli // 1000):
                assert used == vllm, (m, emits)
            else:
                assert vllm - 1 <= used <= vllm and used >= -(-(m + k + lookahead) // bs), (m, emits)
            m += emits
            decode_steps += 1
        s.on_step_done(plan, t)
    assert decode_steps >= 10
    assert s.kv.num_used == 0 and s.kv.decode_blocks == 0  # all given back


def test_lookahead_per_method():
    """vLLM's num_lookahead_tokens: k for the drafters with KV of their own, 0 for ngram."""
    for method in ("eagle", "eagle3", "mtp", "draft_model"):
        assert lookahead_tokens(method, 3) == 3
    assert lookahead_tokens("ngram", 3) == 0


def test_deployment_passes_the_lookahead():
    raw = {"name": "kv", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
           "engine": {"speculative_config": {"method": "eagle", "num_speculative_tokens": 3, "acceptance_length": 2.0}},
           "workload": {"synthetic": {"num_requests": 2, "request_rate": 1.0}}}
    assert build_deployment(scenario_from_dict(raw)).limits.num_lookahead_tokens == 3
    raw["engine"]["speculative_config"]["method"] = "ngram"
    assert build_deployment(scenario_from_dict(raw)).limits.num_lookahead_tokens == 0


def _preemptions(k: int, lookahead: int, blocks: int) -> int:
    n = 40
    w = RequestArrays(np.zeros(n), np.full(n, 100), np.full(n, 200))
    sched = POLICIES["chunked"](_limits(k, lookahead, 2000), KVBlockManager(blocks, 16))
    reqs, _ = simulate(w, [sched], [COST], make_router("round_robin"))
    assert all(r.status == "completed" for r in reqs)
    return sched.num_preemptions


def test_slots_add_kv_pressure_and_preemption():
    """40 sequences of 100 + 200 tokens in 400 blocks of 16 (each needs ~19 at its end): the
    lookahead's and drafts' slots make the cache run short sooner, so EAGLE (L = k = 4)
    preempts more than n-gram (L = 0), and both more than the accepted tokens alone would."""
    eagle, ngram = _preemptions(4, 4, 400), _preemptions(4, 0, 400)
    assert eagle > ngram > 0


def test_admission_counts_the_slots():
    """A request whose context, drafts and lookahead cannot fit the whole cache is refused,
    naming the blocks; one slot shy of that fits."""
    k, lookahead, bs = 3, 3, 16
    # its longest: prompt + output - 1 context, + ceil(E) - 1 past its end, + spec_slots (k + L)
    slots = 100 + 60 - 1 + 1 + (k + lookahead + 1 - 2)
    need = -(-slots // bs)
    s = ChunkedScheduler(_limits(k, lookahead, 2000), KVBlockManager(need - 1, bs))
    r = Request(0, 0.0, 100, 60, 60)
    assert not s.add_request(r, 0.0) and f"needs {need} KV blocks" in r.fail_reason
    s = ChunkedScheduler(_limits(k, lookahead, 2000), KVBlockManager(need, bs))
    assert s.add_request(Request(1, 0.0, 100, 60, 60), 0.0)


@settings(max_examples=40, deadline=None)
@given(w=workloads(), policy=st.sampled_from(["chunked", "continuous"]), blocks=st.integers(3, 60),
       bs=st.sampled_from([1, 4, 16]), budget=st.integers(64, 600), seqs=st.integers(1, 40),
       k=st.integers(1, 6), e_frac=st.floats(0.0, 1.0), eagle=st.booleans(), caching=st.booleans(),
       mode=st.sampled_from(["recompute", "swap"]))
def test_slot_invariants(w, policy, blocks, bs, budget, seqs, k, e_frac, eagle, caching, mode):
    """With lookahead slots, under any load and KV size: nothing lost, KV within capacity and
    all given back, every output token emitted once (tests/test_properties.py ``_check``)."""
    milli = 1000 + int(round(e_frac * k * 1000))
    limits = EngineLimits(max_num_seqs=min(seqs, budget), max_num_batched_tokens=budget, max_model_len=10_000,
                          preemption_mode=mode, num_speculative_tokens=k, spec_tokens_per_step_milli=milli,
                          num_lookahead_tokens=k if eagle else 0)
    scheds = [POLICIES[policy](limits, KVBlockManager(blocks, bs, caching))]
    reqs, rec = simulate(w, scheds, [COST], make_router("round_robin"), swap_s_per_block=1e-5)
    _check(w, reqs, rec, scheds, [blocks])
