"""``static``: request-level batching (FasterTransformer; TensorRT-LLM static batching).

Why: the baseline that iteration-level batching beats (Yu et al. 2022, "Orca", section 2):
up to ``max_num_seqs`` waiting requests are prefilled together (within the token budget), then
decoded until every one of them has finished; finished slots sit idle and nothing new joins until the whole batch is
done. KV for each request's full length (its prompt and max_tokens) is reserved at admission, as
static engines allocate for the maximum sequence length, so a batch never preempts.
NOTE: vLLM has no static batching; this policy is a baseline, not a vLLM mode.
"""

from __future__ import annotations

from sim.policies.base import Scheduler, StepPlan
from sim.policies.registry import PolicySpec, register


class StaticScheduler(Scheduler):
    """A batch's prompts are prefilled whole, in steps of at most ``max_num_batched_tokens``
    tokens: one step when they fit, else several prompt-only steps, the batch's decodes waiting
    until all its prompts are done (their gaps span those steps), then decoding together. A
    budget that cannot hold a whole prompt is refused (sim/policies/budget.py).
    NOTE: static engines size their token budget (TensorRT-LLM's max_num_tokens) to hold a
    whole batch's prompts: set max_num_batched_tokens so to model one prefill pass per batch."""

    name = "static"

    def __init__(self, limits, kv):
        super().__init__(limits, kv)
        # prompt steps of their own, pausing the batch's decodes (their gaps span them)
        self._separate = True
        self._prompt_steps_pause = True
        self._forming = False  # the batch in flight is still being prefilled (its budget ran out)
        # KV blocks free when the batch began, and the full-length blocks its members reserve
        self._batch_free = self._batch_reserved = 0

    def admission_error(self, req) -> str:
        """A prompt is prefilled whole, so it must fit the budget (as ``continuous``; the
        scenario check refuses a budget below max_model_len unless the engine profile allows it,
        ``budget_covers_max_model_len: false`` as ``trt-llm`` and ``trt-llm-2023``, or the
        scheduler is built by hand)."""
        reason = super().admission_error(req)
        if not reason and req.prompt_tokens > self.limits.max_num_batched_tokens:
            # the budget stands for the static engine's input bound: TensorRT-LLM's GptSession
            # refuses a prompt over its engine's max_input_len / max_num_tokens (sim/catalog/
            # engine_profiles.yaml trt-llm-2023, budget_covers_max_model_len)
            reason = (f"prompt {req.prompt_tokens} tokens > max_num_batched_tokens {self.limits.max_num_batched_tokens} "
                      "(policy static: whole prompts; TensorRT-LLM's engine input bound, max_input_len)")
        return reason

    def _first_chunk(self, remaining: int, budget: int, plan: StepPlan) -> int:
        return remaining if remaining <= budget else 0  # whole prompts, within the step's budget

    def _fill_prefills(self, plan: StepPlan, budget: int, now: float) -> None:
        if self.running and not self._forming:
            return  # the batch in flight must drain first
        if not self.running:  # a new batch
            self._batch_free, self._batch_reserved = self.kv.num_free, 0
        self._forming = False
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            req = self.waiting[0]
            full = self.kv.blocks_for(req.prompt_tokens + req.max_tokens - 1)  # its max_tokens: all it knows
            if self._batch_reserved + full > self._batch_free:
                break
            n = self._try_admit(req, plan, budget, now)
            if n <= 0:
                # the step's budget is full: the batch goes on forming in the next step
                self._forming = bool(plan.chunks) and not plan.kv_blocked
                break
            budget -= n
            self._batch_reserved += full


register(PolicySpec("static", "request-level batching: a batch runs until all its requests finish",
                    StaticScheduler, ("sim.policies.static",), order=0, iteration_level=False))
