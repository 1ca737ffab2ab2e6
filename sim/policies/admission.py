"""Admission of waiting requests and retraction of running ones: ``engine.admission``.

Why: engines differ in when they let a waiting prompt in. ``vllm`` (the default) admits whatever
KV blocks the prompt needs now and preempts the last admitted request when decode runs short
(sim/policies/base.py does all of it; this module does nothing). ``sglang`` is SGLang 0.3's
scheduler: a prompt joins only if the KV pool can also hold what the running requests are
expected to generate, estimated with ``new_token_ratio``, and when decode still runs out of KV
it retracts decode requests and raises the ratio.

Source: sgl-project/sglang as stored (the 0.3.x era, before the policy_scheduler.py ->
schedule_policy.py rename): python/sglang/global_config.py (init_new_token_ratio 0.7,
base_min_new_token_ratio 0.1, new_token_ratio_decay 0.001, retract_decode_steps 20),
python/sglang/srt/managers/policy_scheduler.py (PrefillAdder, CLIP_MAX_NEW_TOKENS 4096),
python/sglang/srt/managers/tp_worker.py (ModelTpServer.get_new_prefill_batch,
forward_decode_batch, forward_step) and python/sglang/srt/managers/schedule_batch.py
(check_decode_mem, retract_decode). Token arithmetic: SGLang's KV pool is per token; here free
tokens are free KV blocks x block size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from sim.core.request import Request
    from sim.policies.base import Scheduler, StepPlan
    from sim.policies.decode_set import DecodeSet

# global_config.py (0.3.x): the estimate starts at 0.7 whenever the server idles, falls by 0.001
# each decode step to base_min_new_token_ratio 0.1 (x schedule_conservativeness, default 1.0)
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001
# a retraction frees KV until every remaining decode has this many steps' worth of tokens
RETRACT_DECODE_STEPS = 20
# policy_scheduler.py: max_new_tokens is clipped to this in the estimate (not the stop rule)
CLIP_MAX_NEW_TOKENS = 4096


class VLLMAdmission:
    """vLLM's: admit on the KV blocks needed now (base.py); nothing to add here."""

    name: ClassVar[str] = "vllm"
    has_hooks: ClassVar[bool] = False  # every hook below does nothing: the scheduler skips calling them

    def start_round(self, sched: Scheduler) -> None:
        pass

    def admits(self, sched: Scheduler, req: Request) -> bool:
        return True

    def on_admit(self, req: Request) -> None:
        pass

    def before_decode(self, sched: Scheduler, plan: StepPlan, now: float) -> None:
        pass

    def on_decode_steps(self, k: int) -> None:
        pass

    def on_idle(self) -> None:
        pass


