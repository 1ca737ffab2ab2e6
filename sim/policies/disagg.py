"""Schedulers of a disaggregated deployment (Zhong et al. 2024, "DistServe"; Patel et al. 2024,
"Splitwise"): a prefill pool that only runs prompts, a decode pool that only extends them.

Why: separating the phases removes prefill-decode interference at the price of moving each
request's KV cache between pools. The prefill replica computes the prompt, then keeps the
request's KV blocks until a decode replica has received them and admitted the request
(backpressure: a full decode pool stalls the prefill pool's admissions through its KV).

Who emits the first token (``first_token_on_decode``): DistServe's convention is the prefill
replica (its token is the first the client sees; the decode side produces the rest). In vLLM's
P/D serving the prefill instance runs with max_tokens 1 and its token is discarded; the decode
instance loads the external KV for all prompt tokens but the last and recomputes that one
(vLLM ``Scheduler._update_waiting_for_remote_kv`` keeps ``num_computed_tokens`` below the
prompt length), so its first step with the request samples token 1 and it produces all
``output_tokens``: a decode step with the prompt's last token as its query.
NOTE: the KV is pushed as soon as the prefill ends and the decode replica then admits the
request when blocks are free; vLLM's decode instance first allocates blocks, then pulls the
KV. Without decode-side KV pressure the two orders give the same times.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sim.policies.base import settle_max_tokens
from sim.policies.chunked import ChunkedScheduler
from sim.policies.continuous import ContinuousScheduler
from sim.policies.registry import PolicySpec, register
from sim.core.request import Request


class PrefillScheduler(ContinuousScheduler):
    """Whole prompts, batched under the token budget; hands each request off after its first token."""

    name = "prefill"

    def __init__(self, limits, kv):
        super().__init__(limits, kv)
        self.handoffs: list[Request] = []  # drained by the cluster after each step

    def admission_error(self, req: Request) -> str:
        reason = settle_max_tokens(req, self.limits.max_model_len)
        if reason:
            return reason
        if req.prompt_tokens > self.limits.max_num_batched_tokens:  # whole prompts, as ``continuous``
            return (f"prompt {req.prompt_tokens} tokens > max_num_batched_tokens {self.limits.max_num_batched_tokens} "
                    "(prefill pool: no chunked prefill)")
        need = self.kv.blocks_for(req.prompt_tokens)
        if need > self.kv.num_blocks:
            return f"prompt needs {need} KV blocks; prefill replica has {self.kv.num_blocks}"
        return ""

    first_token_on_decode = False

    def _on_prefill_done(self, req: Request, now: float) -> None:
        del self.running[req.key]
        self.kv.hold(req)  # its blocks stay in kv.num_used until released
        if self.first_token_on_decode:  # the prefill's token is discarded: decode emits token 1
            req.num_generated = 0
            req.first_token_s = math.nan
            self.tokens_emitted -= 1
        self.handoffs.append(req)

    def _finish(self, req: Request, now: float, finished: list[Request]) -> None:
        """A one-token request ends here, unless the decode side emits its token."""
        if self.first_token_on_decode:
            self._on_prefill_done(req, now)
        else:
            super()._finish(req, now, finished)

    def release_handoff(self, req: Request) -> None:
        """The decode side admitted ``req``: its prefill-side KV (and prefix-cache references)
        can go (each replica's KV manager counts only its own blocks of it)."""
        self.kv.free(req)


class DecodeScheduler(ChunkedScheduler):
    """Admits requests whose KV has arrived; a preempted one is recomputed here in chunks."""

    name = "decode"

    def __init__(self, limits, kv):
        super().__init__(limits, kv)
        self.on_admitted: Callable[[Request], None] = lambda req: None
        # the requests whose KV a prefill replica sent here, not yet admitted (the one record of
        # them): request id -> this scheduler's rounds so far when the KV arrived
        self._arriving: dict[int, int] = {}

    def add_transferred(self, req: Request) -> None:
        """``req``'s KV arrived (``req.transfer_end_s``): it waits for blocks and a batch slot."""
        self._arriving[req.request_id] = self.num_schedules
        req.kv_ready = True
        req.status = "waiting"
        self.incoming -= 1
        self.waiting.append(req)

    def _on_kv_admitted(self, req: Request, now: float) -> None:
        """A sent request admitted (not a swap-in): its wait for decode admission and the rounds
        before this one that could not admit it (full batch or KV: backpressure) are recorded,
        then ``on_admitted`` (the cluster frees its prefill-side KV)."""
        arrival_round = self._arriving.get(req.request_id)
        if arrival_round is None:  # a swap-in
            return
        del self._arriving[req.request_id]
        req.decode_wait_s = now - req.transfer_end_s
        req.decode_rounds_waited = self.num_schedules - 1 - arrival_round
        self.on_admitted(req)


register(PolicySpec("disaggregated", "separate prefill and decode pools joined by a KV transfer link",
                    None, ("sim.policies.disagg", "sim.engine.topology", "sim.engine.link", "sim.policies.continuous", "sim.policies.chunked"),
                    pools=True, pool_chunked_prefill=(("prefill", False), ("decode", True)), order=3,
                    # a pool's replica is built with one stage and no DP ranks (build_deployment)
                    pipeline_parallel=False, data_parallel=False))
