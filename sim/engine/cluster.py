"""Cluster wiring on the simulation's clock (sim/engine/clock.py): the arrivals (sim/engine/arrivals.py), a router, one loop per replica.

Why: the clock keeps simulated time only. Each replica loops ``plan = scheduler.schedule(now)``,
waits the plan's step time and applies ``on_step_done``; its TTFT accounting observes every
plan and step (sim/core/ttft.py). A fast-forwarded run of identical
decode steps is interrupted by an arrival and cut at the step boundary after it, where an
engine would let the new request in. The cost model may cover only a run's first steps (one
piece along which step times follow a smooth curve: ``sim/cost/runs.py``); the replica runs
those and plans again, so a run costs what its steps cost one at a time. Disaggregation is a
topology (sim/engine/topology.py), not a mode inside one scheduler. A multi-step block
(``engine.num_scheduler_steps``) is not interrupted: it runs all its steps, costed piece by
piece, and arrivals wait for its end.
"""

from __future__ import annotations

import gc
import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from sim.engine.clock import URGENT

from sim.core.batch import Batch, BatchValues
from sim.cost.roofline import RooflineCostModel, RunCostValues
from sim.cost.runs import RunCost, run_sum_s
from sim.errors import SimulationStalled, UserError
from sim.policies.base import Scheduler, StepPlan
from sim.engine.admission_control import REJECTED, reject
from sim.engine.arrivals import Arrivals
from sim.engine.calls import Call
from sim.engine.simpy_clock import ClockEnvironment
from sim.engine.recorder import Recorder
from sim.engine.results import RequestResults
from sim.core.request import ABORTED, Request
from sim.engine.router import RouterFn, least_outstanding
from sim.core.ttft import SoloPrefill, TTFTAccounting
from sim.workload.arrays import RequestArrays




def steps_within(elapsed_s: float, first_s: float, last_s: float, k: int, curve_s: float = 0.0) -> int:
    """Smallest j in [1, k] whose cumulative time (``run_sum_s``: steps from ``first_s`` to
    ``last_s``, bent by ``curve_s``) reaches ``elapsed_s``: the step running at ``elapsed_s``
    is allowed to finish. The straight line's root is the first guess."""
    slope = (last_s - first_s) / (k - 1) if k > 1 else 0.0
    # (run_sum_s called by name below, not through a local closure: compiled,
    # sim/compiled_core.py, a closure is made per call and called generically)
    if slope > 1e-18:
        a, b = slope / 2.0, first_s - slope / 2.0
        j = int(math.ceil((-b + math.sqrt(b * b + 4 * a * elapsed_s)) / (2 * a)))
    else:
        j = int(math.ceil(elapsed_s / first_s)) if first_s > 0 else 1
    j = min(max(j, 1), k)
    while j > 1 and run_sum_s(j - 1, first_s, last_s, k, curve_s) >= elapsed_s:
        j -= 1
    while j < k and run_sum_s(j, first_s, last_s, k, curve_s) < elapsed_s:
        j += 1
    return j


def run_cost_reader(cost) -> tuple[Callable[[BatchValues], RunCostValues], bool]:
    """How the replica loop asks ``cost`` for a run's cost each step, and whether it hands it the
    batch as a plain tuple (``StepPlan.batch_values``) rather than a ``Batch``: the model's
    ``run_cost_values`` (RunCost's fields as a plain tuple; it reads the batch by position) where
    its ``run_cost`` is ``RooflineCostModel``'s, not overridden (compiled, sim/compiled_core.py,
    a NamedTuple made per step is a generic call); else its ``run_cost`` and a ``Batch``."""
    values = getattr(cost, "run_cost_values", None)
    if (isinstance(cost, RooflineCostModel) and values is not None
            and getattr(type(cost), "run_cost", None) is RooflineCostModel.run_cost):
        return values, True
    return cost.run_cost, False


class RooflineSolo(SoloPrefill):
    """``SoloPrefill`` of a ``RooflineCostModel``: asks it through a typed reference (compiled,
    sim/compiled_core.py, a native call; the base class's untyped model is asked by a generic
    method call with boxed arguments)."""

    def alone_s(self, n: int, ctx: int, completing: bool) -> float:
        cost = self.cost
        assert isinstance(cost, RooflineCostModel)  # (made only for one; narrowed: a native call)
        return cost.prefill_alone_s(n, ctx, completing)


