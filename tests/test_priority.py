"""``engine.scheduling_policy: priority``: vLLM V1's priority scheduling (issue 40 item 4).

vLLM 0.11 V1 (vllm/v1/core/sched/request_queue.py PriorityRequestQueue, scheduler.py schedule):
the waiting queue is a heap of (priority, arrival_time); when a running request cannot get its
KV blocks, the running request with the largest (priority, arrival_time) is preempted, even one
scheduled earlier in the same round. fcfs, the default, never reads a priority.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from sim.core.kv import KVBlockManager
from sim.core.request import Request
from sim.errors import UserError
from sim.metrics.summary import summarize
from sim.output import write_run
from sim.policies.base import EngineLimits, _victim_index
from sim.policies.chunked import ChunkedScheduler
from sim.policies.continuous import ContinuousScheduler
from sim.run import run_scenario
from sim.scenario import load_scenario
from sim.workload import build_workload

ROOT = Path(__file__).resolve().parents[1]


def _sched(policy: str, cls=ChunkedScheduler, blocks: int = 6) -> ChunkedScheduler:
    return cls(EngineLimits(max_num_batched_tokens=4096, scheduling_policy=policy), KVBlockManager(blocks, 16))


def test_waiting_queue_pops_as_vllms_priority_heap():
    rng = random.Random(3)
    s = _sched("priority", blocks=1)
    heap, reqs = [], []
    for i in range(60):
        r = Request(i, rng.choice([0.0, 0.5, 1.0, rng.random()]), 10, 5, priority=rng.choice([-1, 0, 2, 7]))
        reqs.append(r)
        s.add_request(r, 0.0)
        heapq.heappush(heap, (r.priority, r.arrival_s, r.request_id, r))
    popped = [heapq.heappop(heap)[3] for _ in range(len(heap))]
    assert list(s.waiting) == popped
    # fcfs keeps arrival order whatever the priorities
    f = _sched("fcfs", blocks=1)
    for r in reqs:
        f.add_request(r, 0.0)
    assert list(f.waiting) == reqs


def test_victim_index_is_vllms_max_rule():
    rng = random.Random(5)
    for _ in range(300):
        order = [Request(i, rng.choice([0.0, 1.0, 2.0]), 10, 5, priority=rng.choice([0, 1, 2]))
                 for i in range(rng.randint(1, 9))]
        rng.shuffle(order)
        want = max(order, key=lambda r: (r.priority, r.arrival_s))  # vLLM: first of the maxima
        assert order[_victim_index(order)] is want


def _until_preemption(s, reqs_at: list[tuple[float, Request]]):
    """Step ``s`` (10 ms a step), adding each request at its time, until a round preempts."""
    t = 0.0
    pending = list(reqs_at)
    for _ in range(200):
        while pending and pending[0][0] <= t:
            s.add_request(pending.pop(0)[1], t)
        plan = s.schedule(t)
        if plan.preempted:
            return plan
        t += 0.01
        s.on_step_done(plan, t)
    raise AssertionError("no preemption")


@pytest.mark.parametrize("cls", [ChunkedScheduler, ContinuousScheduler])
def test_priority_preempts_the_lowest_priority_even_one_scheduled_this_round(cls):
    # 6 blocks of 16 tokens. x (priority 1, 40 tokens) runs first; y (priority 0, 47 tokens)
    # joins; both hold 3 blocks. y's decode crosses into a 4th block first, while x, ahead of it
    # in the running list, was already given its decode token in that round.
    def case(policy):
        s = _sched(policy, cls)
        x = Request(0, 0.0, 40, 500, priority=1)
        y = Request(1, 0.005, 47, 500, priority=0)
        return s, x, y, _until_preemption(s, [(0.0, x), (0.01, y)])

    s, x, y, plan = case("fcfs")
    assert plan.preempted == [y]  # V1 fcfs: self.running.pop(), the last admitted
    assert s.scheduled_tokens(plan) == {0: 1}

    s, x, y, plan = case("priority")
    assert plan.preempted == [x]  # max (priority, arrival_time): x, although scheduled before y
    assert s.scheduled_tokens(plan) == {1: 1}  # x's token taken back out of the step
    assert plan.num_decode_seqs == 1 and list(s.waiting) == [x]
    assert s.kv.num_free >= 0 and x.status == "waiting"


def test_preempted_and_skipped_requests_go_back_by_priority():
    s = _sched("priority", blocks=6)
    x = Request(0, 0.0, 40, 500, priority=1)
    y = Request(1, 0.005, 47, 500, priority=0)
    late = Request(2, 0.015, 20, 5, priority=0)
    plan = _until_preemption(s, [(0.0, x), (0.01, y), (0.015, late)])
    assert plan.preempted == [x]
    # vLLM's prepend_request is add_request under priority: x goes behind the priority-0 request
    assert list(s.waiting) == [late, x]


def _digest(path: Path) -> str:
    d = pl.read_parquet(path)
    h = hashlib.sha256()
    for c in ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "num_preemptions", "replica",
              "prefix_hit_tokens"):
        h.update(np.ascontiguousarray(d[c].to_numpy()).tobytes())
    h.update("\n".join(d["status"].to_list()).encode())
    return h.hexdigest()


def test_fcfs_is_unchanged_byte_for_byte_on_chat(tmp_path):
    # the digest of chat.yaml's requests (priority scheduling's fcfs path unchanged since commit
    # 455a6d8; the value moves only with the cost model: last with vllm-v1's measured per-request
    # front-end cost, frontend_request_ms 2.5, issue 37)
    s = load_scenario(ROOT / "scenarios" / "chat.yaml")
    assert s.engine.scheduling_policy == "fcfs"
    result = run_scenario(s)
    write_run(result, summarize(result), tmp_path / "run")
    assert _digest(tmp_path / "run" / "requests.parquet") == \
        "98a5051a9712ac872ac5efc8559cd9456da416a224fd87d8d7fcdfd5e95e39a8"


def test_fcfs_never_reads_a_priority(tmp_path):
    sets = ["workload.synthetic.num_requests=400", "engine.scheduling_policy=fcfs"]
    with_classes = run_scenario(load_scenario(ROOT / "scenarios" / "priority.yaml", sets))
    without = run_scenario(load_scenario(ROOT / "scenarios" / "priority.yaml",
                                         [*sets, "workload.synthetic.priority_classes=null"]))
    a = with_classes.requests.drop("priority")
    assert a.equals(without.requests.drop("priority"))
    assert set(with_classes.requests["priority"].to_list()) == {0, 1}


def test_classes_keep_arrivals_and_lengths_and_follow_weights():
    s = load_scenario(ROOT / "scenarios" / "priority.yaml")
    plain = load_scenario(ROOT / "scenarios" / "priority.yaml", ["workload.synthetic.priority_classes=null"])
    w, p = build_workload(s), build_workload(plain)
    assert np.array_equal(w.arrival_s, p.arrival_s) and np.array_equal(w.input_tokens, p.input_tokens)
    assert p.priority is None
    share = float((w.priority == 0).mean())
    assert abs(share - 1 / 3) < 0.04  # weights 1 : 2


def test_per_class_figures_are_the_classes_own(tmp_path):
    s = load_scenario(ROOT / "scenarios" / "priority.yaml", ["workload.synthetic.num_requests=600"])
    result = run_scenario(s)
    summary = summarize(result)
    classes = summary["simsrv_classes"]
    req = result.requests
    assert sum(c["requests"] for c in classes.values()) == summary["num_prompts"]
    assert sum(c["completed"] for c in classes.values()) == summary["completed"]
    for p, c in classes.items():
        mine = req.filter((pl.col("priority") == int(p)) & (pl.col("status") == "completed"))
        assert c["completed"] == mine.height
        assert c["p99_ttft_ms"] == pytest.approx(float(np.percentile(mine["ttft_s"].to_numpy(), 99)) * 1e3)
        assert c["p50_tpot_ms"] == pytest.approx(float(np.percentile(mine["tpot_s"].to_numpy(), 50)) * 1e3)
        assert c["request_goodput"] is not None


def test_shipped_scenario_priority_helps_interactive_and_costs_batch():
    def classes(policy):
        s = load_scenario(ROOT / "scenarios" / "priority.yaml", [f"engine.scheduling_policy={policy}"])
        return summarize(run_scenario(s))["simsrv_classes"]

    prio, fcfs = classes("priority"), classes("fcfs")
    assert prio["0"]["p99_ttft_ms"] < 0.7 * fcfs["0"]["p99_ttft_ms"]
    assert prio["1"]["p99_ttft_ms"] > fcfs["1"]["p99_ttft_ms"]


def test_priority_runs_fast_forward_exactly():
    s = load_scenario(ROOT / "scenarios" / "priority.yaml", ["workload.synthetic.num_requests=300",
                                                            "workload.synthetic.request_rate=40",
                                                            "engine.gpu_memory_utilization=0.25"])
    fast, slow = run_scenario(s).requests, run_scenario(s, max_run_steps=1).requests
    assert fast["num_preemptions"].sum() > 0  # the case with preemptions
    assert fast["status"].to_list() == slow["status"].to_list()
    assert np.allclose(fast["finish_s"].to_numpy(), slow["finish_s"].to_numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sets,needle", [
    (["engine.policy=static"], "applies to policies continuous and chunked"),
    (["engine.admission=sglang"], "needs engine.admission: vllm"),
])
def test_priority_needs_vllm_v1s_scheduler(sets, needle):
    with pytest.raises(UserError, match=needle):
        load_scenario(ROOT / "scenarios" / "priority.yaml", sets)


@pytest.mark.parametrize("release, tokens", [("0.11", {0: 1}), ("0.34", {0: 1, 2: 1})])
def test_a_request_that_preempts_itself_lets_the_ones_after_it_run_on_034(release, tokens):
    # 4 blocks of 16 tokens; x (priority 0) and y (priority 2) run, z (priority 0) joins later,
    # behind y in the running list. y, the lowest priority, needs a new block with none free
    # and preempts itself. vLLM 0.11 stops the running loop there; 0.34 goes on to z, which
    # ranks higher and needs no block (Scheduler.schedule: "continue" when the request is
    # PREEMPTED under the priority policy; bench/conformance.py priority_* cases).
    s = ChunkedScheduler(EngineLimits(max_num_batched_tokens=4096, scheduling_policy="priority",
                                      vllm_release=release, max_run_steps=1), KVBlockManager(4, 16))
    x, y, z = Request(0, 0.0, 8, 500, priority=0), Request(1, 0.001, 8, 500, priority=2), \
        Request(2, 0.03, 8, 500, priority=0)
    plan = _until_preemption(s, [(0.0, x), (0.0, y), (0.03, z)])
    assert plan.preempted == [y]
    assert s.scheduled_tokens(plan) == tokens
