"""The engine charges what its scheduler did: every KV block swapped over PCIe, every paused
decode's wait in its next inter-token gap, each in-flight KV transfer counted once."""

from __future__ import annotations

import random

from sim.core.kv import KVBlockManager
from sim.core.request import Request
from sim.policies import EngineLimits
from sim.policies.chunked import ChunkedScheduler
from sim.policies.continuous import ContinuousScheduler


def _swap_run(seed: int) -> tuple[int, int, int]:
    """A small swap-mode scheduler driven until idle: (blocks swapped out and in, blocks the
    plans it returned charge or its next plan will, rounds whose first plan only preempted and
    swapped out)."""
    rng = random.Random(seed)
    steps = rng.choice([1, 4])  # multi-step runs on the continuous policy only (as a scenario)
    cls = ContinuousScheduler if steps > 1 else rng.choice([ChunkedScheduler, ContinuousScheduler])
    blocks = rng.randint(6, 14)
    limits = EngineLimits(preemption_mode="swap", max_num_batched_tokens=rng.choice([8, 16, 32, 64]),
                          num_scheduler_steps=steps)
    s = cls(limits, KVBlockManager(blocks, 4))
    moved, replans = [0], [0]
    swap_out, swap_in, plan_step = s.kv.swap_out, s.kv.swap_in, s.plan_step

    def counted_out(req: Request) -> int:
        n = swap_out(req)
        moved[0] += n
        return n

    def counted_in(req: Request) -> int:
        n = swap_in(req)
        moved[0] += n
        return n

    def watched_plan_step(now: float):
        plan = plan_step(now)
        if plan.preempted and not (plan.num_decode_seqs or plan.chunks) and any(r.kv_ready for r in plan.preempted):
            replans[0] += 1
        return plan

    s.kv.swap_out, s.kv.swap_in, s.plan_step = counted_out, counted_in, watched_plan_step
    for i in range(rng.randint(2, 6)):
        s.add_request(Request(i, 0.0, rng.randint(1, blocks * 2), rng.randint(1, 30)), 0.0)
    charged, now = 0, 0.0
    for _ in range(5000):
        plan = s.schedule(now)
        if plan.idle:
            break
        charged += plan.swap_blocks
        now += 0.01 * plan.num_steps
        s.on_step_done(plan, now)
    return moved[0], charged + s._swap_blocks, replans[0]  # (with any copies not charged yet: none if it ran out)


def test_every_swapped_block_is_charged_to_a_step_that_runs():
    """A round whose first plan only preempts is planned again at once (``schedule``); the
    swap-outs of the discarded plan happened and are charged to the plan that runs. (Reached
    here with multi-step lookahead blocks, which a scenario refuses with swap: no shipped
    result changes.)"""
    replans = 0
    for seed in range(200):
        moved, charged, r = _swap_run(seed)
        assert charged == moved, seed
        replans += r
    assert replans  # the re-planned rounds were exercised
