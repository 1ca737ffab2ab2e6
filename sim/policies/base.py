"""The iteration-level scheduler shared by the batching policies (vLLM V1's
vllm/v1/core/sched/scheduler.py).

Why: vLLM V1 schedules every step the same way: the running requests first, in admission order
(a decode takes one token, a prompt in progress its next chunk), preempting the last admitted
when KV blocks run out; then, unless it preempted, waiting requests into the remaining token
budget, tracking ``num_computed_tokens`` against ``num_tokens``. Policies differ only in how
they size a waiting request's first chunk (``_first_chunk``). Plain code: no SimPy, driven by
``schedule(now)`` / ``on_step_done``; ``plan_step`` is exactly one V1 ``schedule()`` call and
``scheduled_tokens`` its per-request token counts (bench/conformance.py compares them with
vLLM's own scheduler). Running decodes are kept as aggregates (decode_set.py); the loop over
them one by one runs only when a prompt is in progress or budget or KV blocks do not suffice.
The scheduler keeps no metrics of latency: its ``StepPlan`` says what happened (vLLM's
``SchedulerOutput``), and observers (the TTFT decomposition, sim/core/ttft.py) read that.
"""

from __future__ import annotations

import math
from bisect import insort
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from sim.compiled_core import mypyc_attr
from sim.core.batch import Batch, BatchValues
from sim.core.kv import Block, KVBlockManager
from sim.policies.no_entries import NONE
from sim.policies.admission import VLLMAdmission, make_admission
from sim.policies.decode_set import DecodeSet
from sim.core.request import Request, end_aborted


# A completed request's ``fail_reason`` when it stopped at its max_tokens before its end of
# sequence: the OpenAI API's finish_reason "length" (vLLM ``FinishReason.LENGTH``)
FINISH_LENGTH: Final = "length"


def settle_max_tokens(req: Request, max_model_len: int) -> str:
    """Give ``req`` the max_tokens the engine runs it with, and stop it there; return why it is
    refused, or ''. Run on arrival, before any decision; settling twice changes nothing.

    None sent (``max_tokens`` 0): the context left, ``max_model_len - prompt`` (vLLM
    vllm/entrypoints/utils.py ``get_max_tokens``: ``default_max_tokens = max_model_len -
    input_length``); a prompt that leaves no room is refused. One sent with prompt + max_tokens
    above ``max_model_len`` is refused, as vLLM's OpenAI server answers 400 ("This model's maximum
    context length is ... However, you requested ...": serving_engine ``_validate_input``). A
    request whose end of sequence lies past its max_tokens stops at it, completed with
    ``fail_reason`` ``length`` (vLLM's stop check, v1/core/sched/utils.py ``check_stop``:
    ``num_output_tokens >= max_tokens``), counted in the summary (``simsrv_truncated_requests``)."""
    if req.max_tokens <= 0:
        room = max_model_len - req.prompt_tokens
        if room < 1:
            return f"prompt {req.prompt_tokens} tokens leaves no room to generate under max_model_len {max_model_len}"
        req.max_tokens = room
    elif req.prompt_tokens + req.max_tokens > max_model_len:
        return f"prompt+max_tokens {req.prompt_tokens + req.max_tokens} tokens > max_model_len {max_model_len}"
    stop_at_max_tokens(req)
    return ""


