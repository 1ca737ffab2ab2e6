"""The running decode sequences of one replica, kept as aggregates.

Why: every running sequence gains one token per step, so a replica-wide step counter
(``steps``) gives each sequence's progress without touching it: a sequence that joined at
step s0 with g0 tokens has g0 + (steps - s0) now. Sums (sequences, context tokens), a
histogram of sequences by KV-block phase and a heap of finish steps make a step, or a run of
k identical decode steps, cost O(block_size + log n) however long the outputs are. The set's
KV blocks are counted by the KV manager (``KVBlockManager.decode_blocks``); the set says how
many more its next steps take.
With sliding-window KV groups (``sim.core.kv.KVGroups``) a sequence opening a block takes one
block per full-attention group, plus one per sliding group until its window is full: a second
histogram counts the sequences still filling their window, and a heap of the steps at which
each stops ends a run there, so the weights stay constant along a run.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Final
from sim.core.kv import KVBlockManager
from sim.core.request import Request


# A finish heap's entry: (step, request id, epoch, request), ordered by heapq's tuple comparison
# (step, then id, then epoch: no two entries share all three, as a request's epoch changes
# whenever it leaves the set); an entry whose epoch is no longer its request's is stale.
# (One path, heapq's, compiled and not: the typed heap that ordered them natively when
# compiled gained ~3% of a chunked run, bench/README.md "Compiled core, ninth round", under
# the 5% that keeps a second path: "Issue 39 item 3: one seam".)
_Due = tuple[int, int, int, Request]


def _drop_stale(heap: list[_Due]) -> None:
    """Pop the entries at the top whose request has left the set since (epoch moved on)."""
    while heap:
        _step, _id, epoch, req = heap[0]
        if epoch == req.epoch:
            return
        heappop(heap)


def _pop_due(heap: list[_Due], through_step: int) -> Request | None:
    """Pop the entries due by ``through_step`` up to the first whose request is still in the
    set (epoch current) and return that request, dropping stale ones on the way; None once
    nothing more is due."""
    while heap:
        step, _id, epoch, req = heap[0]
        if step > through_step:
            return None
        heappop(heap)
        if epoch == req.epoch:
            return req
    return None


# ``advance``'s answer when no sequence finishes (shared: its callers only read it)
_NO_REQUESTS: Final[list[Request]] = []


class DecodeSet:
    """Sequences past prefill, each producing one token per step."""

    def __init__(self, kv: KVBlockManager):
        self.kv = kv
        self.block_size = block_size = kv.block_size
        self.groups = groups = kv.groups
        self.w_full, self.w_slide = groups.full, groups.sliding  # blocks per opening event
        # a sequence's sliding pages grow with each block opening at a position up to
        # (hit blocks + window_blocks - 1) x block_size (``_slide_last``)
        self._sliding = groups.sliding > 0
        self.num_filling = 0        # sequences whose sliding-window blocks still grow
        self.filling_count = [0] * block_size  # those, by phase class (as phase_count)
        self._fill_heap: list[_Due] = []  # (step it stops, id, epoch, request)
        self.steps = 0              # decode steps this replica has run
        self.num_seqs = 0
        self.context_tokens = 0     # sum over sequences of computed tokens (KV slots filled)
        # phase_count[q]: sequences whose computed-token count n satisfies
        # n % block_size == (q + steps) % block_size; constant while a sequence stays in the set.
        self.phase_count = [0] * block_size
        self._heap: list[_Due] = []  # (finish step, id, epoch, request)
        # (step whose scheduling fills its next block with a hash key, id, epoch, request): the
        # generated blocks others can hit, published block by block as of each look-up
        # (``publish``; vLLM V1 ``allocate_slots`` -> ``cache_blocks`` every step)
        self.pub_heap: list[_Due] = []
        # Speculative decoding (ARCHITECTURE.md section 1; sim/cost/speculative.py): each engine
        # step emits E tokens per sequence on average (E x 1000 here, an int; 0: off). ``steps``
        # then counts tokens, not engine steps: after ``engine_steps`` decode steps every
        # sequence in the set has gained floor(engine_steps x E) - floor(at its join x E)
        # tokens, so all of them gain the same tokens in a step (``spec_step_tokens``) and
        # everything above, kept per token, holds unchanged.
        self.spec_milli = 0
        self.engine_steps = 0
        # KV slots each sequence holds past its context: the draft slots and the drafter's
        # lookahead (sim/policies/base.py ``spec_slots``; 0 without speculative decoding). A
        # sequence's blocks are those of context + spec_slots tokens, so its phase, and every
        # block count from it, is taken at that position.
        self.spec_slots = 0
        if kv.prefix_caching:
            kv.before_lookup = self.publish_between_steps

    # -- membership ---------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        """``req`` just emitted token ``num_generated`` at the end of a prefill, holding the
        blocks of its context and ``spec_slots`` more (the scheduler allocated them)."""
        n = req.prompt_tokens + req.num_generated - 1
        req.g_join = req.num_generated
        req.step_join = self.steps
        req.phase = (n + self.spec_slots - self.steps) % self.block_size
        req.in_decode = True
        self.num_seqs += 1
        self.context_tokens += n
        self.kv.to_decode(req)
        self.phase_count[req.phase] += 1
        finish_step = self.steps + req.output_tokens - req.num_generated
        heappush(self._heap, (finish_step, req.request_id, req.epoch, req))
        if req.prefix_keys:  # it may generate blocks others can hit (``kv.unpublished_key``)
            self._push_publish(req)
        if not self._sliding:  # _slide_last is -1: nothing to fill
            return
        last = self._slide_last(req)
        if n <= last:  # it opens blocks at n + j for j = 0, bs, ... up to ``last``
            self.num_filling += 1
            self.filling_count[req.phase] += 1
            heappush(self._fill_heap, (self.steps + last - n + 1, req.request_id, req.epoch, req))

    def remove(self, req: Request) -> None:
        """Take ``req`` out (finish, preemption, a step without it), writing back its tokens;
        its blocks are its own again (the KV manager's table counts them)."""
        g = req.g_join + (self.steps - req.step_join)
        n = req.prompt_tokens + g - 1
        req.num_generated = g
        self.kv.from_decode(req, n + self.spec_slots)
        if self.pub_heap and req.prefix_keys:
            # its blocks full by its last step (n tokens: V1 cached them when it scheduled it)
            self.kv.cache(req, n)
        req.in_decode = False
        if self.num_filling and self._filling(req):
            self.num_filling -= 1
            self.filling_count[req.phase] -= 1
        req.epoch += 1  # invalidates its heap entries
        self.num_seqs -= 1
        self.context_tokens -= n
        self.phase_count[req.phase] -= 1

    def _slide_last(self, req: Request) -> int:
        """The last token position (0-based) whose block opening adds sliding pages for
        ``req``: its own sliding pages, min(b - hit blocks, window_blocks), grow until then;
        -1 without sliding groups."""
        if not self._sliding:
            return -1
        return (self.kv.hit_blocks(req) + self.groups.window_blocks - 1) * self.block_size

    def _filling(self, req: Request) -> bool:
        """Whether ``req`` (in the set) still fills its sliding windows: its next opening event
        lies at or before ``_slide_last``."""
        if not self.num_filling:
            return False
        n = req.prompt_tokens + req.g_join - 1  # its context at join
        last = self._slide_last(req)
        return n <= last and self.steps - req.step_join <= last - n

    def blocks_at_next_step(self, req: Request) -> int:
        """Blocks ``req`` opens in the next step: 0 unless its blocks are full."""
        if (req.phase + self.steps) % self.block_size:
            return 0
        return self.w_full + (self.w_slide if self._filling(req) else 0)

    def spec_step_tokens(self) -> int:
        """Tokens each sequence gains in the next decode step under speculative decoding: the
        replica's cumulative count floor(steps x E) moves by floor(E) or ceil(E) (a
        deterministic rule: every request's token times are exact functions of the step count)."""
        e, s = self.spec_milli, self.engine_steps
        return ((s + 1) * e) // 1000 - (s * e) // 1000

    def blocks_in_next_tokens(self, req: Request, num_tokens: int) -> int:
        """Blocks ``req`` opens over its next ``num_tokens`` tokens (no sliding-window groups:
        speculative decoding refuses them): token j opens one when (phase + steps + j) % bs == 0."""
        bs = self.block_size
        first = -(req.phase + self.steps) % bs
        if first >= num_tokens:
            return 0
        return self.w_full * (1 + (num_tokens - 1 - first) // bs)

    # -- generated blocks in the prefix cache ---------------------------------------------------
    # A sequence that joined at step s0 with g0 tokens is scheduled at step S >= s0 with
    # prompt + g0 + (S - s0) tokens, and V1's allocate_slots caches the full blocks among them
    # (vllm/v1/core/kv_cache_manager.py allocate_slots -> coordinator.cache_blocks, capped at
    # request.num_tokens). Its block j (0-based) is full from the step
    # s0 + (j + 1) x block_size - prompt - g0 on.
    def _push_publish(self, req: Request) -> None:
        """Queue ``req``'s next block with a hash key at the step that fills it (none: nothing)."""
        j = self.kv.unpublished_key(req)
        if j >= 0:
            due = req.step_join + (j + 1) * self.block_size - req.prompt_tokens - req.g_join
            heappush(self.pub_heap, (due, req.request_id, req.epoch, req))

    def publish(self, through_step: int) -> None:
        """Publish the hash-keyed generated blocks full once step ``through_step`` (0-based: the
        decodes of step ``steps`` are scheduled, or the last one run, ``steps - 1``) is
        scheduled. Idempotent; work per block published, none per token."""
        heap = self.pub_heap
        # (a request that left the set since is stale: ``remove`` published its blocks)
        while (req := _pop_due(heap, through_step)) is not None:
            self.kv.cache(req, req.prompt_tokens + req.g_join + (through_step - req.step_join))
            self._push_publish(req)

    def publish_between_steps(self) -> None:
        """``publish`` as of the last step run (a look-up between steps)."""
        if self.pub_heap:
            self.publish(self.steps - 1)

    # -- look-ahead ---------------------------------------------------------------------------
    # Step j of a run computes the token at position n + j and needs ceil((n + j + 1) / bs)
    # blocks: one more than held exactly when (n + j) % bs == 0. A sequence of phase class q
    # first allocates at step r = -(q + steps) mod bs, then every bs steps; so the class with
    # first-allocation offset r is q = -(r + steps) mod bs.
    # Weights: each event takes w_full blocks, plus w_slide for a sequence filling its window
    # (constant along a run: a run ends where one stops, ``steps_to_next_change``).
    def _count_at_offset(self, r: int) -> int:
        q = (-r - self.steps) % self.block_size
        if not self.num_filling:
            return self.w_full * self.phase_count[q]
        return self.w_full * self.phase_count[q] + self.w_slide * self.filling_count[q]

    def _per_round(self) -> int:
        return self.w_full * self.num_seqs + self.w_slide * self.num_filling

    def blocks_next_step(self) -> int:
        """``blocks_needed(1)``: the sequences whose blocks are full (offset r = 0)."""
        if not self.num_filling and self.w_full == 1:
            return self.phase_count[-self.steps % self.block_size]
        return self._count_at_offset(0)

    def blocks_needed(self, num_steps: int) -> int:
        """New KV blocks the set takes over the next ``num_steps`` steps (at most
        ``steps_to_next_change``)."""
        if num_steps <= 0 or not self.num_seqs:
            return 0
        rounds, rem = divmod(num_steps, self.block_size)
        if not self.num_filling and self.w_full == 1:  # one block per opening (no sliding windows filling)
            # sum(counts[(q0 - r) % bs] for r in range(rem)), q0 the class at offset 0: the
            # classes q0, q0 - 1, ... wrap below 0 to the end of the list, as negative indices
            # do (a loop, not two slices: compiled, sim/compiled_core.py, native reads and
            # additions, where a slice is a new list and sum() a generic call)
            counts, q0 = self.phase_count, -self.steps % self.block_size
            total = rounds * self.num_seqs
            for i in range(q0 + 1 - rem, q0 + 1):
                total += counts[i]  # (i < 0: from the end, as the slice)
            return total
        return rounds * self._per_round() + sum(self._count_at_offset(r) for r in range(rem))

    def max_steps_within(self, free_blocks: int) -> int:
        """Largest k such that ``blocks_needed(k) <= free_blocks``."""
        per_round = self._per_round()
        if self.num_seqs == 0 or per_round == 0:
            return 1 << 62
        # Allocation events come in rounds of bs steps, ordered inside a round by offset r;
        # the block numbered free_blocks (0-based) is the first that cannot be met.
        rounds, idx = divmod(free_blocks, per_round)
        seen = 0
        if not self.num_filling and self.w_full == 1:
            # _count_at_offset(r) is counts[(q0 - r) % bs] here: walk the classes down from q0
            counts, bs = self.phase_count, self.block_size
            q = -self.steps % bs
            for r in range(bs):
                seen += counts[q]
                if seen > idx:
                    return r + rounds * bs
                q = q - 1 if q else bs - 1
            raise AssertionError("phase histogram inconsistent with num_seqs")
        for r in range(self.block_size):
            seen += self._count_at_offset(r)
            if seen > idx:
                return r + rounds * self.block_size
        raise AssertionError("phase histogram inconsistent with num_seqs")

    def steps_to_next_finish(self) -> int:
        """Steps until the earliest sequence emits its last token (>= 1)."""
        heap = self._heap
        _drop_stale(heap)
        if not heap:
            return 1 << 62
        step, _id, _epoch, _req = heap[0]
        return step - self.steps

    def steps_to_next_change(self) -> int:
        """Steps until the set's block weights or membership change: the earliest finish, or the
        step after which a sequence's sliding windows are full (>= 1)."""
        k = self.steps_to_next_finish()
        heap = self._fill_heap
        _drop_stale(heap)
        if heap:
            step, _id, _epoch, _req = heap[0]
            k = min(k, step - self.steps)
        return k

    # -- progress -----------------------------------------------------------------------------
    def advance(self, num_steps: int) -> list[Request]:
        """Run ``num_steps`` decode steps (the caller allocated their blocks); return finishers
        (a shared empty list when none: read it, do not change it)."""
        self.steps = steps = self.steps + num_steps
        self.context_tokens += self.num_seqs * num_steps
        fill = self._fill_heap
        while (req := _pop_due(fill, steps)) is not None:
            # its windows are full: its openings take w_full from now on
            self.num_filling -= 1
            self.filling_count[req.phase] -= 1
        heap = self._heap
        done = _NO_REQUESTS  # (most steps: no list made)
        while (req := _pop_due(heap, steps)) is not None:
            if done is _NO_REQUESTS:
                done = []
            done.append(req)
        return done
