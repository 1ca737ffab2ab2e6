"""Exact decomposition of each request's time to first token.

Why: "why is p99 TTFT 13x the median" needs the tail's time split into causes that add up
exactly: waiting for admission because the batch or token budget was full
(``wait_batch``), waiting because KV blocks were full (``wait_kv``), its own prefill compute
(``prefill``: the step time its chunks would take alone), sharing steps with other work
(``interference``: the rest of those steps' compute), per-step engine overhead
(``overhead``), and, from a preemption before the first token on, everything until it
(``preempt``: re-waiting and recompute). The serving front end's share (``frontend``: HTTP,
tokenisation, detokenisation, streaming) is added outside the replicas (sim/engine/frontend.py).

Waiting is attributed with two clocks per replica that accrue, between scheduling decisions,
to the reason admission last stopped (KV blocks, or batch/budget/step in progress); a
request's wait is the clocks' advance between its arrival and its admission. Every interval
after admission is a step of its replica (steps run back to back while it is prefilling),
split as above. With disaggregation and ``first_token: decode`` (vLLM P/D) two more parts
follow the prefill: the KV transfer (``kv_transfer``: from the prefill's end until the KV has
arrived) and ``decode`` (waiting for decode admission, then the decode replica's first step,
which emits the token). With ``first_token: prefill`` (DistServe) the transfer is not part of
TTFT; it delays the second token (column kv_transfer_s) and both parts are 0.

The accounting observes, it does not schedule: each replica's ``TTFTAccounting`` reads the
scheduler's plans (who was admitted for the first time, who was preempted, whether admission
stopped on KV, which prompts got no chunk) and the steps' durations; no policy calls it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # (types only: the compiled core reads their fields natively through them)
    from sim.core.request import Request
    from sim.policies.base import StepPlan


# the parts the engine's replicas record on each request: they add up to the engine's TTFT (its
# first token less the request's arrival at the engine)
ENGINE_TTFT_PARTS = ("ttft_wait_batch_s", "ttft_wait_kv_s", "ttft_prefill_s", "ttft_interference_s",
                     "ttft_overhead_s", "ttft_preempt_s", "ttft_kv_transfer_s", "ttft_decode_s",
                     "ttft_kv_load_s")
# the serving front end's part (sim/engine/frontend.py): from the client's send to the request's
# arrival at the engine (HTTP, tokenisation, waiting for the API server) plus the first chunk's
# way out (detokenisation, its SSE event); 0 offline
FRONTEND_PART = "ttft_frontend_s"
# every part of the client's TTFT, which they add up to exactly
TTFT_PARTS = (*ENGINE_TTFT_PARTS, FRONTEND_PART)


def take_out_of_wait(req: Request, load_s: float) -> None:
    """The seconds a request's prefix spent loading from the CPU offloading tier, taken out of
    its wait parts (the load ran between its arrival and its admission, while the clocks
    accrued to whatever stopped admission): from the batch/budget wait first, the rest from the
    KV wait. NOTE: which of the two waits the load overlapped is not tracked; the sum is exact."""
    b = req.ttft_wait_batch_s
    if load_s <= b:
        req.ttft_wait_batch_s = b - load_s
    else:
        req.ttft_wait_batch_s = 0.0
        req.ttft_wait_kv_s -= load_s - b


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


_BELOW: Final = 1 << 32
_NAN: Final = float("nan")


def solo_key(n: int, ctx: int, completing: bool) -> int | tuple[int, int, bool]:
    """``SoloPrefill``'s memo key of a chunk: (n << 33) + (ctx << 1) + completing, one int
    (unique while ctx < 2**32 tokens, more than any KV cache holds; else the tuple)."""
    return (n << 33) + (ctx << 1) + completing if ctx < _BELOW else (n, ctx, completing)


class SoloPrefill:
    """Compute time of one chunk (n new tokens after ctx cached) alone in a step, without the
    engine overhead; memoised, since chunk shapes recur (fixed budgets, common prompt lengths)."""

    MAX_ENTRIES = 200_000

    def __init__(self, cost, cache: dict[int | tuple[int, int, bool], float] | None = None):
        """``cache``: a memo to share (others asking the same model: its entries are pure
        functions of the key); a new one when None."""
        self.cost = cost
        # keyed by ``solo_key``: one int, hashed and compared at a fraction of the cost of an
        # (n, ctx, completing) tuple (this is looked up once per prompt chunk). Read in place
        # first on the hot path (TTFTAccounting.on_step), which calls ``computed`` on a miss.
        self.cache: dict[int | tuple[int, int, bool], float] = cache if cache is not None else {}

    def computed(self, key: int | tuple[int, int, bool], n: int, ctx: int, completing: bool) -> float:
        """The seconds of a chunk not in the memo (``key``: its ``solo_key``), memoised."""
        own = self.alone_s(n, ctx, completing)
        if len(self.cache) < self.MAX_ENTRIES:
            self.cache[key] = own
        return own

    def alone_s(self, n: int, ctx: int, completing: bool) -> float:
        """The cost model's seconds of the chunk alone (``prefill_alone_s``), not memoised."""
        own: float = self.cost.prefill_alone_s(n, ctx, completing)
        return own


