"""Invariants over random workloads (hypothesis): nothing lost, KV within capacity, tokens conserved."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.cluster import simulate
from sim.cost.roofline import RooflineCostModel
from sim.spec.hardware import get_gpu
from sim.core.kv import KVBlockManager
from sim.metrics.vllm_bench import itl_samples, request_metrics
from sim.spec.models import get_model
from sim.policies import POLICIES, EngineLimits
from sim.policies.decode_set import DecodeSet
from sim.core.request import Request
from sim.engine.router import make_router
from sim.policies.disagg import DecodeScheduler, PrefillScheduler
from sim.engine.topology import Disaggregated, Links
from sim.core.ttft import ENGINE_TTFT_PARTS as TTFT_PARTS
from sim.workload import RequestArrays

COST = RooflineCostModel(get_model("llama-3-8b"), get_gpu("h100-sxm"), 1)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 60))
    gaps = draw(st.lists(st.floats(0, 0.5), min_size=n, max_size=n))
    inp = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    out = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    gaps[0] = 0.0
    # prompts share a prefix drawn from 3 groups of hash-id chains (16 tokens per id)
    groups = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    hash_ids = [np.array([g * 1000 + j for j in range(-(-p // 16))]) for g, p in zip(groups, inp)]
    return RequestArrays(np.cumsum(gaps), np.array(inp), np.array(out), hash_ids=hash_ids, hash_block_size=16)


def _check(w, reqs, rec, scheds, capacity):
    # every request ends completed or failed, none lost
    assert len(reqs) == len(w)
    assert {r.status for r in reqs} <= {"completed", "failed"}
    for r in reqs:
        if r.status == "failed":
            assert r.fail_reason
        else:
            assert r.arrival_s <= r.first_scheduled_s <= r.first_token_s <= r.finish_s
            # the TTFT decomposition adds up exactly, with no negative part
            parts = [getattr(r, p) for p in TTFT_PARTS]
            assert sum(parts) == pytest.approx(r.first_token_s - r.arrival_s, rel=1e-9, abs=1e-9)
            assert min(parts) >= -1e-12
    # KV blocks in use never exceed capacity, and all are returned
    steps = rec.step_columns()
    for s, cap in zip(scheds, capacity):
        assert s.kv.peak_used <= cap and s.kv.num_used == 0
        # the KV manager counted every block and gave each back: none left in a table, in the
        # decode set's aggregate, in host memory or held for a handoff
        assert s.kv.decode_blocks == 0 and s.kv.num_held == 0 and not s.kv._host_blocks
        assert all(not t.num_blocks and not t.held for t in s.kv.tables.values())
        # the free queue holds every block again, cached ones among them
        assert sum(e.count for e in s.kv.free_queue()) == s.kv.num_free == cap and s.kv.num_cached <= cap
    assert (steps["kv_blocks_used"] <= max(capacity)).all()
    # output tokens produced equal those requested by completed requests
    done = [r for r in reqs if r.status == "completed"]
    assert sum(s.tokens_emitted for s in scheds) == sum(r.output_tokens for r in done)
    # pooled inter-token gaps add up to each request's (e2e - ttft), summed
    itl = itl_samples(steps, rec.resume_gaps_s, rec.itl_adjust)
    m = request_metrics({
        "status": np.array([r.status for r in reqs]), "arrival_s": np.array([r.arrival_s for r in reqs]),
        "first_token_s": np.array([r.first_token_s for r in reqs]), "finish_s": np.array([r.finish_s for r in reqs]),
        "first_scheduled_s": np.array([r.first_scheduled_s for r in reqs]),
        "output_tokens": np.array([r.output_tokens for r in reqs]),
    })
    decode_time = np.nansum(m["e2el_s"] - m["ttft_s"])
    assert itl.sum_s() == pytest.approx(decode_time, rel=1e-9, abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(w=workloads(), policy=st.sampled_from(sorted(POLICIES)), blocks=st.integers(3, 60),
       bs=st.sampled_from([1, 4, 16]), budget=st.integers(64, 600), seqs=st.integers(1, 40),
       replicas=st.integers(1, 3), router=st.sampled_from(["round_robin", "least_outstanding", "least_kv",
                                                           "prefix_affinity"]),
       mode=st.sampled_from(["recompute", "swap"]), caching=st.booleans())
def test_invariants(w, policy, blocks, bs, budget, seqs, replicas, router, mode, caching):
    limits = EngineLimits(max_num_seqs=min(seqs, budget), max_num_batched_tokens=budget, max_model_len=10_000,
                          preemption_mode=mode)
    scheds = [POLICIES[policy](limits, KVBlockManager(blocks, bs, caching)) for _ in range(replicas)]
    reqs, rec = simulate(w, scheds, [COST] * replicas, make_router(router), swap_s_per_block=1e-5)
    _check(w, reqs, rec, scheds, [blocks] * replicas)


class _CheckedDecode(DecodeScheduler):
    def _on_kv_admitted(self, req, now):
        assert req.transfer_end_s <= now  # no request admitted to decode before its KV arrived
        super()._on_kv_admitted(req, now)


@settings(max_examples=60, deadline=None)
@given(w=workloads(), pblocks=st.integers(20, 60), dblocks=st.integers(3, 60), bs=st.sampled_from([4, 16]),
       np_=st.integers(1, 2), nd=st.integers(1, 3), bw=st.floats(1e6, 1e9), caching=st.booleans(),
       on_decode=st.booleans(), layers=st.sampled_from([1, 4]), ingress=st.sampled_from([0.5, 1.0, 4.0]))
def test_disaggregated_invariants(w, pblocks, dblocks, bs, np_, nd, bw, caching, on_decode, layers, ingress):
    limits = EngineLimits(max_num_seqs=16, max_num_batched_tokens=512, max_model_len=10_000)
    prefill = [PrefillScheduler(limits, KVBlockManager(pblocks, bs, caching)) for _ in range(np_)]
    decode = [_CheckedDecode(limits, KVBlockManager(dblocks, bs)) for _ in range(nd)]
    for s in prefill:
        s.first_token_on_decode = on_decode

    def topo(env, rec, on_finish):
        return Disaggregated(env, prefill, [COST] * np_, decode, [COST] * nd, make_router("least_outstanding"),
                             1000.0, Links(bw, bw * ingress, 1e-4, layers), rec, on_finish)

    reqs, rec = simulate(w, topology=topo)
    _check(w, reqs, rec, [*prefill, *decode], [pblocks] * np_ + [dblocks] * nd)
    for s in prefill:
        assert s.kv.num_held == 0
    for r in reqs:
        if r.status == "completed" and (r.output_tokens > 1 or on_decode) and layers == 1:
            isolated_s = r.prompt_tokens * 1000.0 / (bw * min(1.0, ingress)) + 1e-4
            # LinkNetwork.pop_done counts a transfer done with up to eps_bytes (1e-3) left
            resolution_s = 1e-3 / (bw * min(1.0, ingress))
            assert r.transfer_end_s - r.transfer_start_s >= isolated_s * (1 - 1e-9) - resolution_s
        if r.status == "completed" and on_decode:  # TTFT includes the whole transfer
            assert r.first_token_s >= r.transfer_end_s and r.ttft_kv_transfer_s > 0


@settings(max_examples=200, deadline=None)
@given(bs=st.sampled_from([1, 2, 4, 16]), steps0=st.integers(0, 100),
       seqs=st.lists(st.tuples(st.integers(1, 200), st.integers(1, 8)), min_size=1, max_size=25),
       k=st.integers(0, 80), free=st.integers(0, 200))
def test_decode_set_block_lookahead_matches_brute_force(bs, steps0, seqs, k, free):
    kv = KVBlockManager(10**6, bs)
    ds = DecodeSet(kv)
    ds.steps = steps0
    ns = []
    for i, (p, g) in enumerate(seqs):
        r = Request(i, 0.0, p, 10_000)
        r.num_generated = g
        assert kv.allocate(r, p + g - 1)
        ds.add(r)
        ns.append(p + g - 1)

    def brute(steps):
        return sum(1 for n in ns for j in range(steps) if (n + j) % bs == 0)

    assert ds.blocks_needed(k) == brute(k)
    km = ds.max_steps_within(free)
    assert brute(km) <= free < brute(km + 1)
