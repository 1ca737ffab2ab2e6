"""Generated blocks reach the prefix cache block by block, as vLLM V1 caches them.

vLLM V1 (vllm/v1/core/kv_cache_manager.py ``allocate_slots`` -> ``coordinator.cache_blocks``,
capped at ``request.num_tokens``): every step a request is scheduled, the full blocks among
its first ``num_computed_tokens + num_new_tokens`` tokens are cached. A decode scheduled with
g tokens generated so far holds prompt + g tokens, so a look-up made in that step (the waiting
loop runs after the running one) sees its blocks full among prompt + g tokens, not only those
of its prompt. A multi-turn turn sent while the previous answer is still being generated (the
open-loop generator) hits the answer's blocks filled so far. simsrv publishes them lazily, as
of each look-up (sim/policies/decode_set.py ``publish``), so a fast-forwarded run of decode
steps gives the same hits as single steps. bench/conformance.py ``multi_turn_open`` checks it
against vLLM's own scheduler; these tests assert the rule without vLLM.
"""

import random

import numpy as np
import pytest

from sim.core.kv import KVBlockManager
from sim.core.request import Request
from sim.metrics.summary import summarize
from sim.policies.base import EngineLimits
from sim.policies.chunked import ChunkedScheduler
from sim.run import run_scenario
from sim.scenario import scenario_from_dict

BS = 16


def _turns(rng: random.Random) -> tuple[int, int, int, list[int], list[int]]:
    """(prompt 1, answer 1, prompt 2, ids 1, ids 2): turn 2 repeats turn 1's prompt and answer."""
    p1, o1, new = rng.randint(20, 200), rng.randint(40, 300), rng.randint(1, 100)
    ids1 = list(range(-(-(p1 + o1) // BS)))
    p2 = p1 + o1 + new
    ids2 = ids1 + list(range(1000, 1000 + -(-p2 // BS) - len(ids1)))
    return p1, o1, p2, ids1, ids2


def _req(rid: int, arrival: int, prompt: int, out: int, ids: list[int]) -> Request:
    r = Request(rid, float(arrival), prompt, out)
    r.hash_ids, r.hash_block_size = np.asarray(ids), BS
    return r


def _hit_of_second_turn(p1, o1, p2, ids1, ids2, arrival: int, fast_forward: bool) -> int:
    """Turn 1 at step 0, turn 2 at step ``arrival``; the prompt tokens turn 2 found cached.
    Fast-forward: runs of decode steps, cut at the arrival as the replica loop cuts them."""
    limits = EngineLimits(max_num_seqs=8, max_num_batched_tokens=8192, max_model_len=8192,
                          max_run_steps=1 << 30 if fast_forward else 1)
    s = ChunkedScheduler(limits, KVBlockManager(10_000, BS, True))
    first, second = _req(0, 0, p1, o1, ids1), _req(1, arrival, p2, 4, ids2)
    s.add_request(first, 0.0)
    step = 0
    added = arrival == 0
    if added:
        s.add_request(second, 0.0)
    while not added or s.waiting or s.running:
        if not (s.waiting or s.running):  # idle until the arrival
            step = arrival
            s.add_request(second, float(step))
            added = True
        plan = s.schedule(float(step))
        k = plan.num_steps
        if not added and step < arrival < step + k:  # the arrival cuts the run
            s.on_step_done(plan, float(arrival), steps_done=arrival - step)
            step = arrival
        else:
            s.on_step_done(plan, float(step + k))
            step += k
        if not added and step >= arrival:
            s.add_request(second, float(step))
            added = True
    return second.prefix_hit_tokens


def _vllm_hit(p1, o1, p2, arrival: int) -> int:
    """vLLM V1's hit of turn 2 added before the scheduling of step ``arrival``: turn 1 prefilled
    its prompt whole at step 0 (plenty of budget), then decodes at step s >= 1 with s tokens
    generated (prompt + s tokens), the last at s = o1 - 1; a hit is whole blocks and never the
    last token of the prompt."""
    tokens = p1 if arrival == 0 else p1 + min(arrival, o1 - 1)
    return min(tokens // BS, (p2 - 1) // BS) * BS


@pytest.mark.parametrize("fast_forward", [False, True])
def test_a_turn_hits_the_answer_blocks_full_by_its_step(fast_forward):
    rng = random.Random(7)
    for _ in range(40):
        p1, o1, p2, ids1, ids2 = _turns(rng)
        arrival = rng.randint(0, o1 + 5)
        got = _hit_of_second_turn(p1, o1, p2, ids1, ids2, arrival, fast_forward)
        assert got == _vllm_hit(p1, o1, p2, arrival), (p1, o1, p2, arrival)


def test_mid_answer_turn_hits_more_than_the_prompt():
    """The bug this guards: generated blocks published only when the answer ended, so a turn
    sent mid-answer hit turn 1's prompt blocks alone."""
    p1, o1, p2 = 40, 200, 300
    ids1 = list(range(-(-(p1 + o1) // BS)))
    ids2 = ids1 + list(range(1000, 1000 + -(-p2 // BS) - len(ids1)))
    got = _hit_of_second_turn(p1, o1, p2, ids1, ids2, 100, fast_forward=True)
    assert got == (40 + 100) // BS * BS > p1 // BS * BS


def _open_loop_multi_turn(seed: int) -> dict:
    return {"name": "mt", "seed": seed, "model": "llama-3-8b",
            "hardware": {"gpu": "a100-80g", "cost_model": "roofline"},
            "cluster": {"replicas": 2, "router": "prefix_affinity"},
            "engine": {"policy": "chunked", "max_num_seqs": 64, "max_num_batched_tokens": 1024,
                       "max_model_len": 8192, "gpu_memory_utilization": 0.22},
            "workload": {"synthetic": {"num_requests": 160, "request_rate": 12.0,
                                       "input_tokens": {"dist": "uniform", "min": 50, "max": 400},
                                       "output_tokens": {"dist": "uniform", "min": 100, "max": 400},
                                       "multi_turn": {"turns": {"dist": "uniform", "min": 2, "max": 5},
                                                      "think_time_s": 1.0}}}}


@pytest.mark.parametrize("seed", [0, 1])
def test_fast_forward_keeps_the_hits_of_turns_sent_mid_answer(seed):
    """Open-loop multi-turn, turns often sent while the previous answer is generated, routed
    by cached prefix: fast-forwarded runs give the hits and steps of single steps."""
    raw = _open_loop_multi_turn(seed)
    ff = run_scenario(scenario_from_dict(raw))
    single = run_scenario(scenario_from_dict(raw), max_run_steps=1)
    a, b = summarize(ff), summarize(single)
    assert a["completed"] == b["completed"]
    assert a["simsrv_num_steps"] == b["simsrv_num_steps"]
    hits = [k for k in b if "prefix" in k and "hit" in k]
    assert hits
    for key in hits:
        assert a[key] == b[key], key
