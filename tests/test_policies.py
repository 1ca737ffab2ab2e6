"""Schedulers driven by hand through schedule() / on_step_done(), without SimPy."""
import pytest

from sim.core.kv import KVBlockManager
from sim.policies import EngineLimits
from sim.policies.chunked import ChunkedScheduler
from sim.policies.continuous import ContinuousScheduler
from sim.core.request import Request


def _sched(cls, blocks=1000, bs=16, **limits):
    return cls(EngineLimits(**limits), KVBlockManager(blocks, bs))


def _drive(s, now=0.0, dt=0.01, max_steps=10_000):
    """Run steps until idle; return (plans, finished requests)."""
    plans, done = [], []
    for _ in range(max_steps):
        plan = s.schedule(now)
        if plan.idle:
            return plans, done
        plans.append(plan)
        now += dt * plan.num_steps
        done += s.on_step_done(plan, now)
    raise AssertionError("did not finish")


def test_continuous_prefills_whole_prompt_in_one_step():
    s = _sched(ContinuousScheduler, max_num_batched_tokens=8192)
    s.add_request(Request(0, 0.0, 3000, 5), 0.0)
    plan = s.schedule(0.0)
    assert [(r.request_id, n) for r, n in plan.chunks] == [(0, 3000)]
    assert plan.num_decode_seqs == 0


def test_continuous_long_prompt_stalls_with_decodes_in_the_same_step():
    s = _sched(ContinuousScheduler, max_num_batched_tokens=16384, max_model_len=16384)
    s.add_request(Request(0, 0.0, 100, 50), 0.0)
    s.on_step_done(s.schedule(0.0), 0.01)
    s.add_request(Request(1, 0.0, 10000, 5), 0.01)
    plan = s.schedule(0.01)
    assert plan.num_decode_seqs == 1 and plan.prefill_tokens == 10000


def test_chunked_runs_decodes_first_then_chunks_within_budget():
    s = _sched(ChunkedScheduler, max_num_batched_tokens=512, max_num_seqs=64)
    s.add_request(Request(0, 0.0, 100, 50), 0.0)
    s.on_step_done(s.schedule(0.0), 0.01)  # request 0 now decoding
    s.add_request(Request(1, 0.0, 2000, 5), 0.01)
    chunks = []
    now = 0.01
    while 1 in s.prefilling or not chunks:
        plan = s.schedule(now)
        assert plan.num_decode_seqs == 1  # the decode rides along every step
        assert plan.num_decode_seqs + plan.prefill_tokens <= 512
        chunks += [n for r, n in plan.chunks if r.request_id == 1]
        now += 0.01
        s.on_step_done(plan, now)
    assert chunks == [511, 511, 511, 467]
    assert s.running[1].first_token_s == now


def test_long_prefill_token_threshold_caps_a_chunk():
    s = _sched(ChunkedScheduler, max_num_batched_tokens=2048, long_prefill_token_threshold=300)
    s.add_request(Request(0, 0.0, 1000, 2), 0.0)
    assert s.schedule(0.0).chunks[0][1] == 300


def test_max_num_partial_prefills_limits_concurrent_long_prompts():
    def first_plan(limit):
        s = _sched(ChunkedScheduler, max_num_batched_tokens=1024, long_prefill_token_threshold=400,
                   max_num_partial_prefills=limit)
        for i, n in enumerate((300, 2000, 2000)):
            s.add_request(Request(i, 0.0, n, 2), 0.0)
        return [(r.request_id, n) for r, n in s.schedule(0.0).chunks]

    assert first_plan(1) == [(0, 300), (1, 400)]  # request 2 would be a second partial prefill
    assert first_plan(2) == [(0, 300), (1, 400), (2, 324)]


def test_max_num_seqs_caps_the_batch():
    s = _sched(ContinuousScheduler, max_num_seqs=3)
    for i in range(5):
        s.add_request(Request(i, 0.0, 10, 100), 0.0)
    plan = s.schedule(0.0)
    assert len(plan.chunks) == 3 and len(s.waiting) == 2