class _BlockState:
    """A multi-step block in progress: its plan and shape, when it began, the steps run so far,
    the first and the last step's seconds, and the cost of the piece running now."""

    __slots__ = ("plan", "batch", "start_s", "done", "first_s", "last_s", "rc")

    def __init__(self, plan, batch: Batch, start_s: float):
        self.plan, self.batch, self.start_s = plan, batch, start_s
        self.done, self.first_s, self.last_s = 0, 0.0, 0.0
        self.rc: RunCost | None = None


class Replica:
    """One serving-engine instance: a scheduler stepping on simulated GPUs.

    The loop (plan a step at now, wait the step's time, apply it, plan again) runs as callbacks
    of events in the clock's queue (sim/engine/calls.py ``Call``) rather than as a generator process
    (a process costs a resume of the generator per step): ``_plan`` plans and schedules the
    step's end, ``_step_end`` applies the step and plans again. It schedules the very events such a process does, at the same
    times and priorities and in the same order (the start as ``Initialize``: URGENT; a step's
    end as ``Timeout``: NORMAL; an idle replica's wake-up as ``Event.succeed``: NORMAL, now; a
    cut of a run as ``Interruption``: URGENT, now), so a run is event for event the same."""

    def __init__(self, env: ClockEnvironment, index: int, scheduler: Scheduler, cost,
                 recorder: Recorder, on_finish: Callable[[list[Request]], None],
                 swap_s_per_block: float = 0.0, on_step: Callable[["Replica"], None] | None = None):
        self.env, self.index, self.scheduler, self.cost = env, index, scheduler, cost
        self.clock = clock = env.clock
        self.recorder, self.on_finish, self.on_step = recorder, on_finish, on_step
        self.swap_s_per_block = swap_s_per_block
        # observes the scheduler's plans and the steps' times
        # (a RooflineCostModel's memo of chunks alone is the model's ``solo_cache``: the replicas
        # sharing a model share it, as the same chunk shapes recur on every replica)
        self.ttft = TTFTAccounting(cost, RooflineSolo(cost, cost.solo_cache) if isinstance(cost, RooflineCostModel)
                                   else None)
        self._run_cost, plain = run_cost_reader(cost)
        # the model the loop asks for run_cost_values, where it reads them (typed: compiled,
        # sim/compiled_core.py, a native call that takes and returns the tuples unboxed)
        self._roofline: RooflineCostModel | None = cost if plain else None
        self._idle = False           # the last round planned nothing: notify() wakes the loop
        self._interruptible = False  # a run of k > 1 decode steps is in flight: notify() cuts it
        # the step (or run) in flight: its plan, prompt tokens, start, first and last step seconds,
        # steps, curve (``RunCost``), and the cost model's flags (extrapolated, LM head
        # extrapolated, overhead outside the measured range); fields, not a tuple built per step
        # (compiled, sim/compiled_core.py, they are native: nothing boxed, nothing allocated)
        self._inflight = StepPlan(1, 0, 0, 0)
        self._prefill_tokens = 0
        self._start_s = self._first_s = self._last_s = self._curve_s = 0.0
        self._steps = 1
        self._extrapolated = self._lm_extrapolated = False
        self._outside: tuple[int, int] | None = None
        # the end event of the step or run in flight: one object, scheduled again for each step
        # (a cut run leaves its end event pending in the queue, abandoned: a new one then follows)
        self._end = Call(clock, self._step_end)
        # the wake-up, the cut and the cut run's end: one object each, scheduled again each time
        # (each is pending at most once: an idle replica has no step in flight; a run is cut once)
        self._wake = Call(clock, self._plan)
        self._cut_call = Call(clock, self._cut)
        self._cut_end_call = Call(clock, self._cut_end)
        self._load_wake: Call | None = None  # an idle replica's wake-up at a CPU-tier load's end
        self._cut_steps = 0  # steps of the run in flight that a cut lets finish
        self._cut_pending = False  # the run in flight was cut: it ends after ``_cut_steps``
        self._in_step = False  # a step (or run) planned by ``_plan_at`` is in flight
        self._block: _BlockState | None = None
        self.last_step_s = 0.0  # duration of the step (or run) that ended last
        self._aborts: list[Request] = []  # aborted by their clients, ended at the next boundary (``abort``)
        Call(clock, self._plan).at(0.0, URGENT)  # the loop starts as a process would (Initialize)

    def submit(self, req: Request) -> None:
        req.replica = self.index
        now = self.clock.now_s
        if not self.scheduler.add_request(req, now):
            self.on_finish([req])
            return
        self.ttft.on_arrival(req, now)
        self._notify_at(now)

    def abort(self, req: Request) -> None:
        """``req``'s client aborted it now: it ends (``Scheduler.abort``) at the next step
        boundary, before the next plan, as vLLM's engine core handles an abort between two
        steps (vllm/v1/engine/core.py ``run_busy_loop``: ``_process_input_queue``, then
        ``_process_engine_step``). An idle replica plans again now; a fast-forwarded run is cut
        at the boundary of the step running now, as an arrival cuts it; a single step (or a
        multi-step block) runs to its end."""
        self._aborts.append(req)
        self._notify_at(self.clock.now_s)

    def _end_aborted(self, now: float) -> None:
        """The aborts received since the last boundary: their requests end now (those that
        ended meanwhile are left as they ended)."""
        aborts = self._aborts
        self._aborts = []
        ended: list[Request] = []
        for req in aborts:
            if self.scheduler.abort(req, now):
                ended.append(req)
        if ended:
            self.on_finish(ended)

    def notify(self) -> None:
        """Something changed (a request arrived, KV was freed): re-plan at the next boundary."""
        if self._idle or self._interruptible:
            now = self.clock.now_s
            self._notify_at(now)

    def _notify_at(self, now: float) -> None:
        """``notify`` by a caller that has read the clock (``now``)."""
        if self._idle:
            self._idle = False
            self._wake.at_from(now, 0.0)  # a wake-up event succeeding now
        elif self._interruptible:
            self._interruptible = False
            self._cut_call.at_from(now, 0.0, URGENT)  # an interruption

    def _plan(self, event: Call) -> None:
        """The loop's start, or a wake-up (``notify``)."""
        self._plan_at(event.time_s)

    def _plan_at(self, now: float) -> None:
        """The loop's top: plan a step at ``now`` (the clock's time) and start it, or stay idle
        until ``notify``."""
        if self._aborts:
            self._end_aborted(now)
        sched = self.scheduler
        plan = sched.schedule(now)
        self.ttft.on_schedule(plan, now)
        tier = sched.kv.offload
        if tier is not None and tier.h2d_free_s > now:  # CPU-tier loads in flight
            self._notify_after_load(tier.next_end_s(now), now)
        if not (plan.num_decode_seqs or plan.chunks):  # plan.idle, inline (a property call per round)
            self._idle = True
            return
        if plan.block:
            self._block = _BlockState(plan, plan.batch, now)
            self._block_piece()
            return
        # the cost model may cover only the run's first steps (its affine piece): run those,
        # then plan again (the scheduler takes back the rest's KV blocks). (Two calls, not one
        # variable for either batch: compiled, it would take the plain tuple's type, and a Batch
        # would reach a model that reads its fields by name as a plain tuple.)
        roofline = self._roofline
        if roofline is not None:
            # (unpacked by name, then handed on whole: mypyc 1.13 frees the items of a tuple
            # still in use when names unpacked from it go unused, tests/test_compiled_core.py)
            decodes, context, chunks, logits, steps, prefill_tokens, tokens = plan.batch_values()
            first, last, k, extrapolated, lm_head_extrapolated, curve, outside = roofline.run_cost_values(
                (decodes, context, chunks, logits, steps, prefill_tokens, tokens))
        else:
            batch = plan.batch
            prefill_tokens = batch.prefill_tokens
            first, last, k, extrapolated, lm_head_extrapolated, curve, outside = self._run_cost(batch)
        if plan.swap_blocks:  # NOTE: PCIe swap copies are serialised with the step
            first += plan.swap_blocks * self.swap_s_per_block
            last = first
        self._inflight, self._prefill_tokens, self._start_s = plan, prefill_tokens, now
        self._first_s, self._last_s, self._steps, self._curve_s = first, last, k, curve
        self._extrapolated, self._lm_extrapolated, self._outside = extrapolated, lm_head_extrapolated, outside
        self._in_step, self._cut_pending = True, False
        if k > 1:
            self._interruptible = True
            self._end.at_from(now, run_sum_s(k, first, last, k, curve))
        else:
            self._end.at_from(now, first)

    def _notify_after_load(self, end: float, now: float) -> None:
        """A load from the CPU offloading tier ends at ``end``: then ``notify`` (an idle replica
        plans again, a run of decode steps is cut at its step boundary), as vLLM schedules every
        step and finds the loaded request ready in the first round after the load
        (vllm/v1/core/sched/scheduler.py ``_update_waiting_for_remote_kv``)."""
        call = self._load_wake
        if call is not None and call.pending:
            if call.time_s <= end:
                return
            call.abandon()
        self._load_wake = Call(self.clock, self._load_done).at_from(now, end - now)

    def _load_done(self, event: Call) -> None:
        self.notify()

    def _step_end(self, event: Call) -> None:
        """The step (or the whole run) ended."""
        self._interruptible = False
        self._apply(self._steps, self._last_s, event.time_s)

    def _cut(self, event: Call) -> None:
        """An arrival during a run: the run ends at the boundary of the step running now."""
        # the run's end event stays in the queue until its time, calling nothing; a new one follows
        self._end = self._end.abandon()
        start, first, last, k, curve = self._start_s, self._first_s, self._last_s, self._steps, self._curve_s
        now = event.time_s
        done = steps_within(now - start, first, last, k, curve)
        end = start + run_sum_s(done, first, last, k, curve)
        self._cut_steps, self._cut_pending = done, True
        if end > now:
            self._cut_end_call.at_from(now, end - now)
        else:
            self._cut_end_at(now)

    def _cut_end(self, event: Call) -> None:
        self._cut_end_at(event.time_s)

    def _cut_end_at(self, now: float) -> None:
        """A cut run's last step ended (now)."""
        first, last, k, curve = self._first_s, self._last_s, self._steps, self._curve_s
        done = self._cut_steps
        self._apply(done, run_sum_s(done, first, last, k, curve) - run_sum_s(done - 1, first, last, k, curve), now)

    def _apply(self, done: int, last: float, now: float) -> None:
        """``done`` steps of the plan in flight ended ``now`` (the last took ``last`` seconds):
        the observers see them, the scheduler applies them, the step log gets its row; plan
        again."""
        plan, start, first, outside = self._inflight, self._start_s, self._first_s, self._outside
        extrapolated, lm_head_extrapolated = self._extrapolated, self._lm_extrapolated
        self._in_step = False
        sched, rec = self.scheduler, self.recorder
        if plan.chunks or plan.prompts_skipped or plan.kv_ready:  # TTFTAccounting.concerns, inline
            self.ttft.on_step(plan, now, now - start)
        if extrapolated or lm_head_extrapolated or outside is not None:
            rec.count_cost(self.index, extrapolated, lm_head_extrapolated, outside, done)
        kv = sched.kv
        kv_used = kv.num_blocks - kv.num_free  # kv.num_used during the step, before finished requests free theirs
        finished = sched.on_step_done(plan, now, done)
        n = plan.num_decode_seqs
        rec.step_rows.add(self.index, start, now - start, done, n + len(plan.chunks), self._prefill_tokens,
                          n * done, kv_used, len(sched.waiting), first, last, 0)
        if plan.ready_gaps_s or plan.pause_extras:
            rec.lengthen_gaps(first, plan.ready_gaps_s, plan.pause_extras)
        if finished:
            self.on_finish(finished)
        self.last_step_s = now - start
        if self.on_step is not None:
            self.on_step(self)
        self._plan_at(now)

    # -- a run in flight, as a client streaming from it sees it (sim/serve/live_view.py) ----------
    def steps_ended_by(self, t_s: float) -> int:
        """Steps of the decode run in flight that ended by ``t_s``, before the run's own end
        (which is an event: once processed the sequences' tokens are counted): a sequence
        decoding in the run has emitted that many more tokens. Reads the run, cuts nothing."""
        if not self._in_step or not self._inflight.num_decode_seqs:
            return 0
        k = self._cut_steps if self._cut_pending else self._steps
        elapsed = t_s - self._start_s
        if k <= 1 or elapsed <= 0.0:
            return 0
        start, first, last, steps, curve = self._start_s, self._first_s, self._last_s, self._steps, self._curve_s
        # (compared as absolute times, as ``next_step_end_s`` gives them: t - start would round)
        j = min(steps_within(elapsed, first, last, steps, curve), k - 1)
        while j > 0 and start + run_sum_s(j, first, last, steps, curve) > t_s:
            j -= 1
        while j + 1 < k and start + run_sum_s(j + 1, first, last, steps, curve) <= t_s:
            j += 1
        return j

    def next_step_end_s(self, t_s: float) -> float:
        """When the next step of the decode run in flight ends after ``t_s``, short of the
        run's own end (an event already queued); ``inf`` when there is none."""
        if not self._in_step or not self._inflight.num_decode_seqs:
            return math.inf
        k = self._cut_steps if self._cut_pending else self._steps
        j = self.steps_ended_by(t_s) + 1
        if j >= k:
            return math.inf
        return self._start_s + run_sum_s(j, self._first_s, self._last_s, self._steps, self._curve_s)

    # -- multi-step blocks ------------------------------------------------------------------------
    def _block_piece(self) -> None:
        """Run the block's next piece (the cost model's pieces one after another, each at most
        ``max_run_steps``), uninterrupted; after the last, apply the block."""
        bs = self._block
        b = bs.batch
        n, k = b.num_decode_seqs, b.num_steps
        if bs.done >= k:
            self._block_end()
            return
        rc = self.cost.run_cost(Batch(n, b.decode_context_tokens + n * bs.done, (), b.num_logits,
                                      min(k - bs.done, self.scheduler.limits.max_run_steps)))
        if not bs.done:
            bs.first_s = rc.first_s
        bs.last_s = rc.last_s
        bs.rc = rc
        Call(self.clock, self._block_piece_end).at(run_sum_s(rc.num_steps, rc.first_s, rc.last_s, rc.num_steps,
                                                           rc.curve_s))

    def _block_piece_end(self, _event) -> None:
        bs = self._block
        rc = bs.rc
        self.recorder.count_cost(self.index, rc.extrapolated, rc.lm_head_extrapolated, rc.overhead_outside_seqs,
                                 rc.num_steps)
        bs.done += rc.num_steps
        self._block_piece()

    def _block_end(self) -> None:
        """All the block's steps ran: its tokens are released together now."""
        bs, sched, rec = self._block, self.scheduler, self.recorder
        plan, start = bs.plan, bs.start_s
        now = self.clock.now_s
        self.ttft.on_decode_step(plan, now)
        done = plan.num_steps
        kv_used = sched.kv.num_used
        finished = sched.on_step_done(plan, now, done)
        rec.step((self.index, start, now - start, done, plan.num_decode_seqs, 0,
                  plan.num_decode_seqs * done, kv_used, len(sched.waiting), bs.first_s, bs.last_s, 1))
        if finished:
            self.on_finish(finished)
        self.last_step_s = now - start
        self._block = None
        if self.on_step is not None:
            self.on_step(self)
        self._plan_at(now)


