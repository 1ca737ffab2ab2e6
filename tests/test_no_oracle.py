"""No scheduler reads the future: a request's true output length (the step its end of sequence
comes) may decide when it finishes, never a decision made before that.

Property (issue 37 item 2): for random small workloads, every registered policy (each of its
schedulers, admission modes, capacity policies, multi-step and separate-prefill forms, swap),
changing one request's ``output_tokens`` while keeping its ``max_tokens`` leaves every
arrival's acceptance and every step's plan (requests scheduled, their tokens, preemptions)
identical up to and including the step in which that request emits its last token in either
run. The variants are read from the policy registry, so a new policy or rule is covered as
soon as it registers.
"""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass

import numpy as np
import pytest

from sim.core.kv import KVBlockManager
from sim.core.request import Request
from sim.policies import EngineLimits
from sim.policies.base import FINISH_LENGTH, settle_max_tokens
from sim.policies.disagg import DecodeScheduler, PrefillScheduler
from sim.policies.registry import get_policy, policy_names

BLOCK = 16
MAX_MODEL_LEN = 512
DT_S = 0.01  # every step lasts this long: the plans alone decide what happens when


@dataclass(frozen=True)
class Variant:
    name: str
    scheduler: type
    limits: EngineLimits
    prefix_caching: bool


def _variants() -> list[Variant]:
    out = []
    for name in policy_names():
        spec = get_policy(name)
        # a pooled policy's schedulers (sim/policies/disagg.py) take requests as a colocated one does
        classes = [PrefillScheduler, DecodeScheduler] if spec.pools else [spec.scheduler]
        forms = [{}, {"preemption_mode": "swap"}]
        if spec.multi_step:
            forms.append({"num_scheduler_steps": 4, "separate_prefill_steps": True})
        if spec.separate_prefill_steps:
            forms.append({"separate_prefill_steps": True})
        for cls in classes:
            for admission in spec.admission_modes:
                for capacity in spec.capacity_scheduler_policies:
                    for form in forms:
                        for ignore_eos, prefix in ((False, False), (True, False), (True, True)):
                            if admission != "sglang" and (ignore_eos or prefix):
                                continue  # only SGLang's admission reads them
                            limits = EngineLimits(max_num_seqs=6, max_num_batched_tokens=MAX_MODEL_LEN,
                                                  max_model_len=MAX_MODEL_LEN, capacity_scheduler_policy=capacity,
                                                  admission=admission, ignore_eos=ignore_eos, **form)
                            label = "-".join([name, cls.__name__, admission, capacity, *map(str, form.values()),
                                              f"eos{int(ignore_eos)}", f"prefix{int(prefix)}"])
                            out.append(Variant(label, cls, limits, prefix))
    return out


VARIANTS = _variants()


def _workload(rng: np.random.Generator, n: int) -> list[tuple[float, int, int, int]]:
    """(arrival_s, prompt, output, max_tokens sent or 0) per request: bursts that fill the KV."""
    t = np.cumsum(rng.exponential(0.02, n))
    out = []
    for i in range(n):
        prompt = int(rng.integers(8, 300))
        sent = int(rng.integers(1, MAX_MODEL_LEN - prompt + 1)) if rng.random() < 0.6 else 0
        cap = sent or MAX_MODEL_LEN - prompt
        output = int(rng.integers(1, cap + 1)) if rng.random() < 0.9 else cap + 5  # some truncated
        out.append((float(t[i]), prompt, output, sent))
    return out


