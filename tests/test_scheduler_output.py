"""One owner per state (issue 15): a scheduling round says what happened (its StepPlan), and the
TTFT accounting observes it."""

import ast
from pathlib import Path

import pytest

from sim.core.kv import KVBlockManager, KVGroups
from sim.core.request import Request
from sim.core.ttft import TTFTAccounting
from sim.policies.base import EngineLimits, StepPlan
from sim.policies.chunked import ChunkedScheduler
from sim.policies.continuous import ContinuousScheduler

ROOT = Path(__file__).resolve().parents[1]


def test_a_round_says_what_happened():
    # 6 blocks of 16: two 48-token prompts fill them; each first decode step needs a 4th
    s = ChunkedScheduler(EngineLimits(max_num_batched_tokens=4096), KVBlockManager(6, 16))
    assert s.schedule(0.0).idle  # nothing queued
    a, b, c = Request(0, 0.0, 48, 30), Request(1, 0.0, 48, 30), Request(2, 0.01, 10, 5)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    first = s.schedule(0.0)
    assert first.new_reqs == [a, b] and not first.kv_blocked and not first.preempted
    s.on_step_done(first, 0.01)
    s.add_request(c, 0.01)
    plan = s.schedule(0.01)
    # b is preempted for a's block; c is left waiting, for KV (V1 admits nothing after a preemption)
    assert plan.preempted == [b] and plan.preempted_ids == [1]
    assert plan.kv_blocked and plan.new_reqs == [] and list(s.waiting) == [b, c]
    assert s.scheduled_tokens(plan) == {0: 1}


class _StepCost:
    def overhead_s(self, num_seqs: int) -> float:
        return 0.001

    def prefill_alone_s(self, n: int, ctx: int, completing: bool) -> float:
        return 0.004


def test_ttft_accounting_observes_rounds_and_steps():
    acc = TTFTAccounting(_StepCost())
    req = Request(7, 0.0, 100, 5)
    acc.on_arrival(req, 0.0)
    acc.on_schedule(StepPlan(1, 0, 0, 0), 1.0)                   # an idle round: batch full
    acc.on_schedule(StepPlan(1, 0, 0, 0, kv_blocked=True), 1.5)  # one that stopped on KV
    plan = StepPlan(1, 0, 0, 0, chunks=[(req, 100)], chunk_contexts=[0], new_reqs=[req])
    acc.on_schedule(plan, 3.5)
    assert (req.ttft_wait_batch_s, req.ttft_wait_kv_s) == (1.5, 2.0)
    acc.on_step(plan, 3.51, 0.01)  # its prefill alone: 4 ms; overhead 1 ms; the rest interference
    assert req.ttft_prefill_s == pytest.approx(0.004) and req.ttft_overhead_s == pytest.approx(0.001)
    assert req.ttft_interference_s == pytest.approx(0.005)


def test_a_preemption_before_the_first_token_counts_until_it():
    acc = TTFTAccounting(_StepCost())
    req = Request(1, 0.0, 64, 5)
    acc.on_arrival(req, 0.0)
    acc.on_schedule(StepPlan(1, 0, 0, 0, chunks=[(req, 32)], chunk_contexts=[0], new_reqs=[req]), 0.0)
    acc.on_schedule(StepPlan(1, 1, 10, 0, preempted=[req]), 0.2)
    later = StepPlan(1, 0, 0, 0, chunks=[(req, 64)], chunk_contexts=[0])
    acc.on_schedule(later, 0.5)
    acc.on_step(later, 0.6, 0.1)
    assert req.ttft_preempt_s == pytest.approx(0.4) and req.ttft_prefill_s == 0.0


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("policy, limits, groups", [
    (ChunkedScheduler, dict(max_num_batched_tokens=24, max_run_steps=3), KVGroups()),
    (ChunkedScheduler, dict(max_num_batched_tokens=24, max_run_steps=3, preemption_mode="swap"), KVGroups()),
    # a full-attention group and a sliding one, window 8 tokens (3 blocks of 4)
    (ChunkedScheduler, dict(max_num_batched_tokens=24, max_run_steps=3), KVGroups(1, 1, 3, 8)),
    (ContinuousScheduler, dict(max_num_batched_tokens=64, num_scheduler_steps=4), KVGroups()),
])
def test_every_used_block_is_counted_once_by_the_kv_manager(policy, limits, groups):
    # no prefix caching: used blocks are exactly those held, by a table, the decode set, or none
    kv = KVBlockManager(40, 4, groups=groups)
    s = policy(EngineLimits(**limits), kv)
    for i in range(6):
        s.add_request(Request(i, 0.0, 10 + 7 * i, 30 + 5 * i), 0.0)

    def counted():
        return kv.decode_blocks + sum(t.num_blocks for t in kv.tables.values())

    now, preempted, decoding, done = 0.0, 0, 0, 0
    while not (plan := s.schedule(now)).idle:
        preempted += len(plan.preempted)
        decoding = max(decoding, kv.decode_blocks)
        assert counted() == kv.num_used
        if plan.swap_blocks:  # swapped-out blocks are the KV manager's host copies
            assert kv._host_blocks or any(r.num_preemptions for r in plan.kv_ready)
        now += 0.01
        done += len(s.on_step_done(plan, now))
        assert counted() == kv.num_used
    assert preempted and decoding and done == 6
    assert (s.num_swaps > 0) == (limits.get("preemption_mode") == "swap")
    assert kv.num_used == kv.decode_blocks == 0 and not kv._host_blocks


def test_policies_do_not_do_the_accounting():
    for path in sorted((ROOT / "sim" / "policies").glob("*.py")):
        bad = {m for m in _imports(path) if m == "sim.core.ttft" or m.startswith(("sim.engine", "sim.analysis"))}
        assert not bad, f"{path.name} imports {bad}"
    assert not {"wait_mark_batch_s", "wait_mark_kv_s", "preempt_start_s"} & set(dir(Request))  # the accounting's
    # block counts are the KV manager's, not the request's
    assert not {"num_blocks", "swapped_blocks", "handoff_blocks"} & set(dir(Request))
