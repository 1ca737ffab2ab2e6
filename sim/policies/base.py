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


@dataclass(frozen=True)
class EngineLimits:
    """vLLM engine knobs a scheduler obeys (names as vLLM's)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    long_prefill_token_threshold: int = 0  # 0 = no per-request cap on a chunk
    max_num_partial_prefills: int = 1
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
        self.num_preemptions = 0
        self.tokens_emitted = 0  # output tokens produced, recomputed ones not counted twice
        self.resume_gaps_s: list[float] = []  # inter-token gaps that span a preemption

    # -- queue ----------------------------------------------------------------------------------
    def add_request(self, req: Request, now: float) -> bool:
        """Queue ``req``; fail it at once (False) if it can never be served here."""
        total = req.prompt_tokens + req.output_tokens
        if total > self.limits.max_model_len:
            return self._fail(req, now, f"prompt+output {total} tokens > max_model_len {self.limits.max_model_len}")
        need = blocks_for(total - 1, self.kv.block_size)
        if need > self.kv.num_blocks:
            return self._fail(req, now, f"needs {need} KV blocks for {total} tokens; replica has {self.kv.num_blocks}")
        self.waiting.append(req)
        return True

    @staticmethod
    def _fail(req: Request, now: float, reason: str) -> bool:
        req.status = "failed"
        req.fail_reason = reason
        req.finish_s = now
        return False

    @property
    def num_outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step -------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan | None:
        """Plan the next step; None when there is nothing to run."""
        kv, ds = self.kv, self.decode
        while ds.num_seqs and ds.blocks_needed(1) > kv.num_free:
            self._preempt_tail(now)
        step0_blocks = ds.blocks_needed(1)
        kv.allocate_blocks(step0_blocks)
        plan = StepPlan(1, ds.num_seqs, ds.context_tokens + ds.num_seqs, step0_blocks)
        self._fill_prefills(plan, self.limits.max_num_batched_tokens - ds.num_seqs, now)
        if not plan.chunks:
            if not ds.num_seqs:
                kv.release_blocks(step0_blocks)
                if self.prefilling:  # every partial prefill is blocked on KV: free the tail
                    self._preempt_tail(now)
                    return self.schedule(now)
                return None
            # Nothing else can join until a sequence finishes: fast-forward identical steps.
            kv.release_blocks(step0_blocks)
            k = min(ds.steps_to_next_finish(), ds.max_steps_within(kv.num_free), self.limits.max_run_steps)
            plan.num_steps = k
            plan.decode_blocks = ds.blocks_needed(k)
            kv.allocate_blocks(plan.decode_blocks)
        return plan

    def _admit(self, req: Request, plan: StepPlan, num_tokens: int, now: float) -> None:
        self.waiting.popleft()
        req.status = "running"
        if req.first_scheduled_s != req.first_scheduled_s:  # nan: first time
            req.first_scheduled_s = now
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
            if req.num_generated:  # resumed after preemption: the gap spans it
                self.resume_gaps_s.append(now - req.last_token_s)
            else:
                req.first_token_s = now
            req.num_generated += 1
            self.tokens_emitted += 1
            if req.num_generated >= req.output_tokens:
                self._finish(req, now, finished)
            else:
                ds.add(req)
        return finished

    def _finish(self, req: Request, now: float, finished: list[Request]) -> None:
        req.status = "completed"
        req.finish_s = now
        self.kv.free(req)
        del self.running[req.request_id]
        finished.append(req)

    def _preempt_tail(self, now: float) -> None:
        """Recompute preemption of the most recently admitted request (vLLM ``running.pop()``)."""
        _, req = self.running.popitem()
        if req.in_decode:  # it emitted a token at the end of the step that just ended
            self.decode.remove(req)
            req.last_token_s = now
        else:
            del self.prefilling[req.request_id]
        self.kv.free(req)
        req.status = "waiting"
        req.num_computed = 0
        req.prefill_target = req.prompt_tokens + req.num_generated
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
