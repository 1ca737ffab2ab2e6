"""``chunked``: chunked prefill under a per-step token budget (Agrawal et al. 2024,
"Sarathi-Serve"; vLLM v1 with ``enable_chunked_prefill``).

Why: running decodes are scheduled first, then prompt chunks fill the rest of
``max_num_batched_tokens``, so a long prompt is spread over many steps and co-running decodes
keep a bounded step time: slightly later first tokens, far steadier inter-token latency.
"""

from __future__ import annotations

from sim.policies.base import Scheduler, StepPlan
from sim.policies.registry import PolicySpec, register


class ChunkedScheduler(Scheduler):
    name = "chunked"

    def _chunk_cap(self, remaining: int, budget: int) -> int:
        cap = self.limits.long_prefill_token_threshold
        return min(remaining, budget, cap) if cap > 0 else min(remaining, budget)

    def _first_chunk(self, remaining: int, budget: int, plan: StepPlan) -> int:
        n = self._chunk_cap(remaining, budget)
        if n < remaining and self._partial >= self.limits.max_num_partial_prefills:
            return 0  # it would be one partial prefill too many
        return n

    def _fill_prefills(self, plan: StepPlan, budget: int, now: float) -> None:
        limits, kv = self.limits, self.kv
        bs = kv.block_size
        self._partial = 0
        # Running partial prefills continue first, in admission order.
        for req in self.prefilling.values():
            if budget <= 0:
                break
            n = self._chunk_cap(req.prefill_target - req.num_computed, budget)
            fit = (req.num_blocks + kv.num_free) * bs - req.num_computed
            n = min(n, fit)
            if n <= 0:
                self.kv_blocked_ids.add(req.request_id)
                continue
            kv.allocate(req, req.num_computed + n)
            plan.chunks.append((req, n))
            plan.chunk_contexts.append(req.num_computed)
            budget -= n
            self._partial += req.num_computed + n < req.prefill_target
        # Then waiting requests, first come first served.
        while (self.waiting and not self.waiting[0].kv_ready and budget > 0
               and len(self.running) < limits.max_num_seqs):
            req = self.waiting[0]
            n = self._try_admit(req, plan, budget, now)
            if not n:
                break
            budget -= n
            self._partial += req.num_computed + n < req.prefill_target


register(PolicySpec("chunked", "chunked prefill mixed with decodes under max_num_batched_tokens",
                    ChunkedScheduler, ("sim.policies.chunked",), order=2))
