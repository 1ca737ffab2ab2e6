"""Cluster wiring in SimPy: an arrival process, a router, one process per replica.

Why: SimPy keeps simulated time only. Each replica loops ``plan = scheduler.schedule(now)``,
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
from collections.abc import Callable, Iterable

import simpy

from sim.core.batch import Batch
from sim.cost.runs import run_sum_s
from sim.errors import SimulationStalled
from sim.policies.base import Scheduler
from sim.engine.recorder import Recorder
from sim.engine.results import RequestResults
from sim.core.request import Request
from sim.engine.router import RouterFn
from sim.core.ttft import TTFTAccounting
from sim.workload.arrays import RequestArrays


def steps_within(elapsed_s: float, first_s: float, last_s: float, k: int, curve_s: float = 0.0) -> int:
    """Smallest j in [1, k] whose cumulative time (``run_sum_s``: steps from ``first_s`` to
    ``last_s``, bent by ``curve_s``) reaches ``elapsed_s``: the step running at ``elapsed_s``
    is allowed to finish. The straight line's root is the first guess."""
    slope = (last_s - first_s) / (k - 1) if k > 1 else 0.0

    def cum(j: int) -> float:
        return run_sum_s(j, first_s, last_s, k, curve_s)

    if slope > 1e-18:
        a, b = slope / 2.0, first_s - slope / 2.0
        j = int(math.ceil((-b + math.sqrt(b * b + 4 * a * elapsed_s)) / (2 * a)))
    else:
        j = int(math.ceil(elapsed_s / first_s)) if first_s > 0 else 1
    j = min(max(j, 1), k)
    while j > 1 and cum(j - 1) >= elapsed_s:
        j -= 1
    while j < k and cum(j) < elapsed_s:
        j += 1
    return j


ARRIVAL_SLICE = 1 << 16  # arrivals turned into Python numbers at a time (not a whole chunk)

# Events allowed at one simulated instant before the run is declared stalled, on top of a
# per-request allowance (a trace on a coarse time grid legitimately puts thousands of
# arrivals, wake-ups and steps on one instant; a spinning process puts millions).
STALL_EVENTS_BASE = 1_000_000
STALL_EVENTS_PER_REQUEST = 64


def run_watched(env: simpy.Environment, num_requests: Callable[[], int]) -> None:
    """``env.run()`` with a watchdog: a run whose clock stays at one instant for more than
    ``STALL_EVENTS_BASE + STALL_EVENTS_PER_REQUEST * requests`` events raises
    ``SimulationStalled`` naming the instant, instead of hanging."""
    step, peek = env.step, env.peek
    inf = math.inf
    last_t, same = -1.0, 0
    while True:
        t = peek()
        if t == inf:
            return
        if t == last_t:
            same += 1
            if same > STALL_EVENTS_BASE:
                limit = STALL_EVENTS_BASE + STALL_EVENTS_PER_REQUEST * num_requests()
                if same > limit:
                    raise SimulationStalled(
                        f"simulation stalled: the clock stayed at t={t:.9g} s for {same:,} events "
                        f"(a model defect; please report it with the scenario)")
        else:
            last_t, same = t, 0
        step()


