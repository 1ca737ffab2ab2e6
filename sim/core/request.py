"""A request's simulated life: arrival, admission, prefill progress, tokens, finish.

Why: policies and the cluster mutate these fields in place; metrics read them once at the
end. ``__slots__`` keeps 10^5-10^7 live requests small. State with an owner elsewhere is not
here: KV blocks (block tables, the decode set's blocks, swapped and held blocks) belong to the
replica's KV manager (sim/core/kv.py), the TTFT clocks' working state to the TTFT accounting
(sim/core/ttft.py); what remains is grouped by concern below.
"""

from __future__ import annotations

import math
from typing import Any, Final

NAN: Final = math.nan  # (Final: compiled, a constant, not a look-up in the module's dict)

# an aborted request's status and reason (its client disconnected or gave up: vLLM's
# RequestStatus.FINISHED_ABORTED, finish reason "abort"): counted apart from failures
ABORTED: Final = "aborted"
ABORT_REASON: Final = "abort"


class Request:
    """One request. Times are simulated seconds; ``nan`` means "not yet"."""

    __slots__ = (
        # what was asked; ``key``: the id as one object, the key of the schedulers' and the KV
        # manager's dicts by request
        "request_id", "key", "arrival_s", "prompt_tokens", "output_tokens", "max_tokens",
        # vLLM's request priority (``scheduling_policy: priority``: a lower value is served first)
        "priority",
        # lifecycle (the scheduler's)
        "status", "fail_reason", "replica", "num_preemptions",
        "num_generated", "num_computed", "prefill_target", "kv_ready",
        "first_scheduled_s", "first_token_s", "last_token_s", "finish_s",
        # decode-set bookkeeping (policies/decode_set.py)
        "in_decode", "g_join", "step_join", "phase", "epoch",
        # disaggregation: the KV's trip from a prefill replica to a decode replica
        "transfer_start_s", "transfer_end_s", "decode_wait_s", "decode_rounds_waited",
        # prefix caching: the content's block hashes (sim/core/kv.py reads them)
        "hash_ids", "hash_block_size", "prefix_keys", "prefix_hit_tokens",
        # TTFT decomposition, written by sim/core/ttft.py: parts adding up to first_token_s - arrival_s
        "ttft_wait_batch_s", "ttft_wait_kv_s", "ttft_prefill_s", "ttft_interference_s",
        "ttft_overhead_s", "ttft_preempt_s", "ttft_kv_transfer_s", "ttft_decode_s", "ttft_kv_load_s",
    )

    def __init__(self, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 max_tokens: int = 0, priority: int = 0):
        # what was asked
        self.request_id = request_id
        # (typed Any: compiled, sim/compiled_core.py, the id is boxed once here, where each
        # ``d[req.request_id]`` made a new int object, which the dict then compared by value)
        self.key: Any = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        # ``output_tokens``: the tokens it will generate before its end of sequence (the model's
        # EOS: only the step that emits the last one reads it); ``max_tokens``: what the client
        # sent, 0 for none, which the scheduler replaces with the engine's default on arrival
        # (Scheduler.add_request). Every decision before the finish reads ``max_tokens`` only
        # (tests/test_no_oracle.py).
        self.output_tokens = output_tokens
        self.max_tokens = max_tokens
        self.priority = priority
        # lifecycle
        self.status = "waiting"     # waiting | running | completed | failed | rejected | aborted
        self.fail_reason = ""
        self.replica = -1
        self.num_preemptions = 0
        self.num_generated = 0      # tokens emitted (stale while in the decode set: see DecodeSet)
        self.num_computed = 0       # tokens whose KV is computed, during (re)prefill
        self.prefill_target = prompt_tokens  # prompt + tokens generated before a recompute
        # KV computed elsewhere (host memory after a swap, or a prefill replica): admitted
        # straight into the decode set once blocks are free
        self.kv_ready = False
        self.first_scheduled_s = NAN
        self.first_token_s = NAN
        self.last_token_s = NAN
        self.finish_s = NAN
        # decode-set bookkeeping: tokens and step count when it joined, KV-block phase, heap epoch
        self.in_decode = False
        self.g_join = 0
        self.step_join = 0
        self.phase = 0
        self.epoch = 0
        # disaggregation
        self.transfer_start_s = NAN
        self.transfer_end_s = NAN
        self.decode_wait_s = NAN    # from KV arrival to decode admission
        self.decode_rounds_waited = 0  # decode scheduling rounds that could not admit it
        # prefix caching: block-hash ids of the prompt (and, for multi-turn sessions, of the
        # answer), their cache keys (memoised by kv.prefix_keys), the prompt tokens found cached
        self.hash_ids: Any = None  # a list or an array of ints
        self.hash_block_size = 16
        self.prefix_keys: list[tuple[int, int]] | None = None
        self.prefix_hit_tokens = 0
        # TTFT decomposition (sim/core/ttft.py's TTFTAccounting keeps the working state: wait
        # marks, preemption starts)
        self.ttft_wait_batch_s = 0.0
        self.ttft_wait_kv_s = 0.0
        self.ttft_prefill_s = 0.0
        self.ttft_interference_s = 0.0
        self.ttft_overhead_s = 0.0
        self.ttft_preempt_s = 0.0
        self.ttft_kv_transfer_s = 0.0  # disaggregated, first token from decode: KV transfer
        self.ttft_decode_s = 0.0       # ... then decode admission wait and its first step
        self.ttft_kv_load_s = 0.0      # loading its prefix from the CPU offloading tier (sim/core/kv.py CPUTier)


def end_aborted(req: Request, at_s: float) -> None:
    """``req`` ends aborted by its client at ``at_s`` (status ``ABORTED``, reason ``ABORT_REASON``)."""
    req.status = ABORTED
    req.fail_reason = ABORT_REASON
    req.finish_s = at_s