class SGLangAdmission(VLLMAdmission):
    """SGLang 0.3's PrefillAdder admission and retract_decode.

    ``max_new_tokens`` is the request's ``max_tokens`` (what the engine knows), never the
    tokens it will generate before its end of sequence. Requests sent with ``ignore_eos`` (as
    bench_serving sends them unless --disable-ignore-eos: ``workload.max_tokens: output``) run
    to their max_new_tokens; with the radix cache disabled (``enable_prefix_caching: false``:
    SGLang's --disable-radix-cache) they take ``add_one_req_ignore_eos``: the running
    requests' remaining max_new_tokens, released as each finishes, must fit; otherwise
    ``add_one_req``: the prompt plus its clipped max_new_tokens must fit in the free tokens
    less the running requests' remaining max_new_tokens x new_token_ratio.
    NOTE: tp_worker skips the prefill check after a decode step in which nothing finished
    (do_not_get_new_batch) unless requests arrived; here the check runs at every scheduling
    round, which differs only while the ratio decays between two finishes.
    NOTE: SGLang cuts the prompt that overflows chunked_prefill_size into a chunk finished in
    the next prefill batch (its output tokens reserved only then); policy continuous instead
    leaves it for a later batch and takes the next prompts that fit.
    The ratio starts at 0.7: ModelTpServer sets it to 0.1, but every idle forward_step before
    the first request resets it to init_new_token_ratio.
    """

    name = "sglang"
    has_hooks = True

    def __init__(self, exact_lengths: bool):
        # radix cache off and ignore_eos (PrefillAdder.add_one_req: ``if
        # req.sampling_params.ignore_eos and self.tree_cache.disable``): add_one_req_ignore_eos
        self.exact_lengths = exact_lengths
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.num_retractions = 0
        self._retracted = False  # the coming decode step retracted: it does not decay the ratio
        self._total_tokens = 0   # free tokens at the round's start (PrefillAdder.total_tokens)
        self._rem_tokens = 0.0   # PrefillAdder.rem_total_tokens
        self._states: list[tuple[int, int]] | None = None  # (tokens left, tokens held), sorted
        self._new: list[Request] = []  # admitted this round (can_run_list)
        self._running: list[Request] = []
        self._ds: DecodeSet | None = None

    @staticmethod
    def _clip(n: int) -> int:
        return min(n, CLIP_MAX_NEW_TOKENS)

    def _generated(self, r: Request) -> int:
        """Tokens ``r`` has emitted (a decode's count lives in the decode set's step counter)."""
        if r.in_decode:
            return r.g_join + self._ds.steps - r.step_join
        return r.num_generated

    def start_round(self, sched: Scheduler) -> None:
        """PrefillAdder(...) then remove_running_tokens(running_batch)."""
        kv, self._ds = sched.kv, sched.decode
        self._total_tokens = kv.num_free * kv.block_size
        self._running = list(sched.running.values())
        ratio = self.new_token_ratio
        # the sum apart from the subtraction: mypyc (sim/compiled_core.py) miscompiles int - sum(float, ...)
        reserved: float = sum(self._clip(r.max_tokens - self._generated(r)) * ratio for r in self._running)
        self._rem_tokens = self._total_tokens - reserved
        self._states = None
        self._new = []

    def admits(self, sched: Scheduler, req: Request) -> bool:
        if not self._running and not self._new:
            # SGLang clips max_new_tokens so that prompt + max_new_tokens fit the pool
            # (tp_worker handle_generate_request); a request alone on an empty pool always fits
            return True
        if self._rem_tokens <= 0:  # no_remaining_tokens(): the loop stops
            return False
        extend = req.prefill_target - req.num_computed  # prompt (+ output so far, if retracted)
        if not self.exact_lengths:
            # add_one_req: total_tokens >= rem_total_tokens -> not admitted
            return extend + self._clip(req.max_tokens) < self._rem_tokens
        # add_one_req_ignore_eos: quick check, then the exact one over the sorted remainders
        if extend + req.max_tokens <= self._rem_tokens:
            return True
        state = self._state(req)
        if self._states is None:
            states = [self._state(r) for r in self._running + self._new]
            states.append(state)
            self._states = sorted(s for s in states if s[0] > 0)
        elif state[0] > 0:
            self._insert(state)
        states = self._states
        freed = 0
        for i, (left, held) in enumerate(states):
            # until the next-shortest finishes, every request from i on decodes that many steps
            steps = states[i + 1][0] if i + 1 < len(states) else left
            if self._total_tokens + freed - steps * (len(states) - i) <= 0:
                return False
            freed += held
        return True

    def _state(self, r: Request) -> tuple[int, int]:
        """(tokens left, tokens occupied) of get_req_state with ratio 1.0 (ignore_eos): its
        max_new_tokens less those emitted."""
        g = self._generated(r)
        return r.max_tokens - g, r.prompt_tokens + g

    def _insert(self, state: tuple[int, int]) -> None:
        states = self._states
        for i, (left, _) in enumerate(states):
            if left >= state[0]:
                states.insert(i, state)
                return
        states.append(state)

    def on_admit(self, req: Request) -> None:
        """_prefill_one_req: the prompt and its whole clipped max_new_tokens are taken."""
        self._rem_tokens -= req.prefill_target - req.num_computed + self._clip(req.max_tokens)
        self._new.append(req)

    def before_decode(self, sched: Scheduler, plan: StepPlan, now: float) -> None:
        """forward_decode_batch: check_decode_mem (a KV slot for every decode) or
        retract_decode: decodes with the fewest output tokens (ties: the longest prompt) leave,
        recomputed later from the back of the queue, until the free tokens cover
        RETRACT_DECODE_STEPS per remaining decode; the last one always stays. The ratio is
        then reset to (decoded + 20 x remaining) / their max_new_tokens, at most 1."""
        kv, ds = sched.kv, sched.decode
        if not ds.num_seqs or ds.blocks_next_step() <= kv.num_free:
            return
        self._ds = ds
        gen = {r.request_id: self._generated(r) for r in sched.running.values() if r.in_decode}
        decodes = [r for r in sched.running.values() if r.in_decode]
        decodes.sort(key=lambda r: (gen[r.request_id], -r.prompt_tokens), reverse=True)
        while kv.num_free * kv.block_size < len(decodes) * RETRACT_DECODE_STEPS and len(decodes) > 1:
            victim = decodes.pop()
            sched._preempt(victim, now)
            sched.waiting.remove(victim)  # tp_worker: waiting_queue.extend(retracted_reqs)
            sched.waiting.append(victim)
            plan.add_preempted(victim)
            self.num_retractions += 1
        decoded = sum(gen[r.request_id] for r in decodes)
        max_new = sum(r.max_tokens for r in decodes)  # sampling_params.max_new_tokens
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(decodes)) / max_new)
        self._retracted = True

    def on_decode_steps(self, k: int) -> None:
        """Each decode step that did not retract lowers the ratio by the decay, to the minimum."""
        if self._retracted:
            self._retracted = False
            k -= 1
        if k > 0:
            self.new_token_ratio = max(self.new_token_ratio - k * NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)

    def on_idle(self) -> None:
        """forward_step with nothing to run: the ratio goes back to its initial value."""
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO


ADMISSIONS = ("vllm", "sglang")


def make_admission(name: str, prefix_caching: bool, ignore_eos: bool = False) -> VLLMAdmission:
    """The admission policy ``engine.admission`` names (``ignore_eos``: the clients send it)."""
    if name == "sglang":
        return SGLangAdmission(exact_lengths=ignore_eos and not prefix_caching)
    if name == "vllm":
        return VLLMAdmission()
    raise ValueError(f"unknown admission {name!r}; choose from {', '.join(ADMISSIONS)}")
