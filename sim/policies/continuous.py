"""``continuous``: iteration-level batching without chunking (Yu et al. 2022, "Orca"; vLLM with
``enable_chunked_prefill=False``).

Why: a waiting prompt joins at any step boundary but is prefilled whole in one step, so a long
prompt stalls every decode sharing that step: the interference chunked prefill removes.
"""

from __future__ import annotations

from sim.compiled_core import mypyc_attr
from sim.policies.base import Scheduler, StepPlan
from sim.policies.registry import PolicySpec, register


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled core
class ContinuousScheduler(Scheduler):
    name = "continuous"

    def admission_error(self, req) -> str:
        """Without chunked prefill a prompt is prefilled in one step, so it must fit the step's
        budget: vLLM's prompt limit is min(max_model_len, max_num_batched_tokens) and a longer
        prompt is rejected (vllm/core/scheduler.py ``_get_prompt_limit``; V1 refuses such a
        configuration outright), never run alone over the budget."""
        reason = super().admission_error(req)
        if not reason and req.prompt_tokens > self._budget:
            reason = (f"prompt {req.prompt_tokens} tokens > max_num_batched_tokens {self._limits.max_num_batched_tokens} "
                      "(policy continuous: no chunked prefill)")
        return reason

    def _first_chunk(self, remaining: int, budget: int, plan: StepPlan) -> int:
        if remaining > budget:
            # vLLM V1 without chunked prefill skips a prompt that does not fit the budget left
            # and tries the next ones (vllm/v1/core/sched/scheduler.py, skipped_waiting_requests).
            # NOTE: admission_error keeps every prompt within the whole budget; a preempted
            # request recomputes prompt + generated tokens, which may exceed it: that runs in a
            # step with no other prompt instead of waiting forever.
            if plan.chunks or remaining <= self._budget:
                # vLLM 0.34 stops admitting there instead ("If chunked_prefill is disabled, we
                # can stop the scheduling here": scheduler.py schedule, 0.34.0)
                return 0 if self._v034 else -1
        return remaining


register(PolicySpec("continuous", "iteration-level batching, whole prompts (no chunking)",
                    ContinuousScheduler, ("sim.policies.continuous",), order=1,
                    admission_modes=("vllm", "sglang"), scheduling_policies=("fcfs", "priority"),
                    capacity_scheduler_policies=("max_utilization", "guaranteed_no_evict"),
                    # vLLM 0.6.0 refuses chunked prefill with multi-step (vllm/engine/arg_utils.py:
                    # "Chunked prefill is not supported with multi-step"): whole prompts only
                    multi_step=True, separate_prefill_steps=True))
