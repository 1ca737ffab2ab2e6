"""``continuous`` (vLLM V1 with chunked prefill off): the waiting requests a step skips for the
token budget go back at the head of the queue in vLLM's order.

vLLM 0.11 (vllm/v1/core/sched/scheduler.py ``schedule``): each prompt that does not fit the
budget left is popped and ``skipped_waiting_requests.prepend_request``-ed (appendleft); at the
end ``self.waiting.prepend_requests(skipped_waiting_requests)`` does
``extendleft(reversed(...))`` (request_queue.py ``FCFSRequestQueue``): the skipped ones return
in REVERSE order, the last skipped first. bench/conformance.py ``continuous_*`` cases check it
against vLLM's own scheduler; these tests assert the rule without vLLM.
"""

import random

from sim.core.kv import KVBlockManager
from sim.core.request import Request
from sim.policies.base import EngineLimits
from sim.policies.continuous import ContinuousScheduler


def _vllm_011_waiting_after(queue: list[tuple[int, int]], budget: int) -> tuple[list[int], list[int]]:
    """vLLM 0.11's waiting loop over (id, prompt tokens) with nothing running and plenty of KV:
    (ids scheduled, waiting ids afterwards), written from the rule above."""
    waiting = list(queue)
    skipped: list[tuple[int, int]] = []  # built by prepend_request: appendleft
    scheduled = []
    while waiting and budget > 0:
        rid, n = waiting[0]
        if n > budget:
            waiting.pop(0)
            skipped.insert(0, (rid, n))
            continue
        waiting.pop(0)
        scheduled.append(rid)
        budget -= n
    # prepend_requests: extendleft(reversed(skipped))
    for item in reversed(skipped):
        waiting.insert(0, item)
    return scheduled, [rid for rid, _ in waiting]


def _plan(queue: list[tuple[int, int]], budget: int) -> tuple[list[int], list[int]]:
    s = ContinuousScheduler(EngineLimits(max_num_batched_tokens=budget, max_model_len=budget, max_num_seqs=256),
                            KVBlockManager(100_000, 16))
    for rid, n in queue:
        assert s.add_request(Request(rid, 0.0, n, 4), 0.0)
    plan = s.plan_step(0.0)
    return [r.request_id for r, _ in plan.chunks], [r.request_id for r in s.waiting]


def test_skipped_requests_return_last_skipped_first():
    # 0 takes 900 of 1000: 1 (500) and 2 (600) do not fit the 100 left and are skipped; 3 fits
    scheduled, waiting = _plan([(0, 900), (1, 500), (2, 600), (3, 50), (4, 700)], 1000)
    assert scheduled == [0, 3]
    assert waiting == [4, 2, 1]  # 1, 2, 4 skipped in that order: back as 4, 2, 1


def test_skipped_order_matches_vllm_rule_on_random_queues():
    rng = random.Random(37)
    for _ in range(200):
        budget = rng.choice([256, 512, 1000, 2048])
        queue = [(i, rng.randint(1, budget - 8)) for i in range(rng.randint(1, 12))]
        assert _plan(queue, budget) == _vllm_011_waiting_after(queue, budget), (budget, queue)
