"""Exact decomposition of each request's time to first token.

Why: "why is p99 TTFT 13x the median" needs the tail's time split into causes that add up
exactly: waiting for admission because the batch or token budget was full
(``wait_batch``), waiting because KV blocks were full (``wait_kv``), its own prefill compute
(``prefill``: the step time its chunks would take alone), sharing steps with other work
(``interference``: the rest of those steps' compute), per-step engine overhead
(``overhead``), and, from a preemption before the first token on, everything until it
(``preempt``: re-waiting and recompute).

Waiting is attributed with two clocks per replica that accrue, between scheduling decisions,
to the reason admission last stopped (KV blocks, or batch/budget/step in progress); a
request's wait is the clocks' advance between its arrival and its admission. Every interval
after admission is a step of its replica (steps run back to back while it is prefilling),
split as above. With disaggregation and ``first_token: decode`` (vLLM P/D) two more parts
follow the prefill: the KV transfer (``kv_transfer``: from the prefill's end until the KV has
arrived) and ``decode`` (waiting for decode admission, then the decode replica's first step,
which emits the token). With ``first_token: prefill`` (DistServe) the transfer is not part of
TTFT; it delays the second token (column kv_transfer_s) and both parts are 0.
"""

from __future__ import annotations


TTFT_PARTS = ("ttft_wait_batch_s", "ttft_wait_kv_s", "ttft_prefill_s", "ttft_interference_s",
              "ttft_overhead_s", "ttft_preempt_s", "ttft_kv_transfer_s", "ttft_decode_s")


class WaitClocks:
    """Cumulative seconds during which admission was blocked by [batch/budget, KV]."""

    __slots__ = ("batch_s", "kv_s", "t_s", "kv_blocked")

    def __init__(self) -> None:
        self.batch_s = 0.0
        self.kv_s = 0.0
        self.t_s = 0.0
        self.kv_blocked = False

    def advance(self, now: float) -> None:
        if self.kv_blocked:
            self.kv_s += now - self.t_s
        else:
            self.batch_s += now - self.t_s
        self.t_s = now

    def mark(self, req, now: float) -> None:
        """``req`` starts waiting now."""
        self.advance(now)
        req.wait_mark_batch_s = self.batch_s
        req.wait_mark_kv_s = self.kv_s

    def settle(self, req, now: float) -> None:
        """``req`` is admitted now for the first time (clocks already advanced to ``now``)."""
        req.ttft_wait_batch_s = self.batch_s - req.wait_mark_batch_s
        req.ttft_wait_kv_s = self.kv_s - req.wait_mark_kv_s


class SoloPrefill:
    """Compute time of one chunk (n new tokens after ctx cached) alone in a step, without the
    engine overhead; memoised, since chunk shapes recur (fixed budgets, common prompt lengths)."""

    MAX_ENTRIES = 200_000

    def __init__(self, cost):
        self.cost = cost
        self._cache: dict[tuple[int, int, bool], float] = {}

    def __call__(self, n: int, ctx: int, completing: bool) -> float:
        key = (n, ctx, completing)
        hit = self._cache.get(key)
        if hit is None:
            hit = self.cost.prefill_alone_s(n, ctx, completing)
            if len(self._cache) < self.MAX_ENTRIES:
                self._cache[key] = hit
        return hit


def account_step(plan, waiting_prefills, kv_blocked: set, elapsed_s: float, cost, solo: SoloPrefill) -> None:
    """Split one step (or run) of ``elapsed_s`` among the first-prefill requests it concerns.

    Requests with a chunk in the step get prefill / interference / overhead;
    ``waiting_prefills`` (requests in prefill at the step's start that may have no chunk in it)
    waited through it.
    """
    chunks = plan.chunks
    if chunks:
        overhead = cost.overhead_s(plan.num_decode_seqs + len(chunks))
        compute = elapsed_s - overhead
        for (req, n), ctx in zip(chunks, plan.chunk_contexts):
            if req.num_generated or req.preempt_start_s == req.preempt_start_s:
                continue  # not before a first token, or already counted as preemption
            own = solo(n, ctx, ctx + n == req.prefill_target)
            if own > compute:
                own = compute
            req.ttft_prefill_s += own
            req.ttft_interference_s += compute - own
            req.ttft_overhead_s += overhead
    if waiting_prefills:
        in_step = {req.request_id for req, _ in chunks}
        for req in waiting_prefills:
            if req.request_id in in_step or req.num_generated or req.preempt_start_s == req.preempt_start_s:
                continue
            if req.request_id in kv_blocked:
                req.ttft_wait_kv_s += elapsed_s
            else:
                req.ttft_wait_batch_s += elapsed_s
