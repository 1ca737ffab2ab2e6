"""vLLM V1 scheduling and KV cache semantics (issue 12, items 1-5)."""

import numpy as np

from sim.core.kv import KVBlockManager
from sim.policies.base import EngineLimits
from sim.policies.chunked import ChunkedScheduler
from sim.policies.continuous import ContinuousScheduler
from sim.core.request import Request


def _req(i, prompt, out, t=0.0):
    return Request(i, t, prompt, out)


def test_no_admission_in_a_step_that_preempted():
    # 6 blocks of 16: two 48-token prompts fill them; each first decode step needs a 4th
    kv = KVBlockManager(6, 16)
    s = ChunkedScheduler(EngineLimits(max_num_batched_tokens=4096), kv)
    a, b = _req(0, 48, 30), _req(1, 48, 30)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    s.on_step_done(s.schedule(0.0), 0.01)  # both prefilled: 3 blocks each, next decode needs 1 more each
    c = _req(2, 10, 5)
    s.add_request(c, 0.01)
    plan = s.schedule(0.01)
    assert plan.preempted_ids == [1]             # b preempted for a's new block
    assert [r.request_id for r, _ in plan.chunks] == []  # and nobody admitted in that step (V1)
    assert list(s.waiting) == [b, c]


def test_partial_prefill_preempts_tail_not_shrinks():
    kv = KVBlockManager(6, 16)
    s = ChunkedScheduler(EngineLimits(max_num_batched_tokens=32, long_prefill_token_threshold=32), kv)
    a, b = _req(0, 80, 2), _req(1, 64, 2)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    s.on_step_done(s.schedule(0.0), 0.01)   # a: 32 (2 blocks)
    s.limits = EngineLimits(max_num_batched_tokens=64, long_prefill_token_threshold=32)
    s.on_step_done(s.schedule(0.01), 0.02)  # a: 64 (4 blocks), b: 32 (2 blocks): KV full
    plan = s.schedule(0.02)                  # a needs a 5th block: b (the tail) is preempted
    assert plan.preempted_ids == [1] and [(r.request_id, n) for r, n in plan.chunks] == [(0, 16)]


def test_waiting_prompt_over_the_budget_is_skipped_without_chunking():
    kv = KVBlockManager(100, 16)
    s = ContinuousScheduler(EngineLimits(max_num_batched_tokens=100), kv)
    s.add_request(_req(0, 60, 2), 0.0)
    s.add_request(_req(1, 60, 2), 0.0)      # does not fit the 40 left: skipped
    s.add_request(_req(2, 30, 2), 0.0)      # fits: scheduled
    plan = s.schedule(0.0)
    assert [r.request_id for r, _ in plan.chunks] == [0, 2]
    assert [r.request_id for r in s.waiting] == [1]


def test_max_num_partial_prefills_not_enforced_by_default():
    s = ChunkedScheduler(EngineLimits(max_num_batched_tokens=1024, long_prefill_token_threshold=256),
                         KVBlockManager(1000, 16))
    for i in range(3):
        s.add_request(_req(i, 2000, 2), 0.0)
    plan = s.schedule(0.0)
    assert [n for _, n in plan.chunks] == [256, 256, 256]


def test_preempted_request_recompute_hits_its_own_cached_blocks():
    kv = KVBlockManager(7, 16, True)
    s = ChunkedScheduler(EngineLimits(max_num_batched_tokens=4096), kv)
    x, y = _req(0, 48, 40), _req(1, 48, 40)
    s.add_request(x, 0.0)
    s.add_request(y, 0.0)
    s.on_step_done(s.schedule(0.0), 0.01)  # 3 blocks each
    plan = s.schedule(0.01)                 # each needs a 4th, 1 free: y (the tail) preempted
    assert plan.preempted_ids == [1] and y.num_preemptions == 1
    hits, own = kv.lookup(y)
    assert not hits and own == 3            # its 48 computed tokens are still cached


def test_reverse_free_order_evicts_the_tail_first():
    kv = KVBlockManager(6, 16, True)
    s = ChunkedScheduler(EngineLimits(max_num_batched_tokens=4096), kv)
    a = _req(0, 64, 1)
    a.hash_ids, a.hash_block_size = np.arange(4), 16
    s.add_request(a, 0.0)
    s.on_step_done(s.schedule(0.0), 0.01)  # 4 cached blocks freed: queue = 2 plain, then a3, a2, a1, a0
    b = _req(1, 60, 1)                      # 4 blocks: pops 2 plain, evicts a3, a2
    s.add_request(b, 0.01)
    s.on_step_done(s.schedule(0.01), 0.02)
    c = _req(2, 64, 1)
    c.hash_ids, c.hash_block_size = np.arange(4), 16
    hits, own = kv.lookup(c)
    assert len(hits) == 2                   # the prefix a0, a1 survived (V1); LRU by request would lose all


def test_multi_turn_prompt_hits_the_previous_answer():
    from sim.workload.sessions import session_requests

    arr, inp, out, hashes, _ = session_requests(np.array([0.0]), np.array([2]), np.array([100, 50]),
                                                np.array([40, 10]), np.array([0.0, 100.0]), 16)
    kv = KVBlockManager(1000, 16, True)
    s = ChunkedScheduler(EngineLimits(), kv)
    reqs = []
    for i in range(2):
        r = Request(i, arr[i], int(inp[i]), int(out[i]))
        r.hash_ids, r.hash_block_size = hashes[i], 16
        reqs.append(r)
    s.add_request(reqs[0], 0.0)
    t = 0.0
    while s.running or s.waiting:
        plan = s.schedule(t)
        t += 0.01
        s.on_step_done(plan, t)
    s.add_request(reqs[1], t)
    s.schedule(t)
    assert reqs[1].prefix_hit_tokens == (100 + 40 - 1) // 16 * 16  # prompt and answer blocks