def spec_slots(limits: EngineLimits) -> int:
    """KV slots a decoding sequence holds past its context (the tokens whose KV is computed)
    under speculative decoding: the k draft slots and the drafter's lookahead L, less the
    accepted drafts that become context.

    vLLM V1 schedules a decode at context m with 1 + k new tokens and reserves L lookahead slots
    past them (vllm/v1/core/sched/scheduler.py ``schedule``: ``allocate_slots(request,
    num_new_tokens, num_lookahead_tokens=self.num_lookahead_tokens)``; kv_cache_manager.py
    ``allocate_slots``: blocks for ``num_computed + num_new + num_lookahead`` slots), so in that
    step the sequence holds blocks for m + 1 + k + L slots. Blocks are never shrunk while it
    runs: the slots of rejected drafts and the lookahead are written over by the next step's
    tokens (the scheduler rolls ``num_computed_tokens`` back by the rejected count,
    ``update_from_output``), so what a sequence holds grows only with its accepted tokens. A step
    here emits t in {floor(E), ceil(E)} tokens and opens the blocks of its positions m .. m + t - 1
    shifted by this count D; D = k + L + 1 - ceil(E) gives m + 1 + k + L on the steps that
    emit ceil(E) tokens (exact) and one slot fewer on those emitting floor(E).
    NOTE: the one-slot shortfall on floor(E) steps is the price of one phase per sequence
    (sim/policies/decode_set.py keeps the set's KV as aggregates over phases)."""
    ceil_e = -(-limits.spec_tokens_per_step_milli // 1000)
    return limits.num_speculative_tokens + limits.num_lookahead_tokens + 1 - ceil_e


def stop_at_max_tokens(req: Request) -> None:
    """An end of sequence past ``max_tokens`` is never reached: the request stops there,
    completed with ``fail_reason`` ``length``."""
    if req.output_tokens > req.max_tokens:
        req.output_tokens = req.max_tokens
        req.fail_reason = FINISH_LENGTH


@dataclass(frozen=True)
class EngineLimits:
    """vLLM engine knobs a scheduler obeys (names as vLLM's)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    long_prefill_token_threshold: int = 0  # 0 = no per-request cap on a chunk
    # vLLM V0's cap on concurrent partial prefills; V1 does not enforce it. 0 = off (as V1).
    max_num_partial_prefills: int = 0
    preemption_mode: str = "recompute"     # recompute | swap (swap: vLLM V0 only)
    # vLLM 0.6 multi-step scheduling (--num-scheduler-steps): decode steps per scheduling round
    num_scheduler_steps: int = 1
    # prompts run in steps of their own, pausing the decodes (vLLM V0 without chunked prefill,
    # SGLang without --enable-mixed-chunk); multi-step implies it
    separate_prefill_steps: bool = False
    # TensorRT-LLM's capacity scheduler: max_utilization (KV blocks on demand, preempt when
    # short: vLLM) | guaranteed_no_evict (admit only what can finish: TRT-LLM's default)
    capacity_scheduler_policy: str = "max_utilization"
    max_run_steps: int = 1 << 30  # cap on a fast-forwarded run of identical decode steps
    # which engine's admission and retraction rules (sim/policies/admission.py): vllm | sglang
    admission: str = "vllm"
    # the vLLM release whose V1 scheduling rules apply (engine profile ``vllm_release``):
    # "0.11" | "0.34" (bench/README.md, "bench/conformance.py": what changed between them)
    vllm_release: str = "0.11"
    # the clients send ignore_eos (workload.max_tokens: output): a request runs to its max_tokens,
    # which SGLang's admission then takes as exact (PrefillAdder.add_one_req_ignore_eos)
    ignore_eos: bool = False
    # vLLM's --scheduling-policy (SchedulerConfig.policy): fcfs | priority (the waiting queue in
    # (priority, arrival) order, the lowest priority preempted first: ``Scheduler._victim_index``)
    scheduling_policy: str = "fcfs"
    # speculative decoding (engine.speculative_config; sim/cost/speculative.py): draft tokens
    # verified per decode step (0: off) and the expected tokens emitted per step x 1000
    num_speculative_tokens: int = 0
    spec_tokens_per_step_milli: int = 0
    # KV slots reserved past the scheduled tokens for the drafter (vLLM
    # ``VllmConfig.num_lookahead_tokens``: k for eagle, eagle3, mtp and draft_model, 0 for ngram;
    # sim/engine/deployment.py ``_spec_limits``)
    num_lookahead_tokens: int = 0


@dataclass(slots=True)
class StepPlan:
    """What one scheduling round decided (vLLM V1's ``SchedulerOutput``): the step (or
    ``num_steps`` identical decode steps) to run, and what happened to the requests it leaves
    out. A round with nothing to run is ``idle``; it still reports its preemptions and why
    the waiting requests wait.
    The list fields start as the shared read-only ``NONE``; the scheduler gives a field a list
    of its own at its first entry."""

    num_steps: int
    num_decode_seqs: int
    decode_context_tokens: int
    decode_blocks: int
    # prompt tokens scheduled per request (a decode takes one token: ``Scheduler.scheduled_tokens``)
    chunks: list[tuple[Request, int]] = NONE
    chunk_contexts: list[int] = NONE
    swap_blocks: int = 0  # KV blocks moved over PCIe (swap-out and swap-in) before the step
    # Requests that joined the decode set with KV computed elsewhere (swapped in, or sent by a
    # prefill replica), and the gap before their first decode step (their next token's
    # inter-token latency is that gap + the step; nan when that token is their first).
    kv_ready: list[Request] = NONE
    ready_gaps_s: list[float] = NONE
    new_reqs: list[Request] = NONE   # scheduled for the first time ever
    preempted: list[Request] = NONE  # preempted planning it, in order
    # running prompts given no chunk this step (the token budget ran out before them)
    prompts_skipped: list[Request] = NONE
    # the requests left waiting wait for KV blocks (one did not fit, or the round preempted:
    # V1 then admits nothing); otherwise for room in the batch or the token budget
    kv_blocked: bool = False
    # multi-step block (``num_scheduler_steps`` > 1): all ``num_steps`` run, nothing joins
    # meanwhile, and the tokens of every sequence in it are released together at its end
    block: bool = False
    # (extra seconds, sequences) whose gap to this plan's first decode step also spans the
    # steps that paused them since their last token (the token budget did not reach them, or a
    # prompt step of its own ran: ``Scheduler._note_paused``)
    pause_extras: list[tuple[float, int]] = NONE
    planned_s: float = 0.0  # when it was planned (the step's start)

    # The dataclass's own ``__init__``, written out (the decorator keeps a class's own): compiled
    # by mypyc (sim/compiled_core.py) the generated one stays interpreted, and a plan is built
    # every step (647 ns a plan, 85 ns natively: bench/README.md, "Compiled core, third round").
    def __init__(self, num_steps: int, num_decode_seqs: int, decode_context_tokens: int, decode_blocks: int,
                 chunks: list[tuple[Request, int]] = NONE, chunk_contexts: list[int] = NONE, swap_blocks: int = 0,
                 kv_ready: list[Request] = NONE, ready_gaps_s: list[float] = NONE, new_reqs: list[Request] = NONE,
                 preempted: list[Request] = NONE, prompts_skipped: list[Request] = NONE, kv_blocked: bool = False,
                 block: bool = False, pause_extras: list[tuple[float, int]] = NONE, planned_s: float = 0.0) -> None:
        self.num_steps, self.num_decode_seqs = num_steps, num_decode_seqs
        self.decode_context_tokens, self.decode_blocks = decode_context_tokens, decode_blocks
        self.chunks, self.chunk_contexts, self.swap_blocks = chunks, chunk_contexts, swap_blocks
        self.kv_ready, self.ready_gaps_s, self.new_reqs = kv_ready, ready_gaps_s, new_reqs
        self.preempted, self.prompts_skipped, self.kv_blocked = preempted, prompts_skipped, kv_blocked
        self.block, self.pause_extras, self.planned_s = block, pause_extras, planned_s

    def add_preempted(self, req: Request) -> None:
        """Append to ``preempted`` (a list from its first entry on)."""
        if self.preempted is _NONE:
            self.preempted = []
        self.preempted.append(req)

    @property
    def idle(self) -> bool:
        """Nothing to run."""
        return not (self.num_decode_seqs or self.chunks)

    @property
    def preempted_ids(self) -> list[int]:
        return [r.request_id for r in self.preempted]

    @property
    def batch(self) -> Batch:
        """The step's shape: decodes, one (new tokens, cached tokens) chunk per prompt, and a
        logit per decode and per chunk that completes its prompt (``batch_values`` as a
        ``Batch``: ``tuple.__new__`` of its seven fields in place of ``Batch(...)``, the same
        tuple, tests/test_replica_loop.py, whose ``__new__`` is a Python call)."""
        return _tuple_new(_Batch, self.batch_values())

    def batch_values(self) -> BatchValues:
        """``batch``'s seven fields as a plain tuple, in ``Batch``'s order: what the replica
        loop hands a cost model that reads a batch by position (compiled, sim/compiled_core.py,
        making a ``Batch`` per step is a generic ``tuple.__new__`` call). One pass over the
        chunks sums their tokens too."""
        n = self.num_decode_seqs
        chunks = self.chunks
        if not chunks:
            return n, self.decode_context_tokens, (), n, self.num_steps, 0, n
        if len(chunks) == 1:  # the loop below for one chunk (most steps with a prompt: no list)
            r, t = chunks[0]
            c = self.chunk_contexts[0]
            one = 1 if c + t == r.prefill_target else 0
            return n, self.decode_context_tokens, ((t, c),), n + one, self.num_steps, t, n + t
        pairs, completing, tokens = [], 0, 0
        for (r, t), c in zip(chunks, self.chunk_contexts):
            pairs.append((t, c))
            tokens += t
            if c + t == r.prefill_target:
                completing += 1
        return n, self.decode_context_tokens, tuple(pairs), n + completing, self.num_steps, tokens, n + tokens

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


# module constants read per step (Final: compiled, sim/compiled_core.py, C statics instead of
# look-ups in the module's dict)
_tuple_new: Final = tuple.__new__
_reversed: Final = reversed
_Batch: Final = Batch
_NONE: Final = NONE
_NO_HITS: Final[list[Block]] = []  # (read only: ``allocate`` only iterates its hits)


def queue_order(req: Request) -> tuple[int, float, int]:
    """A waiting request's place under ``scheduling_policy: priority``: vLLM V1's
    PriorityRequestQueue is a heap of ``(request.priority, request.arrival_time, request)``
    (vllm/v1/core/sched/request_queue.py, 0.11.0), a lower priority value first, then the
    earlier arrival. NOTE: a tie on both (vLLM compares the Request objects there, which 0.11's
    Request does not order) goes to the lower request id, the earlier sent."""
    return (req.priority, req.arrival_s, req.request_id)


def _victim_index(order: list[Request]) -> int:
    """Where in ``order`` (the running requests, admission order) the priority policy's
    preemption victim is: vLLM V1's ``max(self.running, key=lambda r: (r.priority,
    r.arrival_time))`` (vllm/v1/core/sched/scheduler.py schedule, 0.11.0), the lowest priority
    (largest value), latest arrival; on a tie the first in the list, as ``max`` keeps."""
    best = 0
    top = order[0]
    for k in range(1, len(order)):
        r = order[k]
        if r.priority > top.priority or (r.priority == top.priority and r.arrival_s > top.arrival_s):
            best, top = k, r
    return best


def new_plan(now: float) -> StepPlan:
    """``StepPlan(1, 0, 0, 0, planned_s=now)``: a round's fresh plan (one step, nothing in it)."""
    return StepPlan(1, 0, 0, 0, planned_s=now)


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled core
class Scheduler:
    """One replica's scheduler: waiting queue, running requests, KV blocks."""

    name = "base"

    def __init__(self, limits: EngineLimits, kv: KVBlockManager):
        self.limits = limits
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}     # admission order; the tail is preempted first
        self.prefilling: dict[int, Request] = {}  # running requests still in (re)prefill
        self.decode = DecodeSet(kv)
        self.decode.spec_milli = limits.spec_tokens_per_step_milli  # (0: one token a step)
        self.decode.spec_slots = self._spec_slots  # (the limits setter ran above)
        self._kv_windows = not kv.groups.plain  # sliding-window (or several) KV groups
        self.incoming = 0  # requests routed here whose KV is still in transit
        self.num_preemptions = 0
        self.num_swaps = 0
        self.tokens_emitted = 0  # output tokens produced, recomputed ones not counted twice
        self.resume_gaps_s: list[float] = []  # inter-token gaps that span a recompute
        self.burst_gaps_s: list[float] = []   # multi-step: each sequence's gap to each block's end
        # A decode's breaks from its replica's decode steps, for ITL per streamed chunk
        # (sim/metrics/chunk_itl.py): (request id, from_s, to_s, token at to_s): it emitted no
        # token at the end of any decode step in (from_s, to_s], and (recompute) one at to_s.
        # One per pause, preemption or swap-in: events the scheduler handles one by one already.
        self.itl_breaks: list[tuple[int, float, float, bool]] = []
        self._swap_blocks = 0
        self.num_schedules = 0               # scheduling rounds so far
        self._paused: list[Request] = []     # decodes the token budget did not reach this step
        self.reserved_blocks = 0  # guaranteed_no_evict: KV blocks the running requests may grow to
        # decodes that sat out steps since their last token (the budget pause above, or prompt
        # steps of their own): key -> (request, seconds paused), in the order they first paused
        self._pause_s: dict[Any, tuple[Request, float]] = {}
        # 1 while waiting requests are admitted before this step's decodes are scheduled (a
        # prompt step of its own): their look-ups see the generated blocks of the last step run
        self._lookup_lag = 0
        self.admission = make_admission(limits.admission, kv.prefix_caching, limits.ignore_eos)

    @property
    def admission(self) -> VLLMAdmission:
        return self._admission

    @admission.setter
    def admission(self, admission: VLLMAdmission) -> None:
        self._admission = admission
        # vLLM's admission (the default) does nothing in its hooks: the rounds skip the calls
        self._hooks = admission.has_hooks

    @property
    def limits(self) -> EngineLimits:
        # (compiled core) the scheduler's own methods read ``self._limits``, never this
        # property: compiled by mypyc, a property read on ``self`` inside a method that an
        # interpreted subclass (StaticScheduler) reached through ``super()`` crashed the process
        # (a sliding-window model under static, tests/test_scenario_roundtrip.py's fuzz)
        return self._limits

    @limits.setter
    def limits(self, limits: EngineLimits) -> None:
        """Set the engine knobs and what the rounds derive from them (fixed for a run; read
        once here rather than every round)."""
        self._limits = limits
        self._budget = limits.max_num_batched_tokens
        self._max_num_seqs = limits.max_num_seqs
        self._threshold = limits.long_prefill_token_threshold
        self._max_run_steps = limits.max_run_steps
        self._multi = limits.num_scheduler_steps > 1
        self._separate = self._multi or limits.separate_prefill_steps
        # a prompt step of its own pauses the decodes (multi-step blocks measure their own gaps)
        self._prompt_steps_pause = limits.separate_prefill_steps and limits.num_scheduler_steps == 1
        self._no_evict = limits.capacity_scheduler_policy == "guaranteed_no_evict"
        self._swap = limits.preemption_mode == "swap"
        # vLLM 0.34's rules (vllm/v1/core/sched/scheduler.py schedule, 0.34.0): a prompt is
        # admitted only when the blocks of its whole sequence are free (SchedulerConfig
        # scheduler_reserve_full_isl, on by default: allocate_slots(full_sequence_must_fit));
        # long_prefill_token_threshold applies only when more than one request is running or
        # waiting; without chunked prefill a prompt over the budget left stops admission
        self._v034 = limits.vllm_release == "0.34"
        # vLLM's --scheduling-policy priority (SchedulerConfig.policy): the waiting queue kept in
        # ``queue_order`` and the preemption victim chosen by priority (``_victim_index``)
        self._priority = limits.scheduling_policy == "priority"
        # speculative decoding: a decode takes 1 + k tokens of the budget (vLLM V1 schedule():
        # num_new_tokens = request.num_tokens_with_spec - request.num_computed_tokens) and
        # emits E on average; its steps run one at a time (``plan_step``)
        self._decode_tokens = 1 + limits.num_speculative_tokens
        self._spec = limits.spec_tokens_per_step_milli > 0
        # a sequence's last step may compute up to ceil(E) - 1 tokens past its end (its KV held
        # until it leaves the set): what a request may hold at its longest grows by that
        self._spec_overshoot = -(-limits.spec_tokens_per_step_milli // 1000) - 1 if self._spec else 0
        # KV slots a sequence holds past its context under speculative decoding (``spec_slots``)
        self._spec_slots = spec_slots(limits) if self._spec else 0

    # -- queue ----------------------------------------------------------------------------------
    def admission_error(self, req: Request) -> str:
        """Why ``req`` can never be served here, or ''. Judged on its prompt and ``max_tokens``
        (what the engine knows on arrival), never on the tokens it will generate."""
        sent = req.max_tokens > 0
        reason = settle_max_tokens(req, self._limits.max_model_len)
        if reason:
            return reason
        kv = self.kv
        total = req.prompt_tokens + req.max_tokens
        need = self._blocks_to_hold(total)
        if need > kv.num_blocks and not sent:
            # NOTE: vLLM refuses to start an engine whose KV cache cannot hold one request of
            # max_model_len tokens (vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory);
            # where the simulated cache is smaller, the longest length it holds stands for
            # max_model_len in the default max_tokens.
            fit = self._longest_held(req.prompt_tokens + 1, total)
            if fit:
                req.max_tokens = fit - req.prompt_tokens
                stop_at_max_tokens(req)
                return ""
            total = req.prompt_tokens + 1
            need = self._blocks_to_hold(total)
        if need > kv.num_blocks:
            return f"needs {need} KV blocks for {total} tokens; replica has {kv.num_blocks}"
        return ""

    def _blocks_to_hold(self, total: int) -> int:
        """KV blocks a request of ``total`` tokens holds at its longest (its last token's KV is
        never computed)."""
        kv = self.kv
        need = kv.blocks_for(total - 1 + self._spec_overshoot + self._spec_slots)
        if not kv.groups.plain:  # a chunk holds its blocks and the sliding window's before it
            longest = min(total - 1, self._limits.max_num_batched_tokens + kv.groups.window + kv.block_size)
            need = max(need, kv.blocks_for(longest, 0))
        return need

    def _longest_held(self, lo: int, hi: int) -> int:
        """The most tokens from ``lo`` to ``hi`` a request can reach within the replica's KV
        blocks (``_blocks_to_hold`` grows with the tokens), or 0 when ``lo`` does not fit."""
        n = self.kv.num_blocks
        if self._blocks_to_hold(lo) > n:
            return 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._blocks_to_hold(mid) <= n:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def add_request(self, req: Request, now: float) -> bool:
        """Queue ``req``; fail it at once (False) if it can never be served here."""
        reason = self.admission_error(req)
        if reason:
            return self._fail(req, now, reason)
        if self._priority:
            self._requeue(req)
        else:
            self.waiting.append(req)
        return True

    def _requeue(self, req: Request) -> None:
        """Put ``req`` in the waiting queue at its ``queue_order`` place (priority policy: vLLM's
        PriorityRequestQueue.add_request; its prepend_request and prepend_requests, for preempted
        and skipped requests, add the same way: "there is no concept of prepending")."""
        insort(self.waiting, req, key=queue_order)

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
    def schedule(self, now: float) -> StepPlan:
        """Plan the next step (``idle`` when there is nothing to run). A step that only
        preempted (vLLM returns it empty) is planned again at once; its preemptions go to the
        next plan."""
        self.num_schedules += 1
        plan = self.plan_step(now)
        if plan.preempted and not (plan.num_decode_seqs or plan.chunks):  # only preempted
            preempted = list(plan.preempted)
            plan = self.plan_step(now)
            while plan.preempted and not (plan.num_decode_seqs or plan.chunks):
                preempted += plan.preempted
                plan = self.plan_step(now)
            plan.preempted = preempted + list(plan.preempted)
            plan.kv_blocked = True
        chunks = plan.chunks
        if len(self.prefilling) > len(chunks):
            in_step = {req.key for req, _ in chunks}
            plan.prompts_skipped = [r for r in self.prefilling.values() if r.key not in in_step]
        if self._hooks and not (plan.num_decode_seqs or chunks):
            self._admission.on_idle()  # sglang: an idle round resets new_token_ratio
        return plan

    def _defer_ready_gaps(self, plan: StepPlan) -> None:
        """Requests swapped in by a prompt step of its own sit it out: their wait so far
        becomes paused time, and their next gap, at their first decode step, spans it all."""
        for req, gap in zip(plan.kv_ready, plan.ready_gaps_s):
            if gap == gap:  # (nan: no token yet, no gap)
                self._note_paused(req, gap)
        plan.ready_gaps_s = NONE

    def _note_paused(self, req: Request, seconds: float) -> None:
        """Decode ``req`` sat out a step of ``seconds`` (its next inter-token gap spans it)."""
        hit = self._pause_s.get(req.key)
        self._pause_s[req.key] = (req, seconds if hit is None else hit[1] + seconds)

    def _lengthen_paused(self, plan: StepPlan) -> None:
        """The paused decodes that ``plan`` runs: their gap to its first step's end also spans
        the steps they sat out (``plan.pause_extras``; a multi-step block measures its gaps
        itself). Those paused again keep accumulating; a preempted one's wait went into its
        ``last_token_s`` (``_preempt``)."""
        pending = self._pause_s
        extras: list[tuple[float, int]] = []
        for key, entry in list(pending.items()):
            req, paused_s = entry
            if req.in_decode:
                del pending[key]
                if plan.block or not paused_s > 0.0:
                    continue
                if extras and extras[-1][0] == paused_s:  # one entry per run of equal waits
                    extras[-1] = (paused_s, extras[-1][1] + 1)
                else:
                    extras.append((paused_s, 1))
            elif req.key not in self.running:
                del pending[key]
        if extras:
            plan.pause_extras = extras

    def plan_step(self, now: float) -> StepPlan:
        """One vLLM V1 ``Scheduler.schedule()`` (vllm/v1/core/sched/scheduler.py): running
        requests first, in admission order, each given min(tokens left, budget,
        long_prefill_token_threshold); when one cannot get its KV blocks the last admitted is
        preempted (recomputed later) and the allocation retried; then, only if nothing was
        preempted, waiting requests in order. The plan may be empty (it only preempted)."""
        kv, ds = self.kv, self.decode
        budget = self._budget
        plan = new_plan(now)
        if self._v034:  # "when it is the only request there is nobody to starve" (vLLM 0.34)
            alone = len(self.running) + len(self.waiting) <= 1
            self._threshold = 0 if alone else self._limits.long_prefill_token_threshold
        separate = self._separate
        if separate and self.waiting:
            # vLLM V0 without chunked prefill (vllm/core/scheduler.py _schedule_default) and
            # SGLang without --enable-mixed-chunk (managers/tp_worker.py forward_step): waiting
            # prompts first, in a step of their own that pauses every decode; decodes run only
            # when no prompt could be admitted. vLLM 0.6 multi-step runs on that scheduler (the
            # only mode 0.6.0 allows with it), the prompt step single (no lookahead slots:
            # _get_num_lookahead_slots(is_prefill=True) == 0).
            self._lookup_lag = 1  # before this step's decodes: look-ups see the last step's blocks
            self._fill_prefills(plan, budget, now)
            self._lookup_lag = 0
            if plan.chunks:
                if plan.ready_gaps_s and self._prompt_steps_pause:
                    self._defer_ready_gaps(plan)
                return plan
        if self._hooks:
            self._admission.before_decode(self, plan, now)  # sglang: retract_decode when KV is short
        fast = self._running_without_conflict(plan, budget)
        deferred = 0  # the decodes' blocks for this step not taken yet
        if fast is None:
            budget = self._schedule_running(plan, budget, now)
        else:  # the loop would give every decode its token and these chunks, in this order
            budget -= ds.num_seqs * self._decode_tokens
            if fast or (self.waiting and not separate):
                if plan.decode_blocks:
                    kv.allocate_blocks(plan.decode_blocks)
                for req, n, new in fast:
                    self._run_chunk(plan, req, n, new)
                    budget -= n
            else:
                # nothing else takes or reads free blocks before the end of this round: the
                # step's blocks are taken there (with the run's, if it becomes one), in one go
                deferred = plan.decode_blocks
        if plan.preempted:
            plan.kv_blocked = True  # V1 admits nothing in a step that preempted
        elif self.waiting and not separate:  # separate: the waiting ones did not fit (above)
            self._fill_prefills(plan, budget, now)
        num_seqs = ds.num_seqs
        plan.num_decode_seqs = num_seqs
        plan.decode_context_tokens = ds.context_tokens + num_seqs
        if self._swap_blocks and (num_seqs or plan.chunks):
            # the PCIe copies since the last step that ran (swap-outs of preemptions, swap-ins),
            # charged to the next one that runs: a plan that only preempted is planned again
            # (``schedule``) and its swap-outs still happened
            plan.swap_blocks, self._swap_blocks = self._swap_blocks, 0
        multi = self._multi
        if multi:
            plan.block = num_seqs > 0 and not plan.chunks
        if self._pause_s and num_seqs:
            self._lengthen_paused(plan)
        if (plan.chunks or not num_seqs or plan.swap_blocks or plan.ready_gaps_s or plan.preempted
                or self._paused or self._spec):
            # (speculative decoding: one step at a time, the cost of a step following its
            # emitted tokens, ``DecodeSet.spec_step_tokens``)
            if deferred:
                kv.allocate_blocks(deferred)
            return plan
        # A run of decode steps: its length is chosen as if the one step's blocks taken above
        # were given back first (they are free for it).
        taken = plan.decode_blocks - deferred
        free = kv.num_free + taken
        if multi:
            # One scheduling covers num_scheduler_steps decode steps of this batch, with KV
            # slots reserved ahead (lookahead slots); a sequence that ends inside the block
            # keeps running to its end and its extra tokens are dropped (vLLM
            # engine/output_processor/multi_step.py truncates to max_tokens).
            # NOTE: where KV for the whole block is short, the block is cut to the steps that
            # fit (vLLM would preempt to make room for the lookahead slots); with sliding-window
            # layers still filling, it is cut where the set changes (finish or full window).
            k = self._limits.num_scheduler_steps
            if ds.num_filling:
                k = min(k, ds.steps_to_next_change())
        else:  # nothing else can join until a sequence finishes: fast-forward identical steps
            k = ds.steps_to_next_change()
            if k > self._max_run_steps:
                k = self._max_run_steps
        # k = min(k, ds.max_steps_within(free)): that is the largest k' with blocks_needed(k')
        # <= free (blocks_needed grows with k'), so it is k itself when k's blocks fit
        need = ds.blocks_needed(k)
        if need > free:
            k = ds.max_steps_within(free)
            need = ds.blocks_needed(k)
        plan.num_steps = k
        # The run's blocks: giving back the step's blocks (kv.release_blocks puts them at the
        # free queue's head) and taking the run's pops the same blocks in the same order as
        # taking only the difference (or giving back the surplus) from where the step's ended.
        extra = need - taken
        if extra > 0:
            kv.allocate_blocks(extra)
        elif extra < 0:
            kv.release_blocks(-extra)
        plan.decode_blocks = need
        return plan

    def _running_without_conflict(self, plan: StepPlan, budget: int) -> list[tuple[Request, int, int]] | None:
        """The chunks of the running prompts when the ordered loop cannot preempt or leave a
        decode out (None otherwise): every decode and chunk gets its blocks, and either
        everything fits the budget or the prompts in progress are the last admitted (so the
        decodes come first and the prompts share what is left, in order). A chunk is (request,
        tokens, blocks gained: ``kv.chunk_blocks``). When it returns them, ``plan.decode_blocks``
        holds the blocks the decodes open this step."""
        ds, kv = self.decode, self.kv
        per = self._decode_tokens
        if ds.num_seqs * per > budget:
            return None
        if self._spec:
            blocks = decode_blocks = ds.blocks_needed(ds.spec_step_tokens())
        else:
            blocks = decode_blocks = ds.blocks_next_step()
        prefilling = self.prefilling
        if not prefilling:
            if blocks > kv.num_free:
                return None
            plan.decode_blocks = decode_blocks
            return _NONE
        in_order: bool | None = None  # whether the prompts are the last admitted: found when first needed
        left = budget - ds.num_seqs * per
        thr = self._threshold
        chunks = []
        for req in prefilling.values():
            computed = req.num_computed
            n = req.prefill_target - computed
            if 0 < thr < n:  # _chunk_tokens
                n = thr
            if n > left:
                if in_order is None:  # the last len(prefilling) admitted are all prompts
                    # (a loop over the tail: compiled, sim/compiled_core.py, each ``next(tail)``
                    # was a generic call of the builtin looked up in the builtins module)
                    in_order, k = True, len(prefilling)
                    for key in _reversed(self.running):
                        if key not in prefilling:
                            in_order = False
                            break
                        k -= 1
                        if not k:
                            break
                if not in_order:
                    return None
                n = left
            if n <= 0:
                break
            new = kv.chunk_blocks(req, self._slots_to(req, computed + n), computed)
            chunks.append((req, n, new))
            left -= n
            if new > 0:
                blocks += new
        if blocks > kv.num_free:
            return None
        plan.decode_blocks = decode_blocks
        return chunks

    def _chunk_tokens(self, n: int) -> int:
        """A prompt's next chunk before the budget: its ``n`` tokens left, capped by
        ``long_prefill_token_threshold`` (0: no cap), as vLLM V1 takes them for running and
        waiting requests alike."""
        thr = self._threshold
        return thr if 0 < thr < n else n

    def _slots_to(self, req: Request, end: int) -> int:
        """The KV slots a prompt's chunk ending at token ``end`` allocates: ``end``, and under
        speculative decoding for the chunk that completes the prompt the ``spec_slots`` its
        first decode step holds past its context.
        NOTE: vLLM reserves the lookahead L on every chunk and the k draft slots at the first
        decode step (``spec_slots``); here the last chunk takes both, at most one block a
        request one step early, so that a sequence joins the decode set holding them
        (``DecodeSet.add``)."""
        if self._spec_slots and end >= req.prefill_target:
            return end + self._spec_slots
        return end

    def _run_chunk(self, plan: StepPlan, req: Request, n: int, new: int | None = None) -> None:
        """Give running prompt ``req`` a chunk of ``n`` tokens this step: its KV blocks (published
        to the prefix cache as computed) and its place in the plan. ``new``: the blocks it
        gains, when known (``kv.chunk_blocks``)."""
        computed = req.num_computed
        if new is None:
            self.kv.allocate(req, self._slots_to(req, computed + n), computed=computed)
        else:
            self.kv.grow(req, new)
        self.kv.cache(req, computed + n)
        if plan.chunks is _NONE:  # the plan's first chunk: its lists (StepPlan)
            plan.chunks, plan.chunk_contexts = [], []
        plan.chunks.append((req, n))
        plan.chunk_contexts.append(computed)

    def _schedule_running(self, plan: StepPlan, budget: int, now: float) -> int:
        """The running requests one by one (vLLM's loop over ``self.running``); returns the
        budget left. Decodes the budget does not reach sit this step out."""
        kv, ds = self.kv, self.decode
        order = list(self.running.values())
        prio = self._priority
        given: dict[Any, tuple[int, int]] = {}  # priority: each one scheduled, (tokens, decode blocks)
        i = 0
        while i < len(order) and budget > 0:
            req = order[i]
            if req.in_decode:
                n = self._decode_tokens
                if self._spec:
                    # NOTE: a decode the budget reaches with fewer than 1 + k tokens left is
                    # scheduled whole (vLLM trims its draft tokens to the budget)
                    need = ds.blocks_in_next_tokens(req, ds.spec_step_tokens())
                else:
                    need = ds.blocks_at_next_step(req)  # its blocks are full
            elif req.key in self.prefilling:
                n = min(self._chunk_tokens(req.prefill_target - req.num_computed), budget)
                need = kv.chunk_blocks(req, self._slots_to(req, req.num_computed + n), req.num_computed)  # may be < 0
            else:
                i += 1
                continue
            while need > kv.num_free:
                if prio:
                    j = _victim_index(order)
                    victim = order.pop(j)
                    if j < i:  # scheduled earlier in this round: its tokens and blocks go back
                        i -= 1
                        budget += self._unschedule(victim, plan, given.pop(victim.key, (0, 0)))
                else:
                    victim = order.pop()
                self._preempt(victim, now)
                plan.add_preempted(victim)
                if victim is req:
                    break
            else:
                if req.in_decode:
                    if need:
                        kv.allocate_blocks(need)
                        plan.decode_blocks += need
                else:
                    self._run_chunk(plan, req, n)
                if prio:
                    given[req.key] = (n, need if req.in_decode else 0)
                budget -= n
                i += 1
                continue
            if prio and self._v034:
                # it preempted itself, the lowest priority running: the ones after it rank higher
                # and may fit in the blocks it freed (vLLM 0.34 V1 Scheduler.schedule: "continue"
                # when the request is PREEMPTED under the priority policy; 0.11 stopped here)
                continue
            break  # it preempted itself: nothing runs after it
        for req in order[i:]:
            if req.in_decode:  # out of budget: no token this step
                ds.remove(req)
                self._paused.append(req)
        return budget

    def _unschedule(self, req: Request, plan: StepPlan, given: tuple[int, int]) -> int:
        """Take ``req``, scheduled earlier in this round, out of ``plan`` before it is preempted:
        a decode's new blocks go back, a chunk leaves the plan (its blocks go with ``_preempt``'s
        free); return its tokens, given back to the budget. As vLLM V1 under the priority policy
        (vllm/v1/core/sched/scheduler.py schedule: a victim in ``scheduled_running_reqs`` is
        removed from it). NOTE: vLLM 0.11.0 left the victim's tokens in ``num_scheduled_tokens``
        and the budget, and skipped the request after it (``req_index`` not moved back); later
        releases give the tokens back and step the index back, as here."""
        tokens, blocks = given
        if req.in_decode:
            if blocks:
                self.kv.release_blocks(blocks)
                plan.decode_blocks -= blocks
        else:
            for k, (r, _) in enumerate(plan.chunks):
                if r is req:
                    del plan.chunks[k]
                    del plan.chunk_contexts[k]
                    break
        return tokens

    def _fill_prefills(self, plan: StepPlan, budget: int, now: float) -> None:
        """Waiting requests in order (vLLM's loop over ``self.waiting``): one whose first chunk
        the policy cannot take now is skipped, and the skipped ones go back at the queue's head
        in reverse order (vLLM 0.11 V1; in their order with prompt steps of their own); one
        whose KV blocks do not fit stops the loop (first come first served on memory)."""
        waiting, running, max_num_seqs = self.waiting, self.running, self._max_num_seqs
        skipped: list[Request] = []
        if self._hooks:
            self._admission.start_round(self)
        while waiting and budget > 0 and len(running) < max_num_seqs:
            req = waiting[0]
            if req.kv_ready:
                if not self._admit_kv_ready(req, plan, now):
                    break
                budget -= 1
                continue
            n = self._try_admit(req, plan, budget, now)
            if n < 0:
                skipped.append(waiting.popleft())
                continue
            if not n:
                break
            budget -= n
        if skipped:
            if self._priority:  # V1's skipped queue goes back by priority (prepend_requests)
                for r in skipped:
                    self._requeue(r)
            elif self._separate:  # prompt steps of their own (vLLM V0, SGLang): back in their order
                waiting.extendleft(reversed(skipped))
            else:
                # V1: back at the head in reverse order, as vLLM 0.11 puts them: the skipped queue
                # is built by ``prepend_request`` (appendleft) and ``waiting.prepend_requests``
                # extends left with its reversal (vllm/v1/core/sched/scheduler.py schedule,
                # skipped_waiting_requests; request_queue.py FCFSRequestQueue), so the last one
                # skipped is tried first next step
                waiting.extendleft(skipped)

    def _admit_kv_ready(self, req: Request, plan: StepPlan, now: float) -> bool:
        """Admit a waiting request whose KV exists elsewhere (swapped out, or sent by a prefill
        replica) straight into the decode set, if its blocks and its first decode step fit."""
        kv, ds = self.kv, self.decode
        n = req.prompt_tokens + req.num_generated - 1
        # the tokens its first decode step computes (speculative decoding: the step's accepted)
        d = ds.spec_step_tokens() if self._spec else 1
        slots = n + self._spec_slots  # what it holds in the decode set (``spec_slots``)
        if kv.blocks_of(req, slots + d) > kv.num_free:
            plan.kv_blocked = True
            return False
        kv.allocate(req, slots)
        kv.cache(req, n)
        self.waiting.popleft()
        req.kv_ready = False
        req.status = "running"
        if req.first_scheduled_s != req.first_scheduled_s:
            req.first_scheduled_s = now
        self._swap_blocks += kv.swap_in(req)
        self._on_kv_admitted(req, now)
        self.running[req.key] = req
        ds.add(req)
        opened = kv.blocks_of(req, slots + d) - kv.blocks_of(req, slots)
        if opened:  # its first decode step opens a block (or more)
            kv.allocate_blocks(opened)
            plan.decode_blocks += opened
        if plan.kv_ready is _NONE:  # the plan's first: its lists (StepPlan)
            plan.kv_ready, plan.ready_gaps_s = [], []
        plan.kv_ready.append(req)
        # a request with no token yet (vLLM P/D: the decode side emits the first) has no gap
        plan.ready_gaps_s.append(now - req.last_token_s if req.num_generated else math.nan)
        if req.num_generated:  # swapped back in: no token since its last, decoding from the next step
            self.itl_breaks.append((req.request_id, req.last_token_s, now, False))
        return True

    def _on_kv_admitted(self, req: Request, now: float) -> None:
        """Hook: the decode pool of a disaggregated cluster releases the prefill side's KV."""

    def _try_admit(self, req: Request, plan: StepPlan, budget: int, now: float) -> int:
        """Admit the waiting head with a first chunk chosen by ``_first_chunk``: its size, 0 if
        its KV blocks do not fit, -1 if the policy skips it this step. A prefix-cache hit
        (vLLM ``get_computed_blocks``) skips the cached blocks' prefill."""
        kv = self.kv
        no_evict = self._no_evict
        if no_evict and self.reserved_blocks + self._full_blocks(req) > kv.num_blocks:
            plan.kv_blocked = True
            return 0
        if self._hooks and not self._admission.admits(self, req):  # vLLM's admits everything
            plan.kv_blocked = True
            return 0
        ds = self.decode
        if ds.pub_heap:  # generated blocks full by this step's decodes (DecodeSet.publish)
            ds.publish(ds.steps - self._lookup_lag)
        hits: list[Block] = _NO_HITS
        own = 0
        load = self._offload_admit(req, plan, now) if kv.offload is not None else 1
        if load <= 0:  # loading from the CPU tier (skipped: -1), or its blocks do not fit (0)
            return load
        if load == 2:  # its blocks are in place, the loaded ones after its GPU hits
            start = kv.blocks_held(req) * kv.block_size
        else:
            hits, own = kv.lookup(req)
            start = (len(hits) + own) * kv.block_size
        n = self._first_chunk(req.prefill_target - start, budget, plan)
        if n <= 0:
            return n
        if self._v034 and not kv.fits_whole(req, req.prefill_target, hits, own):
            plan.kv_blocked = True  # vLLM 0.34: its whole sequence's blocks must be free
            return 0
        if not kv.allocate(req, self._slots_to(req, start + n), hits, own, computed=start):
            plan.kv_blocked = True
            return 0
        if no_evict:
            self.reserved_blocks += self._full_blocks(req)
        loaded = kv.end_load(req) * kv.block_size if kv.offload is not None else 0
        if not req.num_generated and not req.num_preemptions:
            if kv.prefix_caching:
                kv.query_tokens += req.prompt_tokens
                kv.hit_tokens += start - loaded  # the GPU cache's hits (vLLM's prefix-cache metric)
                req.prefix_hit_tokens += start - loaded
            if kv.offload is not None:  # the CPU tier's (vLLM's connector prefix-cache metric)
                kv.offload.count_query(req.prompt_tokens, loaded)
        req.num_computed = start
        kv.cache(req, start + n)
        if self._hooks:
            self._admission.on_admit(req)
        self._admit(req, plan, n, now)
        return n

    def _offload_admit(self, req: Request, plan: StepPlan, now: float) -> int:
        """The CPU offloading tier's part of admitting ``req`` (sim/core/kv.py ``CPUTier``):
        -1 while a load of its blocks runs (vLLM skips a request in WAITING_FOR_REMOTE_KVS and
        schedules it in the first round after the connector reports the load done:
        vllm/v1/core/sched/scheduler.py ``schedule``, ``_update_waiting_for_remote_kv``), or
        when it starts one now; 0 if the blocks for a load do not fit; 2 when its loaded blocks
        are in place; 1: no load, admit as usual."""
        kv = self.kv
        end = kv.load_end_s(req)
        if end >= 0.0:
            return -1 if end > now else 2
        hits, own = kv.lookup(req)
        if own:
            return 1
        cpu = kv.offload_hits(req, len(hits))
        if not cpu:
            return 1
        if not kv.start_load(req, hits, cpu, now):
            plan.kv_blocked = True
            return 0
        if req.first_scheduled_s != req.first_scheduled_s:  # first admission: a TTFT part
            req.ttft_kv_load_s = kv.load_end_s(req) - now
        return -1

    def _full_blocks(self, req: Request) -> int:
        """KV blocks ``req`` holds at its last token. TensorRT-LLM's GUARANTEED_NO_EVICT (its
        default capacity scheduler policy: docs performance-tuning-guide/useful-runtime-flags)
        admits a request only while every started one can reach its maximum length, so nothing
        is ever paused: the maximum length is the prompt and the request's max_tokens
        (TensorRT-LLM cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp,
        GuaranteedNoEvictScheduler, reserves ``getRemainingBlocksToCompletion``: in
        kvCacheManager.h "the number of KV cache blocks remaining to advance a request to
        completion (i.e. for maxNewTokens)"), never the length it will stop at (its end of
        sequence is unknown to the engine). NOTE: prefix-cache hits are not discounted."""
        return self.kv.blocks_for(req.prompt_tokens + req.max_tokens - 1)

    def _first_chunk(self, remaining: int, budget: int, plan: StepPlan) -> int:
        """Tokens of a waiting request's first chunk: > 0, 0 to stop admitting, -1 to skip it."""
        raise NotImplementedError

    def _admit(self, req: Request, plan: StepPlan, num_tokens: int, now: float) -> None:
        self.waiting.popleft()
        req.status = "running"
        if req.first_scheduled_s != req.first_scheduled_s:  # nan: first time
            req.first_scheduled_s = now
            if plan.new_reqs is _NONE:  # the plan's first: its list (StepPlan)
                plan.new_reqs = []
            plan.new_reqs.append(req)
        self.running[req.key] = req
        self.prefilling[req.key] = req
        if plan.chunks is _NONE:  # the plan's first chunk: its lists (StepPlan)
            plan.chunks, plan.chunk_contexts = [], []
        plan.chunks.append((req, num_tokens))
        plan.chunk_contexts.append(req.num_computed)

    def scheduled_tokens(self, plan: StepPlan) -> dict[int, int]:
        """Tokens per request in the plan's first step (vLLM ``num_scheduled_tokens``).
        O(running): for inspection and the conformance harness, not the hot path."""
        per = self._decode_tokens
        out = {r.request_id: per for r in self.running.values() if r.in_decode}
        for req, n in plan.chunks:
            out[req.request_id] = n
        return out

    def on_step_done(self, plan: StepPlan, now: float, steps_done: int | None = None) -> list[Request]:
        """Apply a finished plan (or its first ``steps_done`` steps); return finished requests."""
        ds, kv = self.decode, self.kv
        finished: list[Request] = []
        for req in plan.kv_ready:
            if not req.num_generated:  # its first token is this decode step's (KV sent by a prefill replica)
                req.first_token_s = now
        # a prompt step of its own (separate_prefill_steps; a multi-step block measures its own
        # gaps): every decode waiting meanwhile sat it out
        if self._prompt_steps_pause and plan.chunks and not plan.num_decode_seqs and ds.num_seqs:
            d = now - plan.planned_s
            for req in self.running.values():
                if req.in_decode:
                    self._note_paused(req, d)
        if plan.num_decode_seqs:
            k = plan.num_steps if steps_done is None else steps_done
            if self._spec:  # one step (plan_step), emitting its tokens per sequence
                k = ds.spec_step_tokens()
                ds.engine_steps += 1
            elif k < plan.num_steps:
                kv.release_blocks(plan.decode_blocks - ds.blocks_needed(k))
            self.tokens_emitted += ds.num_seqs * k
            if self._hooks:
                self._admission.on_decode_steps(k)
            if plan.block:
                self._release_burst(now)
            for req in ds.advance(k):
                ds.remove(req)
                extra = req.num_generated - req.output_tokens  # run past its end in a block
                if extra > 0:
                    req.num_generated -= extra
                    self.tokens_emitted -= extra
                self._finish(req, now, finished)
        if self._paused:  # decodes the token budget did not reach sat this step out
            d = now - plan.planned_s
            for req in self._paused:
                self._note_paused(req, d)
                self.itl_breaks.append((req.request_id, plan.planned_s, now, False))
                ds.add(req)
            self._paused.clear()
        for req, n in plan.chunks:
            req.num_computed += n
            if req.num_computed < req.prefill_target:
                continue
            del self.prefilling[req.key]
            if req.num_generated:  # resumed after preemption: the gap spans it
                self.resume_gaps_s.append(now - req.last_token_s)
                self.itl_breaks.append((req.request_id, req.last_token_s, now, True))
            else:
                req.first_token_s = now
            req.last_token_s = now
            req.num_generated += 1
            self.tokens_emitted += 1
            if req.num_generated >= req.output_tokens:
                self._finish(req, now, finished)
            else:
                self._on_prefill_done(req, now)
        return finished

    def _release_burst(self, now: float) -> None:
        """A multi-step block ended: every sequence in it receives its tokens now, in one burst
        (vLLM 0.6 processes a block's outputs after its last step; the measured inter-token
        latency is then about num_scheduler_steps x TPOT: sgl-project/sglang
        benchmark/benchmark_vllm_060). One gap per sequence, from its previous output."""
        gaps = self.burst_gaps_s
        for req in self.running.values():
            if req.in_decode:
                gaps.append(now - req.last_token_s)
                req.last_token_s = now

    def _on_prefill_done(self, req: Request, now: float) -> None:
        """The prompt's last chunk emitted a token: decode continues here (colocated); blocks
        its last chunk held beyond a sliding window go back first."""
        # (with one full-attention group it holds exactly blocks_of(num_computed) after its last
        # chunk, allocate having grown it to that: nothing to give back)
        if self._kv_windows:
            self.kv.trim(req, self.kv.blocks_of(req, req.num_computed))
        self.decode.add(req)

    def _finish(self, req: Request, now: float, finished: list[Request]) -> None:
        req.status = "completed"
        req.finish_s = now
        kv = self.kv
        if self._no_evict:
            self.reserved_blocks -= self._full_blocks(req)
        kv.cache(req, req.prompt_tokens + req.num_generated - 1)  # its generated blocks too
        kv.free(req, forget=True)
        del self.running[req.key]
        finished.append(req)

    def abort(self, req: Request, now: float) -> bool:
        """End ``req`` as aborted now, wherever it is here (waiting, preempted, prefilling,
        decoding): out of the queues, its KV blocks freed as a finished request's are (the
        cached ones stay resident, evictable, for prefix hits), its host copy after a swap
        dropped. False (nothing changed) if it is not here: ended already. Called between steps
        only (sim/engine/cluster.py ``Replica``), as vLLM's engine core takes an abort from its
        input queue between two steps (vllm/v1/engine/core.py ``run_busy_loop``,
        ``_handle_client_request`` ABORT -> ``abort_requests``) and
        vllm/v1/core/sched/scheduler.py ``finish_requests(ids, RequestStatus.FINISHED_ABORTED)``
        takes it out of ``running`` or ``waiting`` and ``_free_request`` frees its blocks."""
        key = req.key
        kv = self.kv
        if key in self.running:
            del self.running[key]
            if self._no_evict:
                self.reserved_blocks -= self._full_blocks(req)
            if req.in_decode:
                self.decode.remove(req)
                kv.cache(req, req.prompt_tokens + req.num_generated - 1)  # as ``_finish``
            else:  # its chunks' blocks were published as they were computed (``_run_chunk``)
                del self.prefilling[key]
        else:
            if req not in self.waiting:
                return False
            self.waiting.remove(req)
            kv.swap_in(req)  # (a copy in host memory after a swap: dropped)
        if key in self._pause_s:
            del self._pause_s[key]
        kv.free(req, forget=True)
        end_aborted(req, now)
        return True

    def _preempt(self, req: Request, now: float) -> None:
        """Preempt ``req``, the most recently admitted running request (vLLM V1
        ``self.running.pop()``): its KV blocks are freed (the cached ones stay evictable, so its
        recompute may hit them) and it is recomputed later, first in the waiting queue.
        ``preemption_mode: swap`` instead copies a decode-phase request's KV to host memory over
        PCIe and back. NOTE: vLLM V1 only recomputes; swap is vLLM V0's option. A prefill in
        progress is always recomputed, and host memory is assumed large enough."""
        del self.running[req.key]
        if self._no_evict:
            self.reserved_blocks -= self._full_blocks(req)
        swap = False
        if req.in_decode:  # it emitted a token at the end of the step that just ended
            self.decode.remove(req)
            self.kv.cache(req, req.prompt_tokens + req.num_generated - 1)
            # its last token came at the end of the last step it ran (before any it sat out)
            paused = self._pause_s.get(req.key)
            if paused is None:
                req.last_token_s = now
            else:
                del self._pause_s[req.key]
                req.last_token_s = now - paused[1]
            swap = self._swap
        else:
            del self.prefilling[req.key]
        if swap:
            self._swap_blocks += self.kv.swap_out(req)
            self.num_swaps += 1
            req.kv_ready = True
        else:
            req.num_computed = 0
            req.prefill_target = req.prompt_tokens + req.num_generated
        self.kv.free(req)
        req.status = "waiting"
        req.num_preemptions += 1
        self.num_preemptions += 1
        if self._priority:
            self._requeue(req)
        else:
            self.waiting.appendleft(req)