def _log(v: Variant, work: list[tuple[float, int, int, int]], watched: int, blocks: int):
    """(events, the index of the step in which ``watched`` emitted its last token, or of the
    event that refused it): each event an arrival's acceptance or one step's plan."""
    sched = v.scheduler(v.limits, KVBlockManager(blocks, BLOCK, v.prefix_caching))
    pending = deque(Request(i, a, p, o, m) for i, (a, p, o, m) in enumerate(work))
    events: list[tuple] = []
    end = None
    now = 0.0
    for _ in range(100_000):
        while pending and pending[0].arrival_s <= now:
            r = pending.popleft()
            accepted = sched.add_request(r, now)
            events.append(("arrival", r.request_id, accepted, r.max_tokens))
            if not accepted and r.request_id == watched:
                end = len(events) - 1
        plan = sched.schedule(now)
        if plan.idle:
            if plan.preempted:
                events.append(("idle", tuple(plan.preempted_ids)))
            if not pending:
                assert not sched.running, f"{v.name}: stalled with requests running"
                return events, end
            now = max(now, pending[0].arrival_s)
            continue
        tokens = tuple(sorted(sched.scheduled_tokens(plan).items()))
        first = len(events)
        for j in range(plan.num_steps):  # a fast-forwarded run or a multi-step block: same every step
            events.append(("step", tokens, tuple(plan.preempted_ids) if j == 0 else ()))
        now += DT_S * plan.num_steps
        for r in sched.on_step_done(plan, now):
            if r.request_id == watched:
                # a fast-forwarded run ends at its last token; a multi-step block was planned
                # whole, before it: every step of the plan is compared
                end = first + plan.num_steps - 1
        for r in getattr(sched, "handoffs", ()):  # a prefill pool's request ends at its handoff
            if r.request_id == watched:
                end = first + plan.num_steps - 1
            sched.release_handoff(r)  # the decode side took it
        if isinstance(sched, PrefillScheduler):
            sched.handoffs.clear()
    raise AssertionError(f"{v.name}: did not finish")


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_true_output_length_decides_nothing_before_the_finish(variant: Variant):
    rng = np.random.default_rng(zlib.crc32(variant.name.encode()))
    for trial in range(20):
        work = _workload(rng, int(rng.integers(6, 16)))
        watched = int(rng.integers(0, len(work)))
        a, p, o, m = work[watched]
        cap = m or MAX_MODEL_LEN - p
        other = int(rng.integers(1, cap + 1))
        if other == o:
            other = o % cap + 1 if cap > 1 else o + 5
        changed = list(work)
        changed[watched] = (a, p, other, m)
        blocks = int(rng.choice([MAX_MODEL_LEN // BLOCK + 2, 60, 120]))
        ev_a, end_a = _log(variant, work, watched, blocks)
        ev_b, end_b = _log(variant, changed, watched, blocks)
        assert end_a is not None and end_b is not None
        upto = min(end_a, end_b) + 1
        for i in range(upto):
            assert ev_a[i] == ev_b[i], (
                f"{variant.name} trial {trial}: request {watched}'s output length {o} -> {other} "
                f"(max_tokens {m or 'none'}) changed event {i} before its finish: {ev_a[i]} vs {ev_b[i]}")


def test_max_tokens_settled_on_arrival_from_what_the_client_sent():
    """None sent: the context left (vLLM get_max_tokens); one sent over the context: refused
    (vLLM's 400); an output past max_tokens stops there, finish reason length."""
    r = Request(0, 0.0, 100, 50)
    assert settle_max_tokens(r, 512) == "" and r.max_tokens == 412 and r.fail_reason == ""
    r = Request(1, 0.0, 100, 50, 20)
    assert settle_max_tokens(r, 512) == "" and r.output_tokens == 20 and r.fail_reason == FINISH_LENGTH
    assert settle_max_tokens(r, 512) == "" and r.output_tokens == 20  # settling twice changes nothing
    r = Request(2, 0.0, 100, 50, 500)
    assert "prompt+max_tokens 600 tokens > max_model_len 512" in settle_max_tokens(r, 512)
    r = Request(3, 0.0, 512, 5)
    assert "leaves no room" in settle_max_tokens(r, 512)
    r = Request(4, 0.0, 100, 600)  # none sent, an answer past the context: stops at it
    assert settle_max_tokens(r, 512) == "" and r.output_tokens == 412 and r.fail_reason == FINISH_LENGTH