def test_decode_run_is_fast_forwarded_to_the_first_finish():
    s = _sched(ContinuousScheduler)
    s.add_request(Request(0, 0.0, 10, 40), 0.0)
    s.add_request(Request(1, 0.0, 10, 25), 0.0)
    s.on_step_done(s.schedule(0.0), 0.01)
    plan = s.schedule(0.01)
    assert plan.num_steps == 24 and plan.num_decode_seqs == 2  # request 1 emits its 25th token
    done = s.on_step_done(plan, 0.5)
    assert [r.request_id for r in done] == [1]


def test_preempts_most_recent_request_when_kv_runs_out():
    # 8 blocks of 4 tokens; each request grows to 25 tokens (7 blocks): both cannot fit
    s = _sched(ContinuousScheduler, blocks=8, bs=4)
    a, b = Request(0, 0.0, 6, 20), Request(1, 0.0, 6, 20)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    plans, done = _drive(s)
    assert {r.request_id for r in done} == {0, 1}
    assert b.num_preemptions >= 1 and a.num_preemptions == 0  # the later admission is the victim
    assert s.kv.num_used == 0 and s.kv.peak_used == 8
    assert s.tokens_emitted == 40


def test_prompt_that_can_never_fit_fails_with_reason():
    s = _sched(ChunkedScheduler, blocks=10, bs=16, max_model_len=100_000)
    r = Request(0, 0.0, 500, 10)
    assert not s.add_request(r, 0.0)
    assert r.status == "failed" and "needs 32 KV blocks" in r.fail_reason and "has 10" in r.fail_reason
    assert s.schedule(0.0).idle


def test_prompt_over_max_model_len_fails():
    s = _sched(ContinuousScheduler, max_model_len=4096)
    r = Request(0, 0.0, 4000, 200, 200)  # sent with max_tokens 200 (none sent: it stops at the context's end)
    assert not s.add_request(r, 0.0)
    assert "max_model_len 4096" in r.fail_reason


def test_recompute_resumes_and_records_the_gap():
    s = _sched(ChunkedScheduler, blocks=6, bs=4, max_num_batched_tokens=64, max_num_seqs=4)
    reqs = [Request(i, 0.0, 7, 12) for i in range(3)]
    for r in reqs:
        s.add_request(r, 0.0)
    plans, done = _drive(s)
    assert len(done) == 3 and s.num_preemptions > 0
    assert s.tokens_emitted == 36
    assert len(s.resume_gaps_s) == sum(1 for _ in s.resume_gaps_s) and all(g > 0 for g in s.resume_gaps_s)


# -- static, swap, prefix caching, disaggregation ---------------------------------------------

from sim.policies.disagg import DecodeScheduler, PrefillScheduler  # noqa: E402
from sim.policies.static import StaticScheduler  # noqa: E402


def test_static_admits_nothing_until_the_batch_drains():
    s = _sched(StaticScheduler, max_num_seqs=2)
    for i, out in enumerate((3, 10, 5)):
        s.add_request(Request(i, 0.0, 50, out, out), 0.0)  # max_tokens sent: what the batch reserves
    plan = s.schedule(0.0)
    assert [r.request_id for r, _ in plan.chunks] == [0, 1]
    now, seen = 0.0, []
    while 2 not in s.running:
        now += 0.01
        s.on_step_done(plan, now)
        plan = s.schedule(now)
        seen.append({r.request_id for r, _ in plan.chunks})
        if 2 in {r.request_id for r, _ in plan.chunks}:
            break
    # request 2 entered only after request 1 (10 tokens) finished, not when request 0 did
    assert s.decode.num_seqs == 0 and 1 not in s.running


