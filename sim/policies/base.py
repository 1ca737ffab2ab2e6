"""The iteration-level scheduler shared by the batching policies (vLLM v1 style).

Why: vLLM v1 schedules every step the same way: running decodes first (one token each), then
prompt tokens into the remaining token budget, tracking ``num_computed_tokens`` against
``num_tokens``. Policies differ only in how they fill that budget with prompt tokens
(``_fill_prefills``). Plain code: no SimPy, driven by ``schedule(now)`` / ``on_step_done``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sim.batch import Batch
from sim.kv import KVBlockManager, blocks_for
from sim.policies.decode_set import DecodeSet
from sim.request import Request
from sim.ttft import WaitClocks


@dataclass(frozen=True)
class EngineLimits:
    """vLLM engine knobs a scheduler obeys (names as vLLM's)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    long_prefill_token_threshold: int = 0  # 0 = no per-request cap on a chunk
    max_num_partial_prefills: int = 1
    preemption_mode: str = "recompute"     # recompute | swap
    max_run_steps: int = 1 << 30  # cap on a fast-forwarded run of identical decode steps


@dataclass
class StepPlan:
    """What one step (or ``num_steps`` identical decode steps) runs."""

    num_steps: int
    num_decode_seqs: int
    decode_context_tokens: int
    decode_blocks: int
    chunks: list[tuple[Request, int]] = field(default_factory=list)
    chunk_contexts: list[int] = field(default_factory=list)
    swap_blocks: int = 0  # KV blocks moved over PCIe (swap-out and swap-in) before the step
    # Requests that joined the decode set with KV computed elsewhere: the gap before their
    # first decode step (their next token's inter-token latency is that gap + the step).
    ready_gaps_s: list[float] = field(default_factory=list)

    @property
    def batch(self) -> Batch:
        completing = sum(1 for (r, n), c in zip(self.chunks, self.chunk_contexts) if c + n == r.prefill_target)
        return Batch(
            num_decode_seqs=self.num_decode_seqs,
            decode_context_tokens=self.decode_context_tokens,
            prefill_chunks=tuple((n, c) for (_, n), c in zip(self.chunks, self.chunk_contexts)),
            num_logits=self.num_decode_seqs + completing,
            num_steps=self.num_steps,
        )

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


class Scheduler:
    """One replica's scheduler: waiting queue, running requests, KV blocks."""

    name = "base"

    def __init__(self, limits: EngineLimits, kv: KVBlockManager):
        self.limits = limits
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}     # admission order; the tail is preempted first
        self.prefilling: dict[int, Request] = {}  # running requests still in (re)prefill
        self.decode = DecodeSet(kv.block_size)
        self.incoming = 0  # requests routed here whose KV is still in transit
        self.num_preemptions = 0
        self.num_swaps = 0
        self.tokens_emitted = 0  # output tokens produced, recomputed ones not counted twice
        self.resume_gaps_s: list[float] = []  # inter-token gaps that span a recompute
        self._swap_blocks = 0
        self.num_schedules = 0               # scheduling rounds so far
        self.wait_clocks = WaitClocks()      # TTFT decomposition of waiting (sim/ttft.py)
        self.kv_blocked_ids: set[int] = set()  # partial prefills that got no KV this step

    # -- queue ----------------------------------------------------------------------------------
    def admission_error(self, req: Request) -> str:
        """Why ``req`` can never be served here, or ''."""
        total = req.prompt_tokens + req.output_tokens
        if total > self.limits.max_model_len:
            return f"prompt+output {total} tokens > max_model_len {self.limits.max_model_len}"
        need = blocks_for(total - 1, self.kv.block_size)
        if need > self.kv.num_blocks:
            return f"needs {need} KV blocks for {total} tokens; replica has {self.kv.num_blocks}"
        return ""

    def add_request(self, req: Request, now: float) -> bool:
        """Queue ``req``; fail it at once (False) if it can never be served here."""
        reason = self.admission_error(req)
        if reason:
            return self._fail(req, now, reason)
        self.waiting.append(req)
        self.wait_clocks.mark(req, now)
        return True

    @staticmethod
    def _fail(req: Request, now: float, reason: str) -> bool:
        req.status = "failed"
        req.fail_reason = reason
        req.finish_s = now
        return False

    @property
    def num_outstanding(self) -> int:
        return len(self.waiting) + len(self.running) + self.incoming

    # -- one step -------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan | None:
        """Plan the next step; None when there is nothing to run."""
        kv, ds = self.kv, self.decode
        self.num_schedules += 1
        self.wait_clocks.advance(now)
        self.wait_clocks.kv_blocked = False
        self.kv_blocked_ids.clear()
        while ds.num_seqs and ds.blocks_next_step() > kv.num_free:
            self._preempt_tail(now)
        gaps = self._admit_kv_ready(now)
        step0_blocks = ds.blocks_next_step()
        kv.allocate_blocks(step0_blocks)
        plan = StepPlan(1, ds.num_seqs, ds.context_tokens + ds.num_seqs, step0_blocks,
                        swap_blocks=self._swap_blocks, ready_gaps_s=gaps)
        self._swap_blocks = 0
        self._fill_prefills(plan, self.limits.max_num_batched_tokens - ds.num_seqs, now)
        if not plan.chunks:
            if not ds.num_seqs:
                kv.release_blocks(step0_blocks)
                if self.prefilling:  # every partial prefill is blocked on KV: free the tail
                    self._preempt_tail(now)
                    return self.schedule(now)
                return None
            if plan.swap_blocks or gaps:
                return plan  # a swap or a join costs the first step something of its own
            # Nothing else can join until a sequence finishes: fast-forward identical steps.
            kv.release_blocks(step0_blocks)
            k = min(ds.steps_to_next_finish(), ds.max_steps_within(kv.num_free), self.limits.max_run_steps)
            plan.num_steps = k
            plan.decode_blocks = ds.blocks_needed(k)
            kv.allocate_blocks(plan.decode_blocks)
        return plan

    def _admit_kv_ready(self, now: float) -> list[float]:
        """Admit waiting requests whose KV exists elsewhere (swapped out, or sent by a prefill
        replica) straight into the decode set, first come first served."""
        if not (self.waiting and self.waiting[0].kv_ready):
            return []
        gaps: list[float] = []
        kv, ds = self.kv, self.decode
        bs = kv.block_size
        while self.waiting and self.waiting[0].kv_ready and len(self.running) < self.limits.max_num_seqs:
            req = self.waiting[0]
            n = req.prompt_tokens + req.num_generated - 1
            # its blocks, including the one its first decode step may open, and the running
            # decodes' next step must all fit
            if blocks_for(n + 1, bs) + ds.blocks_needed(1) > kv.num_free:
                self.wait_clocks.kv_blocked = True
                break
            kv.allocate(req, n)
            self.waiting.popleft()
            req.kv_ready = False
            req.status = "running"
            if req.first_scheduled_s != req.first_scheduled_s:
                req.first_scheduled_s = now
            self._swap_blocks += req.swapped_blocks
            req.swapped_blocks = 0
            self._on_kv_admitted(req, now)
            self.running[req.request_id] = req
            ds.add(req)
            gaps.append(now - req.last_token_s)
        return gaps

    def _on_kv_admitted(self, req: Request, now: float) -> None:
        """Hook: the decode pool of a disaggregated cluster releases the prefill side's KV."""

    def _try_admit(self, req: Request, plan: StepPlan, budget: int, now: float) -> int:
        """Admit the waiting head with a first chunk chosen by ``_first_chunk``; 0 if it cannot
        start now. A prefix-cache hit skips the cached blocks' prefill."""
        kv = self.kv
        hit = kv.lookup(req) if req.num_computed == 0 else 0
        start = hit * kv.block_size
        n = self._first_chunk(req.prefill_target - start, budget, plan)
        if n <= 0:
            return 0
        need = blocks_for(start + n, kv.block_size) - hit + (kv.evictable_among(req, hit) if hit else 0)
        if need > kv.num_free:
            self.wait_clocks.kv_blocked = True
            return 0  # first come first served: the head waits for blocks
        if kv.prefix_caching and req.num_computed == 0:
            kv.query_tokens += req.prompt_tokens
            kv.hit_tokens += start
            req.prefix_hit_tokens += start
            kv.acquire_prefix(req, hit)
        kv.allocate(req, start + n)
        self._admit(req, plan, n, now)
        return n

    def _first_chunk(self, remaining: int, budget: int, plan: StepPlan) -> int:
        raise NotImplementedError

    def _admit(self, req: Request, plan: StepPlan, num_tokens: int, now: float) -> None:
        self.waiting.popleft()
        req.status = "running"
        if req.first_scheduled_s != req.first_scheduled_s:  # nan: first time
            req.first_scheduled_s = now
            self.wait_clocks.settle(req, now)
        self.running[req.request_id] = req
        self.prefilling[req.request_id] = req
        plan.chunks.append((req, num_tokens))
        plan.chunk_contexts.append(req.num_computed)

    def _fill_prefills(self, plan: StepPlan, budget: int, now: float) -> None:
        raise NotImplementedError

    def on_step_done(self, plan: StepPlan, now: float, steps_done: int | None = None) -> list[Request]:
        """Apply a finished plan (or its first ``steps_done`` steps); return finished requests."""
        ds, kv = self.decode, self.kv
        finished: list[Request] = []
        if plan.num_decode_seqs:
            k = plan.num_steps if steps_done is None else steps_done
            blocks = plan.decode_blocks
            if k < plan.num_steps:
                blocks = ds.blocks_needed(k)
                kv.release_blocks(plan.decode_blocks - blocks)
            self.tokens_emitted += ds.num_seqs * k
            for req in ds.advance(k, blocks):
                ds.remove(req)
                self._finish(req, now, finished)
        for req, n in plan.chunks:
            req.num_computed += n
            if req.num_computed < req.prefill_target:
                continue
            del self.prefilling[req.request_id]
            kv.register(req)
            if req.num_generated:  # resumed after preemption: the gap spans it
                self.resume_gaps_s.append(now - req.last_token_s)
            else:
                req.first_token_s = now
                if req.preempt_start_s == req.preempt_start_s:
                    req.ttft_preempt_s = now - req.preempt_start_s
            req.last_token_s = now
            req.num_generated += 1
            self.tokens_emitted += 1
            if req.num_generated >= req.output_tokens:
                self._finish(req, now, finished)
            else:
                self._on_prefill_done(req, now)
        return finished

    def _on_prefill_done(self, req: Request, now: float) -> None:
        """The prompt's last chunk emitted a token: decode continues here (colocated)."""
        self.decode.add(req)

    def _finish(self, req: Request, now: float, finished: list[Request]) -> None:
        req.status = "completed"
        req.finish_s = now
        self.kv.free(req)
        del self.running[req.request_id]
        finished.append(req)

    def _preempt_tail(self, now: float) -> None:
        """Preempt the most recently admitted request (vLLM ``running.pop()``): its KV is
        dropped and recomputed later, or, with ``preemption_mode: swap``, copied to host
        memory over PCIe and back (decode-phase requests only; NOTE: a prefill in progress is
        always recomputed, and host memory is assumed large enough)."""
        _, req = self.running.popitem()
        swap = False
        if req.in_decode:  # it emitted a token at the end of the step that just ended
            self.decode.remove(req)
            req.last_token_s = now
            swap = self.limits.preemption_mode == "swap"
        else:
            del self.prefilling[req.request_id]
            if not req.num_generated and req.preempt_start_s != req.preempt_start_s:
                req.preempt_start_s = now  # TTFT from here on counts as preemption
        if swap:
            req.swapped_blocks = req.num_blocks
            self._swap_blocks += req.num_blocks
            self.num_swaps += 1
            req.kv_ready = True
        else:
            req.num_computed = 0
            req.prefill_target = req.prompt_tokens + req.num_generated
        self.kv.free(req)
        req.status = "waiting"
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
