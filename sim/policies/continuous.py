"""``continuous``: iteration-level batching without chunking (Yu et al. 2022, "Orca"; vLLM with
``enable_chunked_prefill=False``).

Why: a waiting prompt joins at any step boundary but is prefilled whole in one step, so a long
prompt stalls every decode sharing that step: the interference chunked prefill removes.
"""

from __future__ import annotations

from sim.policies.base import Scheduler, StepPlan


class ContinuousScheduler(Scheduler):
    name = "continuous"

    def _fill_prefills(self, plan: StepPlan, budget: int, now: float) -> None:
        limits, kv = self.limits, self.kv
        while self.waiting and len(self.running) < limits.max_num_seqs:
            req = self.waiting[0]
            need = req.prefill_target
            if need > budget:
                # NOTE: vLLM without chunking requires max_num_batched_tokens >= max_model_len;
                # a prompt longer than the whole budget runs alone in a step instead of waiting forever.
                if plan.chunks or need <= limits.max_num_batched_tokens:
                    break
            if not kv.allocate(req, need):
                break  # first-come first-served: the head waits for blocks
            self._admit(req, plan, need, now)
            budget -= need
