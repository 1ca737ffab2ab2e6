"""``static``: request-level batching (FasterTransformer; TensorRT-LLM static batching).

Why: the baseline that iteration-level batching beats (Yu et al. 2022, "Orca", section 2):
up to ``max_num_seqs`` waiting requests are prefilled together, then decoded until every one
of them has finished; finished slots sit idle and nothing new joins until the whole batch is
done. KV for each request's full length is reserved at admission, as static engines allocate
for the maximum sequence length, so a batch never preempts.
NOTE: vLLM has no static batching; this policy is a baseline, not a vLLM mode.
"""

from __future__ import annotations

from sim.policies.base import Scheduler, StepPlan
from sim.policies.registry import PolicySpec, register


class StaticScheduler(Scheduler):
    name = "static"

    def _first_chunk(self, remaining: int, budget: int, plan: StepPlan) -> int:
        # NOTE: the whole batch is prefilled in one forward pass, whatever the token budget.
        return remaining

    def _fill_prefills(self, plan: StepPlan, budget: int, now: float) -> None:
        if self.running:
            return  # the batch in flight must drain first
        reserved, free = 0, self.kv.num_free
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            req = self.waiting[0]
            full = self.kv.blocks_for(req.prompt_tokens + req.output_tokens - 1)
            if reserved + full > free:
                break
            if self._try_admit(req, plan, budget, now) <= 0:
                break
            reserved += full


register(PolicySpec("static", "request-level batching: a batch runs until all its requests finish",
                    StaticScheduler, ("sim.policies.static",), order=0))