class Replica:
    """One serving-engine instance: a scheduler stepping on simulated GPUs."""

    def __init__(self, env: simpy.Environment, index: int, scheduler: Scheduler, cost,
                 recorder: Recorder, on_finish: Callable[[list[Request]], None],
                 swap_s_per_block: float = 0.0, on_step: Callable[["Replica"], None] | None = None):
        self.env, self.index, self.scheduler, self.cost = env, index, scheduler, cost
        self.recorder, self.on_finish, self.on_step = recorder, on_finish, on_step
        self.swap_s_per_block = swap_s_per_block
        self.ttft = TTFTAccounting(cost)  # observes the scheduler's plans and the steps' times
        self._wake: simpy.Event | None = None
        self._interruptible = False
        self.last_step_s = 0.0  # duration of the step (or run) that ended last
        self.process = env.process(self._loop())

    def submit(self, req: Request) -> None:
        req.replica = self.index
        if not self.scheduler.add_request(req, self.env.now):
            self.on_finish([req])
            return
        self.ttft.on_arrival(req, self.env.now)
        self.notify()

    def notify(self) -> None:
        """Something changed (a request arrived, KV was freed): re-plan at the next boundary."""
        if self._wake is not None:
            if not self._wake.triggered:
                self._wake.succeed()
        elif self._interruptible:
            self._interruptible = False
            self.process.interrupt()

    def _loop(self):
        env, sched, rec, cost, ttft = self.env, self.scheduler, self.recorder, self.cost, self.ttft
        record = rec.step
        while True:
            now = env.now
            plan = sched.schedule(now)
            ttft.on_schedule(plan, now)
            if plan.idle:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            chunks = plan.chunks
            # the cost model may cover only the run's first steps (its affine piece): run those,
            # then plan again (the scheduler takes back the rest's KV blocks)
            if plan.block:
                start = env.now
                first, last = yield from self._block(plan)
                ttft.on_decode_step(plan, env.now)
                done = plan.num_steps
                kv_used = sched.kv.num_used
                finished = sched.on_step_done(plan, env.now, done)
                rec.step((self.index, start, env.now - start, done, plan.num_decode_seqs, 0,
                          plan.num_decode_seqs * done, kv_used, len(sched.waiting), first, last, 1))
                if finished:
                    self.on_finish(finished)
                self.last_step_s = env.now - start
                if self.on_step is not None:
                    self.on_step(self)
                continue
            batch = plan.batch
            first, last, k, extrapolated, lm_head_extrapolated, curve, outside = cost.run_cost(batch)
            if plan.swap_blocks:  # NOTE: PCIe swap copies are serialised with the step
                first += plan.swap_blocks * self.swap_s_per_block
                last = first
            start = now
            done = k
            if k > 1:
                self._interruptible = True
                try:
                    yield env.timeout(run_sum_s(k, first, last, k, curve))
                except simpy.Interrupt:
                    done = steps_within(env.now - start, first, last, k, curve)
                    end = start + run_sum_s(done, first, last, k, curve)
                    if end > env.now:
                        yield env.timeout(end - env.now)
                    last = run_sum_s(done, first, last, k, curve) - run_sum_s(done - 1, first, last, k, curve)
                self._interruptible = False
            else:
                yield env.timeout(first)
            now = env.now
            if ttft.concerns(plan):
                ttft.on_step(plan, now, now - start)
            if extrapolated or lm_head_extrapolated or outside is not None:
                rec.count_cost(self.index, extrapolated, lm_head_extrapolated, outside, done)
            kv_used = sched.kv.num_used  # during the step, before finished requests free theirs
            finished = sched.on_step_done(plan, now, done)
            n = batch.num_decode_seqs
            record((self.index, start, now - start, done, n + len(chunks), batch.prefill_tokens, n * done, kv_used,
                    len(sched.waiting), first, last, 0))
            for gap in plan.ready_gaps_s:  # the joiner's first decode gap spans its wait
                rec.itl_adjust.append((first, first + gap))
            for extra, count in plan.pause_extras:  # decodes paused by prompt steps of their own
                rec.itl_adjust.extend([(first, first + extra)] * count)
            if finished:
                self.on_finish(finished)
            self.last_step_s = now - start
            if self.on_step is not None:
                self.on_step(self)


    def _block(self, plan):
        """Run a multi-step block's ``num_steps`` decode steps whole (SimPy sub-process): the cost
        model's pieces one after another (each at most ``max_run_steps``), uninterrupted.
        Returns the first and the last step's seconds."""
        b = plan.batch
        n, k, cap = b.num_decode_seqs, b.num_steps, self.scheduler.limits.max_run_steps
        done, first, last = 0, 0.0, 0.0
        while done < k:
            rc = self.cost.run_cost(Batch(n, b.decode_context_tokens + n * done, (), b.num_logits,
                                          min(k - done, cap)))
            if not done:
                first = rc.first_s
            last = rc.last_s
            yield self.env.timeout(run_sum_s(rc.num_steps, rc.first_s, rc.last_s, rc.num_steps, rc.curve_s))
            self.recorder.count_cost(self.index, rc.extrapolated, rc.lm_head_extrapolated, rc.overhead_outside_seqs,
                                     rc.num_steps)
            done += rc.num_steps
        return first, last


class Colocated:
    """Replicas that each run prefill and decode; the router picks one per arrival."""

    def __init__(self, env: simpy.Environment, schedulers: list[Scheduler], costs: list, router: RouterFn,
                 recorder: Recorder, on_finish: Callable[[list[Request]], None], swap_s_per_block: float = 0.0):
        self.schedulers = schedulers
        self.router = router
        self.replicas = [Replica(env, i, s, c, recorder, on_finish, swap_s_per_block)
                         for i, (s, c) in enumerate(zip(schedulers, costs))]

    def submit(self, req: Request) -> None:
        self.replicas[self.router(req, self.schedulers)].submit(req)


