"""``chunked``: chunked prefill under a per-step token budget (Agrawal et al. 2024,
"Sarathi-Serve"; vLLM V1, where chunked prefill is always on).

Why: running requests are scheduled first, then prompt chunks fill the rest of
``max_num_batched_tokens``, so a long prompt is spread over many steps and co-running decodes
keep a bounded step time: slightly later first tokens, far steadier inter-token latency.
``long_prefill_token_threshold`` caps any one request's chunk (vLLM V1).
"""

from __future__ import annotations

from sim.compiled_core import mypyc_attr
from sim.policies.base import Scheduler, StepPlan
from sim.policies.registry import PolicySpec, register


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled core
class ChunkedScheduler(Scheduler):
    name = "chunked"

    def _first_chunk(self, remaining: int, budget: int, plan: StepPlan) -> int:
        thr = self._threshold
        n = thr if 0 < thr < remaining else remaining  # _chunk_tokens
        if n > budget:
            n = budget
        max_partial = self._limits.max_num_partial_prefills
        if n < remaining and max_partial > 0:
            # NOTE: vLLM V0's max_num_partial_prefills (V1 does not enforce it; off by default):
            # a prompt that would start as one partial prefill too many waits.
            partial = sum(1 for r in self.prefilling.values() if r.num_computed + self._chunk_of(r, plan) < r.prefill_target)
            if partial >= max_partial:
                return 0
        return n

    @staticmethod
    def _chunk_of(req, plan: StepPlan) -> int:
        for r, n in plan.chunks:
            if r is req:
                return n
        return 0


register(PolicySpec("chunked", "chunked prefill mixed with decodes under max_num_batched_tokens",
                    ChunkedScheduler, ("sim.policies.chunked",), chunked_prefill=True, order=2,
                    admission_modes=("vllm", "sglang"), scheduling_policies=("fcfs", "priority"),
                    capacity_scheduler_policies=("max_utilization", "guaranteed_no_evict")))
