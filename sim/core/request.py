"""A request's simulated life: arrival, admission, prefill progress, tokens, finish.

Why: policies and the cluster mutate these fields in place; metrics read them once at the
end. ``__slots__`` keeps 10^5-10^7 live requests small.
"""

from __future__ import annotations

import math

NAN = math.nan


class Request:
    """One request. Times are simulated seconds; ``nan`` means "not yet"."""

    __slots__ = (
        "request_id", "arrival_s", "prompt_tokens", "output_tokens",
        "num_generated", "num_computed", "prefill_target", "num_blocks",
        "first_scheduled_s", "first_token_s", "finish_s", "last_token_s",
        "num_preemptions", "replica", "status", "fail_reason",
        "g_join", "step_join", "phase", "epoch", "in_decode",
        "kv_ready", "swapped_blocks", "handoff_blocks", "transfer_start_s", "transfer_end_s",
        "hash_ids", "hash_block_size", "prefix_keys",
        "prefix_hit_tokens", "kv_hit_blocks",
        "ttft_wait_batch_s", "ttft_wait_kv_s", "ttft_prefill_s", "ttft_interference_s",
        "ttft_overhead_s", "ttft_preempt_s", "ttft_kv_transfer_s", "ttft_decode_s",
        "decode_wait_s", "decode_rounds_waited",
    )

    def __init__(self, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int):
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.num_generated = 0      # tokens emitted (stale while in the decode set)
        self.num_computed = 0       # tokens whose KV is computed, during (re)prefill
        self.prefill_target = prompt_tokens  # prompt + tokens generated before a recompute
        self.num_blocks = 0         # KV blocks held (stale while in the decode set)
        self.first_scheduled_s = NAN
        self.first_token_s = NAN
        self.finish_s = NAN
        self.last_token_s = NAN
        self.num_preemptions = 0
        self.replica = -1
        self.status = "waiting"     # waiting | running | completed | failed
        self.fail_reason = ""
        # decode-set bookkeeping (see policies/decode_set.py)
        self.g_join = 0
        self.step_join = 0
        self.phase = 0
        self.epoch = 0
        self.in_decode = False
        # KV computed elsewhere (host memory after a swap, or a prefill replica): admitted
        # straight into the decode set once blocks are free
        self.kv_ready = False
        self.swapped_blocks = 0
        self.handoff_blocks = 0     # KV blocks held on the prefill replica until decode admits
        self.transfer_start_s = NAN
        self.transfer_end_s = NAN
        self.decode_wait_s = NAN    # from KV arrival to decode admission (disaggregated)
        self.decode_rounds_waited = 0  # decode scheduling rounds that could not admit it
        # prefix caching (see kv.py, whose KVBlockManager owns the block tables): block-hash
        # ids of the prompt (and, for multi-turn sessions, of the answer), their cache keys
        self.hash_ids = None
        self.hash_block_size = 16
        self.prefix_keys = None
        self.prefix_hit_tokens = 0
        self.kv_hit_blocks = 0      # prefix-cache blocks its current allocation started with
        # TTFT decomposition, written by sim/core/ttft.py (whose TTFTAccounting keeps its working
        # state: wait marks, preemption starts): parts that add up to first_token_s - arrival_s
        self.ttft_wait_batch_s = 0.0
        self.ttft_wait_kv_s = 0.0
        self.ttft_prefill_s = 0.0
        self.ttft_interference_s = 0.0
        self.ttft_overhead_s = 0.0
        self.ttft_preempt_s = 0.0
        self.ttft_kv_transfer_s = 0.0  # disaggregated, first token from decode: KV transfer
        self.ttft_decode_s = 0.0       # ... then decode admission wait and its first step