TopologyFactory = Callable[[simpy.Environment, Recorder, Callable[[list[Request]], None]], object]


def simulate(arrays: RequestArrays | Iterable[RequestArrays], schedulers: list[Scheduler] | None = None,
             costs: list | None = None,
             router: RouterFn | None = None, progress: Callable[[int], None] | None = None,
             topology: TopologyFactory | None = None,
             swap_s_per_block: float = 0.0, max_concurrency: int | None = None, think_time_s: float = 0.0,
             total_hint: int | None = None, results: RequestResults | None = None) -> tuple[list[Request], Recorder]:
    """Replay ``arrays`` (or consecutive sorted chunks of a workload, fed as simulated time
    reaches them) through a topology (colocated replicas by default); return every request
    (completed or failed) and the step records. With ``max_concurrency`` (vLLM bench
    ``--max-concurrency``) a request waits for its arrival time and for a free client; a client
    is free ``think_time_s`` after its previous request ended, and the request's arrival time
    is when it is sent. With ``results``, each request is written there as it ends and not
    kept (the returned list is empty): memory then grows with the requests in flight."""
    env = simpy.Environment()
    rec = Recorder()
    requests: list[Request] = []
    sent = [0]
    ended = [0]
    chunks = [arrays] if isinstance(arrays, RequestArrays) else arrays
    total = len(arrays) if isinstance(arrays, RequestArrays) else (total_hint or 0)
    report_every = max(1, total // 200)
    free = [max_concurrency if max_concurrency is not None else -1]  # -1: open loop
    wake: list[simpy.Event | None] = [None]

    def release(n: int) -> None:
        free[0] += n
        if wake[0] is not None and not wake[0].triggered:
            wake[0].succeed()

    def release_later(n: int):
        yield env.timeout(think_time_s)
        release(n)

    def on_finish(finished: list[Request]) -> None:
        if results is not None:
            results.add(finished)
        before = ended[0]
        ended[0] += len(finished)
        if max_concurrency is not None:
            if think_time_s > 0:
                env.process(release_later(len(finished)))
            else:
                release(len(finished))
        if progress is not None and ended[0] // report_every != before // report_every:
            progress(ended[0])

    if topology is None:
        topo = Colocated(env, schedulers, costs, router, rec, on_finish, swap_s_per_block)
    else:
        topo = topology(env, rec, on_finish)

    keep = results is None

    def arrivals():
        i = 0
        for chunk in chunks:  # a stream is read only as far as simulated time has reached
            hash_ids = chunk.hash_ids
            for lo in range(0, len(chunk), ARRIVAL_SLICE):  # Python numbers for a slice at a time
                arrival = chunk.arrival_s[lo:lo + ARRIVAL_SLICE].tolist()
                inp = chunk.input_tokens[lo:lo + ARRIVAL_SLICE].tolist()
                out = chunk.output_tokens[lo:lo + ARRIVAL_SLICE].tolist()
                for j in range(len(arrival)):
                    t = arrival[j]
                    if t > env.now:
                        yield env.timeout(t - env.now)
                    if max_concurrency is not None:
                        while free[0] <= 0:
                            wake[0] = env.event()
                            yield wake[0]
                            wake[0] = None
                        free[0] -= 1
                        t = env.now
                    req = Request(i, t, inp[j], out[j])
                    if hash_ids is not None:
                        req.hash_ids = hash_ids[lo + j]
                        req.hash_block_size = chunk.hash_block_size
                    if keep:
                        requests.append(req)
                    sent[0] = i = i + 1
                    topo.submit(req)

    env.process(arrivals())
    # The run allocates millions of short-lived objects but creates almost no reference cycles;
    # the cyclic collector would rescan every live request on each pass (28% of the wall time
    # at 100k requests, bench/README.md). Reference counting still frees everything meanwhile.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        run_watched(env, lambda: sent[0])
    finally:
        if was_enabled:
            gc.enable()
    if results is not None:
        results.sent = sent[0]
    for s in topo.schedulers:
        rec.resume_gaps_s.extend(s.resume_gaps_s)
        rec.resume_gaps_s.extend(s.burst_gaps_s)
    if progress is not None:
        progress(ended[0])
    return requests, rec
