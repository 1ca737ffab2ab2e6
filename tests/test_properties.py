"""Invariants over random workloads (hypothesis): nothing lost, KV within capacity, tokens conserved."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster import simulate
from sim.cost.roofline import RooflineCostModel
from sim.hardware import get_gpu
from sim.kv import KVBlockManager
from sim.metrics import itl_samples, request_metrics
from sim.models import get_model
from sim.policies import POLICIES, EngineLimits
from sim.policies.decode_set import DecodeSet
from sim.request import Request
from sim.router import make_router
from sim.workload import RequestArrays

COST = RooflineCostModel(get_model("llama-3-8b"), get_gpu("h100-sxm"), 1)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 60))
    gaps = draw(st.lists(st.floats(0, 0.5), min_size=n, max_size=n))
    inp = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    out = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    gaps[0] = 0.0
    return RequestArrays(np.cumsum(gaps), np.array(inp), np.array(out))


@settings(max_examples=60, deadline=None)
@given(w=workloads(), policy=st.sampled_from(sorted(POLICIES)), blocks=st.integers(3, 60),
       bs=st.sampled_from([1, 4, 16]), budget=st.integers(64, 600), seqs=st.integers(1, 40),
       replicas=st.integers(1, 3), router=st.sampled_from(["round_robin", "least_outstanding", "least_kv"]))
def test_invariants(w, policy, blocks, bs, budget, seqs, replicas, router):
    limits = EngineLimits(max_num_seqs=min(seqs, budget), max_num_batched_tokens=budget, max_model_len=10_000)
    scheds = [POLICIES[policy](limits, KVBlockManager(blocks, bs)) for _ in range(replicas)]
    reqs, rec = simulate(w, scheds, [COST] * replicas, make_router(router))
    # every request ends completed or failed, none lost
    assert len(reqs) == len(w)
    assert {r.status for r in reqs} <= {"completed", "failed"}
    for r in reqs:
        if r.status == "failed":
            assert r.fail_reason
        else:
            assert r.arrival_s <= r.first_scheduled_s <= r.first_token_s <= r.finish_s
    # KV blocks in use never exceed capacity, and all are returned
    steps = rec.step_columns()
    assert (steps["kv_blocks_used"] <= blocks).all()
    assert all(s.kv.peak_used <= blocks and s.kv.num_used == 0 for s in scheds)
    # output tokens produced equal those requested by completed requests
    done = [r for r in reqs if r.status == "completed"]
    assert sum(s.tokens_emitted for s in scheds) == sum(r.output_tokens for r in done)
    # pooled inter-token gaps add up to each request's (e2e - ttft), summed
    gaps, counts = itl_samples(steps, rec.resume_gaps_s)
    m = request_metrics({
        "status": np.array([r.status for r in reqs]), "arrival_s": np.array([r.arrival_s for r in reqs]),
        "first_token_s": np.array([r.first_token_s for r in reqs]), "finish_s": np.array([r.finish_s for r in reqs]),
        "first_scheduled_s": np.array([r.first_scheduled_s for r in reqs]),
        "output_tokens": np.array([r.output_tokens for r in reqs]),
    })
    decode_time = np.nansum(m["e2el_s"] - m["ttft_s"])
    assert np.dot(gaps, counts) == __import__("pytest").approx(decode_time, rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(bs=st.sampled_from([1, 2, 4, 16]), steps0=st.integers(0, 100),
       seqs=st.lists(st.tuples(st.integers(1, 200), st.integers(1, 8)), min_size=1, max_size=25),
       k=st.integers(0, 80), free=st.integers(0, 200))
def test_decode_set_block_lookahead_matches_brute_force(bs, steps0, seqs, k, free):
    ds = DecodeSet(bs)
    ds.steps = steps0
    ns = []
    for i, (p, g) in enumerate(seqs):
        r = Request(i, 0.0, p, 10_000)
        r.num_generated = g
        r.num_blocks = -(-(p + g - 1) // bs)
        ds.add(r)
        ns.append(p + g - 1)

    def brute(steps):
        return sum(1 for n in ns for j in range(steps) if (n + j) % bs == 0)

    assert ds.blocks_needed(k) == brute(k)
    km = ds.max_steps_within(free)
    assert brute(km) <= free < brute(km + 1)
