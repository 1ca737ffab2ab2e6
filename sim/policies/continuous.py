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
            # vLLM V1 without chunked prefill skips a prompt that does not fit the budget left
            # and tries the next ones (vllm/v1/core/sched/scheduler.py, skipped_waiting_requests).
            # NOTE: vLLM then requires max_num_batched_tokens >= max_model_len; a prompt longer
            # than the whole budget runs in a step with no other prompt instead of waiting forever.
            if plan.chunks or remaining <= self.limits.max_num_batched_tokens:
                return -1
        return remaining


register(PolicySpec("continuous", "iteration-level batching, whole prompts (no chunking)",
                    ContinuousScheduler, ("sim.policies.continuous",), order=1))