class TTFTAccounting:
    """One replica's observer of its scheduler: reads each ``StepPlan`` (what the scheduler
    decided) and each step's duration, and writes the ``ttft_*_s`` parts of the requests.
    The replica calls ``on_arrival`` for a request it queued, ``on_schedule`` after every
    scheduling round (idle ones too) and ``on_step`` when the planned step has run, before the
    scheduler applies it, if ``concerns`` it."""

    def __init__(self, cost, solo: SoloPrefill | None = None) -> None:
        self.cost = cost
        self.solo = solo if solo is not None else SoloPrefill(cost)  # ranks of one replica share one
        self.clocks = WaitClocks()
        self._preempted_at: dict[int, float] = {}  # request id -> its preemption before a first token
        # sequences in a step -> cost.overhead_s of it (pure); NaN: not asked yet. A list indexed
        # by the count (compiled, sim/compiled_core.py, a native read where a dict look-up boxed
        # the count and hashed it)
        self._overhead_s: list[float] = []
        # whether a step's prompt chunks add engine overhead (most profiles: no; then nothing is summed)
        # (a cost model without the method, as tests' stand-ins, has none)
        prompt_overhead = getattr(cost, "prompt_overhead_s", None)
        self._prompt_host: bool = prompt_overhead is not None and prompt_overhead(1, 1) > 0.0

    def on_arrival(self, req: Request, now: float) -> None:
        """``req`` starts waiting now: until it is first scheduled, its two wait parts hold the
        clocks' readings now (``on_schedule`` turns them into the waits; a dict of marks by
        request id cost a tuple, a boxed id and two boxed floats per request)."""
        clocks = self.clocks
        clocks.advance(now)
        req.ttft_wait_batch_s = clocks.batch_s
        req.ttft_wait_kv_s = clocks.kv_s

    def on_schedule(self, plan: StepPlan, now: float) -> None:
        """Waiting up to ``now`` accrues to the reason the last round stopped admitting; the
        requests scheduled for the first time settle their wait; from a preemption before the
        first token on, the rest of the TTFT counts as preemption."""
        clocks = self.clocks
        if clocks.kv_blocked:  # clocks.advance(now), inline: this runs every round
            clocks.kv_s += now - clocks.t_s
        else:
            clocks.batch_s += now - clocks.t_s
        clocks.t_s = now
        for req in plan.new_reqs:  # (their wait parts hold the clocks' readings at arrival)
            req.ttft_wait_batch_s = clocks.batch_s - req.ttft_wait_batch_s
            req.ttft_wait_kv_s = clocks.kv_s - req.ttft_wait_kv_s
            load: float = req.ttft_kv_load_s
            if load > 0.0:  # it waited for its CPU-tier load (sim/policies/base.py ``_offload_admit``)
                take_out_of_wait(req, load)
        clocks.kv_blocked = plan.kv_blocked
        for req in plan.preempted:
            if not req.num_generated and req.key not in self._preempted_at:
                self._preempted_at[req.key] = now

    @staticmethod
    def concerns(plan: StepPlan) -> bool:
        """Whether ``on_step`` has anything to do for ``plan``: most decode steps it has not."""
        return bool(plan.chunks or plan.prompts_skipped or plan.kv_ready)

    def on_step(self, plan: StepPlan, now: float, elapsed_s: float) -> None:
        """Split the step (or run) of ``elapsed_s`` that ended at ``now`` among the requests
        before their first token that it concerns: those with a chunk in it get prefill /
        interference / overhead; running prompts it left without a chunk waited through it.
        With disaggregation a request whose first token this decode step emits gets the KV
        transfer and the decode admission + step."""
        chunks = plan.chunks
        preempted_at = self._preempted_at
        if chunks:
            seqs = plan.num_decode_seqs + len(chunks)
            # (the seconds below typed float: compiled, sim/compiled_core.py, native arithmetic)
            known = self._overhead_s
            if seqs >= len(known):
                known.extend([_NAN] * (seqs + 1 - len(known)))
            overhead: float = known[seqs]
            if overhead != overhead:
                overhead = known[seqs] = self.cost.overhead_s(seqs)
            if self._prompt_host:  # the step's per-prompt host work (EngineProfile.prompt_cpu_s)
                new_tokens = 0
                for _, n in chunks:
                    new_tokens += n
                overhead += self.cost.prompt_overhead_s(len(chunks), new_tokens)
            compute = elapsed_s - overhead
            solo = self.solo
            # SoloPrefill's memo, read here first (once per chunk; compiled, sim/compiled_core.py,
            # a native dict look-up and, on a miss, a native call of ``computed``)
            solo_cache = solo.cache
            for (req, n), ctx in zip(chunks, plan.chunk_contexts):
                if req.num_generated:
                    continue  # not before a first token
                completing = ctx + n == req.prefill_target
                # counted as preemption, up to the first token (an empty dict is not searched:
                # compiled, the look-up boxes the key)
                if preempted_at and req.key in preempted_at:
                    if completing:
                        req.ttft_preempt_s = now - preempted_at.pop(req.key)
                    continue
                key = solo_key(n, ctx, completing)
                memo = solo_cache.get(key)
                own: float = memo if memo is not None else solo.computed(key, n, ctx, completing)
                if own > compute:
                    own = compute
                req.ttft_prefill_s += own
                req.ttft_interference_s += compute - own
                req.ttft_overhead_s += overhead
        if plan.prompts_skipped:
            for req in plan.prompts_skipped:
                if req.num_generated or req.key in preempted_at:
                    continue
                req.ttft_wait_batch_s += elapsed_s
        if plan.kv_ready:
            self.on_decode_step(plan, now)

    @staticmethod
    def on_decode_step(plan: StepPlan, now: float) -> None:
        """A decode step (or multi-step block) ended at ``now``: a request whose KV a prefill
        replica sent and whose first token it emitted gets the KV transfer and the decode
        admission + step (vLLM P/D: the decode side emits the first token)."""
        for req in plan.kv_ready:
            if not req.num_generated:
                req.ttft_kv_transfer_s = req.transfer_end_s - req.transfer_start_s
                req.ttft_decode_s = now - req.transfer_end_s