class Colocated:
    """Replicas that each run prefill and decode; the router picks one per arrival."""

    def __init__(self, env: ClockEnvironment, schedulers: list[Scheduler], costs: list, router: RouterFn,
                 recorder: Recorder, on_finish: Callable[[list[Request]], None], swap_s_per_block: float = 0.0):
        self.schedulers = schedulers
        self.router = router
        # the default router, called natively (compiled, sim/compiled_core.py; calling the
        # attribute is a generic call per arrival)
        self._least_outstanding = router is least_outstanding
        self.replicas = [Replica(env, i, s, c, recorder, on_finish, swap_s_per_block)
                         for i, (s, c) in enumerate(zip(schedulers, costs))]

    def submit(self, req: Request) -> None:
        if self._least_outstanding:
            i = least_outstanding(req, self.schedulers)
        else:
            i = self.router(req, self.schedulers)
        self.replicas[i].submit(req)

    def abort(self, req: Request) -> None:
        """``req`` (sent to a replica: ``submit``) is aborted by its client now."""
        self.replicas[req.replica].abort(req)


TopologyFactory = Callable[[ClockEnvironment, Recorder, Callable[[list[Request]], None]], object]

# the statuses of a request that has ended (Request.status; ABORTED, REJECTED beside)
COMPLETED = "completed"
FAILED = "failed"