def test_swap_preemption_keeps_kv_and_skips_recompute():
    s = _sched(ContinuousScheduler, blocks=8, bs=4, preemption_mode="swap")
    a, b = Request(0, 0.0, 6, 20), Request(1, 0.0, 6, 20)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    plans, done = _drive(s)
    assert len(done) == 2 and b.num_preemptions >= 1
    assert s.num_swaps == b.num_preemptions
    assert sum(p.swap_blocks for p in plans) > 0          # copied out and back over PCIe
    assert sum(p.prefill_tokens for p in plans) == 12     # the prompts only: nothing recomputed
    assert s.tokens_emitted == 40


def test_prefix_cache_hit_skips_cached_blocks():
    from sim.core.kv import KVBlockManager
    import numpy as np

    s = ChunkedScheduler(EngineLimits(max_num_batched_tokens=4096), KVBlockManager(1000, 16, True))
    first, second = Request(0, 0.0, 100, 2), Request(1, 0.0, 100, 2)
    for r in (first, second):
        r.hash_ids, r.hash_block_size = np.arange(7), 16
    s.add_request(first, 0.0)
    s.on_step_done(s.schedule(0.0), 0.1)          # first's 6 full blocks are now cached
    s.add_request(second, 0.1)
    plan = s.schedule(0.1)
    chunk = dict((r.request_id, n) for r, n in plan.chunks)
    assert chunk[1] == 100 - 96                     # 6 blocks x 16 tokens hit
    assert s.kv.hit_tokens == 96 and s.kv.query_tokens == 200
    assert s.kv.num_used == 7 + 7 - 6               # the 6 shared blocks are counted once


def test_prefix_cache_evicts_lru_only_when_needed():
    from sim.core.kv import KVBlockManager
    import numpy as np

    kv = KVBlockManager(10, 16, True)
    s = ChunkedScheduler(EngineLimits(max_num_batched_tokens=4096), kv)
    r = Request(0, 0.0, 64, 1)
    r.hash_ids, r.hash_block_size = np.arange(4), 16
    s.add_request(r, 0.0)
    s.on_step_done(s.schedule(0.0), 0.1)  # finishes (1 output token); 4 blocks stay cached
    assert kv.num_used == 0 and kv.num_cached == 4 and kv.num_free == 10
    big = Request(1, 0.1, 150, 1)         # needs 10 blocks: evicts all 4 cached ones
    s.add_request(big, 0.1)
    s.schedule(0.1)
    assert kv.num_evicted == 4 and kv.num_cached == 0


def test_prefill_replica_holds_kv_until_decode_admits():
    limits = EngineLimits()
    p = PrefillScheduler(limits, KVBlockManager(100, 16))
    d = DecodeScheduler(limits, KVBlockManager(100, 16))
    d.on_admitted = p.release_handoff
    r = Request(0, 0.0, 40, 5)
    p.add_request(r, 0.0)
    p.on_step_done(p.schedule(0.0), 0.05)
    assert p.handoffs == [r] and r.first_token_s == 0.05 and p.kv.num_used == 3 and not p.running
    r.transfer_end_s = 0.06
    d.incoming += 1
    d.add_transferred(r)
    plan = d.schedule(0.06)                      # admitted straight to decode, no prefill
    assert plan.num_decode_seqs == 1 and not plan.chunks and plan.ready_gaps_s == [pytest.approx(0.01)]
    assert p.kv.num_used == 0 and d.kv.num_used == 3


def test_shared_link_splits_bandwidth_between_concurrent_transfers():
    from sim.engine.link import SharedLink

    link = SharedLink(100.0, 0.5)  # 100 bytes/s
    link.start("a", 100.0, 0.0)
    assert link.next_done_s() == pytest.approx(1.0)  # alone: 100 B at 100 B/s
    link.start("b", 100.0, 0.5)                      # from now on each gets 50 B/s
    assert link.next_done_s() == pytest.approx(1.5)  # a: 50 B left at 50 B/s
    assert link.pop_done(1.5) == ["a"]
    assert link.next_done_s() == pytest.approx(2.0)  # b: 50 B sent by 1.5, then alone
    assert link.pop_done(2.0) == ["b"]
