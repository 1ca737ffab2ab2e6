"""The running decode sequences of one replica, kept as aggregates.

Why: every running sequence gains one token per step, so a replica-wide step counter
(``steps``) gives each sequence's progress without touching it: a sequence that joined at
step s0 with g0 tokens has g0 + (steps - s0) now. Sums (sequences, context tokens, KV blocks),
a histogram of sequences by KV-block phase and a heap of finish steps make a step, or a run of
k identical decode steps, cost O(block_size + log n) however long the outputs are.
"""

from __future__ import annotations

import heapq

from sim.core.kv import blocks_for
from sim.core.request import Request


class DecodeSet:
    """Sequences past prefill, each producing one token per step."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.steps = 0              # decode steps this replica has run
        self.num_seqs = 0
        self.context_tokens = 0     # sum over sequences of computed tokens (KV slots filled)
        self.num_blocks = 0         # KV blocks held by the set
        # phase_count[q]: sequences whose computed-token count n satisfies
        # n % block_size == (q + steps) % block_size; constant while a sequence stays in the set.
        self.phase_count = [0] * block_size
        self._heap: list[tuple[int, int, int, Request]] = []  # (finish step, id, epoch, request)

    # -- membership ---------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        """``req`` just emitted token ``num_generated`` at the end of a prefill."""
        n = req.prompt_tokens + req.num_generated - 1
        req.g_join = req.num_generated
        req.step_join = self.steps
        req.phase = (n - self.steps) % self.block_size
        req.in_decode = True
        self.num_seqs += 1
        self.context_tokens += n
        self.num_blocks += req.num_blocks
        self.phase_count[req.phase] += 1
        finish_step = self.steps + req.output_tokens - req.num_generated
        heapq.heappush(self._heap, (finish_step, req.request_id, req.epoch, req))

    def remove(self, req: Request) -> None:
        """Take ``req`` out (finish or preemption), writing back its tokens and blocks."""
        g = req.g_join + (self.steps - req.step_join)
        n = req.prompt_tokens + g - 1
        req.num_generated = g
        req.num_blocks = blocks_for(n, self.block_size)
        req.in_decode = False
        req.epoch += 1  # invalidates its heap entry
        self.num_seqs -= 1
        self.context_tokens -= n
        self.num_blocks -= req.num_blocks
        self.phase_count[req.phase] -= 1

    # -- look-ahead ---------------------------------------------------------------------------
    # Step j of a run computes the token at position n + j and needs ceil((n + j + 1) / bs)
    # blocks: one more than held exactly when (n + j) % bs == 0. A sequence of phase class q
    # first allocates at step r = -(q + steps) mod bs, then every bs steps; so the class with
    # first-allocation offset r is q = -(r + steps) mod bs.
    def _count_at_offset(self, r: int) -> int:
        return self.phase_count[(-r - self.steps) % self.block_size]

    def blocks_next_step(self) -> int:
        """``blocks_needed(1)``: the sequences whose blocks are full (offset r = 0)."""
        return self.phase_count[-self.steps % self.block_size]

    def blocks_needed(self, num_steps: int) -> int:
        """New KV blocks the set takes over the next ``num_steps`` steps."""
        if num_steps <= 0 or not self.num_seqs:
            return 0
        rounds, rem = divmod(num_steps, self.block_size)
        counts, bs, base = self.phase_count, self.block_size, -self.steps
        return rounds * self.num_seqs + sum(counts[(base - r) % bs] for r in range(rem))

    def max_steps_within(self, free_blocks: int) -> int:
        """Largest k such that ``blocks_needed(k) <= free_blocks``."""
        if self.num_seqs == 0:
            return 1 << 62
        # Allocation events come in rounds of bs steps, ordered inside a round by offset r;
        # the event numbered free_blocks (0-based) is the first that cannot be met.
        rounds, idx = divmod(free_blocks, self.num_seqs)
        seen = 0
        for r in range(self.block_size):
            seen += self._count_at_offset(r)
            if seen > idx:
                return r + rounds * self.block_size
        raise AssertionError("phase histogram inconsistent with num_seqs")

    def steps_to_next_finish(self) -> int:
        """Steps until the earliest sequence emits its last token (>= 1)."""
        heap = self._heap
        while heap and heap[0][2] != heap[0][3].epoch:
            heapq.heappop(heap)
        if not heap:
            return 1 << 62
        return heap[0][0] - self.steps

    # -- progress -----------------------------------------------------------------------------
    def advance(self, num_steps: int, new_blocks: int) -> list[Request]:
        """Run ``num_steps`` decode steps (the caller allocated ``new_blocks``); return finishers."""
        self.steps += num_steps
        self.context_tokens += self.num_seqs * num_steps
        self.num_blocks += new_blocks
        done = []
        heap = self._heap
        while heap and heap[0][0] <= self.steps:
            _, _, epoch, req = heapq.heappop(heap)
            if epoch == req.epoch:
                done.append(req)
        return done
