"""``continuous``: iteration-level batching without chunking (Yu et al. 2022, "Orca"; vLLM with
``enable_chunked_prefill=False``).

Why: a waiting prompt joins at any step boundary but is prefilled whole in one step, so a long
prompt stalls every decode sharing that step: the interference chunked prefill removes.
"""

from __future__ import annotations

from sim.policies.base import Scheduler, StepPlan
from sim.policies.registry import PolicySpec, register


class ContinuousScheduler(Scheduler):
    name = "continuous"

    def _first_chunk(self, remaining: int, budget: int, plan: StepPlan) -> int:
        if remaining > budget:
            # NOTE: vLLM without chunking requires max_num_batched_tokens >= max_model_len;
            # a prompt longer than the whole budget runs alone in a step instead of waiting forever.
            if plan.chunks or remaining <= self.limits.max_num_batched_tokens:
                return 0
        return remaining

    def _fill_prefills(self, plan: StepPlan, budget: int, now: float) -> None:
        while self.waiting and not self.waiting[0].kv_ready and len(self.running) < self.limits.max_num_seqs:
            n = self._try_admit(self.waiting[0], plan, budget, now)
            if not n:
                break
            budget -= n


register(PolicySpec("continuous", "iteration-level batching, whole prompts (no chunking)",
                    ContinuousScheduler, ("sim.policies.continuous",), order=1))