# A list to log (time, priority) of the events a run processes that call something, or None
# (tests compare two event loops' events: tests/test_arrivals.py)
EVENT_LOG: list[tuple[float, int]] | None = None


class Simulation:
    """One run's wiring: the clock (sim/engine/clock.py), the topology (colocated replicas by
    default) and the arrivals of ``chunks`` (consecutive sorted chunks of a workload, read as
    simulated time reaches them; none for a live run, whose arrivals are injected:
    ``arrivals.inject``). ``clock.run()`` runs it to the end, ``clock.run_until(t_s)`` to a time.
    With ``max_concurrency`` (vLLM bench ``--max-concurrency``) a request waits for its arrival
    time and for a free client; a client is free ``think_time_s`` after its previous request
    ended, and the request's arrival time is when it is sent. With ``results``, each request is
    written there as it ends and not kept (``requests`` stays empty): memory then grows with
    the requests in flight. ``on_end`` (if given) sees every request that ends. ``client`` (a
    closed loop's front end, sim/engine/frontend.py ``ClosedLoopFrontend``, or None): a client
    is free when its request's last chunk reached it, and what it sends reaches the engine when
    the API server hands it over."""

    def __init__(self, chunks: Iterable[RequestArrays], schedulers: list[Scheduler] | None = None,
                 costs: list | None = None, router: RouterFn | None = None,
                 progress: Callable[[int], None] | None = None, topology: TopologyFactory | None = None,
                 swap_s_per_block: float = 0.0, max_concurrency: int | None = None, think_time_s: float = 0.0,
                 total: int = 0, results: RequestResults | None = None,
                 on_end: Callable[[list[Request]], None] | None = None, admission: Any = None,
                 client: Any = None):
        self.env = env = ClockEnvironment()
        self.clock = clock = env.clock
        clock.log = EVENT_LOG
        self.recorder = Recorder()
        self.requests: list[Request] = []
        self.results = results
        self.ended = 0
        self._progress, self._report_every, self._on_end = progress, max(1, total // 200), on_end
        self._max_concurrency, self._think_time_s = max_concurrency, think_time_s
        self._client = client if max_concurrency is not None else None
        self._entering: deque[Request] = deque()  # sent, not yet handed over by the API server
        self._entered_call = Call(clock, self._entered)
        topo: Any  # Colocated, or what a topology builds (sim/engine/topology.py)
        if topology is None:
            topo = Colocated(env, schedulers, costs, router, self.recorder, self._on_finish, swap_s_per_block)
        else:
            topo = topology(env, self.recorder, self._on_finish)
        self.topology = topo
        # admission control in front of the engines (sim/engine/admission_control.py), or None
        self.admission = admission
        self._topology_submit = topo.submit
        submit = topo.submit if admission is None else self._admit
        self._engine_submit = submit
        if self._client is not None:  # a closed loop's requests pass the API server first (``_enter``)
            submit = self._enter
        # (made after the topology, as the arrival process was started after the replicas')
        self.arrivals = arrivals = Arrivals(env, chunks, submit, self.requests if results is None else None,
                                            max_concurrency, self.abort, self._aborted_unsent)
        clock.num_requests = lambda: arrivals.sent

    def _release_later(self, n: int):
        yield self.env.timeout(self._think_time_s)
        self.arrivals.release(n)

    def _release_after(self, delay_s: float):
        yield self.env.timeout(delay_s)
        self.arrivals.release(1)

    def _enter(self, req: Request) -> None:
        """A closed loop's request, sent by its client now: it reaches the engine (admission
        control, then the topology) when the API server hands it over, its arrival there
        (``ClosedLoopFrontend.entry``: in the order sent)."""
        now = self.clock.now_s
        req.arrival_s = entry_s = float(self._client.entry(now, req.prompt_tokens))
        self._entering.append(req)
        if not self._entered_call.pending:
            self._entered_call.at_from(now, entry_s - now)

    def _entered(self, event: Call) -> None:
        """The API server hands over the request this wait was for, and any other due now."""
        entering = self._entering
        now = event.time_s
        self._engine_submit(entering.popleft())
        while entering and entering[0].arrival_s <= now:
            self._engine_submit(entering.popleft())
        if entering:
            self._entered_call.at_from(now, entering[0].arrival_s - now)

    def _admit(self, req: Request) -> None:
        """An arrival through admission control: on to the topology, or ended as rejected."""
        now = self.clock.now_s
        reason = self.admission.decide(req, now)
        if reason:
            reject(req, now, reason)
            self._on_finish([req])
            return
        self._topology_submit(req)

    def abort(self, req: Request) -> None:
        """``req``'s client aborts it now (a live server's disconnect, a trace's ``abort_s``):
        it ends as aborted at its replica's next step boundary (``Replica.abort``); nothing if it
        has ended already (completed, failed, rejected)."""
        if req.status in (COMPLETED, FAILED, REJECTED, ABORTED):
            return
        abort = getattr(self.topology, "abort", None)
        if abort is None:
            raise UserError("abort_s: requests aborted by their clients are modelled for colocated replicas "
                            "only, not with cluster.disaggregation or cluster.data_parallel_size > 1")
        abort(req)

    def _aborted_unsent(self, req: Request) -> None:
        """``req`` was aborted while the API server still held it (sim/engine/frontend.py): it
        never reached admission control or an engine, and ends as it is handed over."""
        self._on_finish([req], reached_engine=False)

    def _on_finish(self, finished: list[Request], reached_engine: bool = True) -> None:
        """``finished`` ended now. ``reached_engine`` False: aborted before the API server handed
        them over (``_aborted_unsent``): admission control never counted them, and their clients,
        which received nothing, are free at once."""
        admission = self.admission
        if admission is not None and reached_engine:
            for req in finished:
                if req.status != REJECTED:
                    admission.ended(req)
        if self.results is not None:
            self.results.add(finished)
        if self._on_end is not None:
            self._on_end(finished)
        before = self.ended
        self.ended += len(finished)
        if self._max_concurrency is not None:
            client = self._client
            if client is not None and reached_engine:  # each client is free when its last chunk reached it
                for req in finished:
                    self.env.process(self._release_after(
                        client.client_free_after_s(req.output_tokens) + self._think_time_s))
            elif self._think_time_s > 0:
                self.env.process(self._release_later(len(finished)))
            else:
                self.arrivals.release(len(finished))
        if self._progress is not None and self.ended // self._report_every != before // self._report_every:
            self._progress(self.ended)

    def close(self) -> Recorder:
        """The run is over: its step records, the schedulers' resume gaps added."""
        rec = self.recorder
        if self.results is not None:
            self.results.sent = self.arrivals.sent
        for s in self.topology.schedulers:
            rec.resume_gaps_s.extend(s.resume_gaps_s)
            rec.resume_gaps_s.extend(s.burst_gaps_s)
        if self._progress is not None:
            self._progress(self.ended)
        return rec


def simulate(arrays: RequestArrays | Iterable[RequestArrays], schedulers: list[Scheduler] | None = None,
             costs: list | None = None,
             router: RouterFn | None = None, progress: Callable[[int], None] | None = None,
             topology: TopologyFactory | None = None,
             swap_s_per_block: float = 0.0, max_concurrency: int | None = None, think_time_s: float = 0.0,
             total_hint: int | None = None, results: RequestResults | None = None,
             admission: Any = None, client: Any = None) -> tuple[list[Request], Recorder]:
    """Replay ``arrays`` (or consecutive sorted chunks of a workload, fed as simulated time
    reaches them) through a topology (``Simulation``, which says what each argument does) to
    the end; return every request (completed or failed; empty with ``results``) and the step
    records."""
    chunks = [arrays] if isinstance(arrays, RequestArrays) else arrays
    total = len(arrays) if isinstance(arrays, RequestArrays) else (total_hint or 0)
    sim = Simulation(chunks, schedulers, costs, router, progress, topology, swap_s_per_block, max_concurrency,
                     think_time_s, total, results, admission=admission, client=client)
    # The run allocates millions of short-lived objects but creates almost no reference cycles;
    # the cyclic collector would rescan every live request on each pass (28% of the wall time
    # at 100k requests, bench/README.md). Reference counting still frees everything meanwhile.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        sim.clock.run()
    finally:
        if was_enabled:
            gc.enable()
    return sim.requests, sim.close()
