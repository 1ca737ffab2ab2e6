"""The replica loop runs on event callbacks (sim/engine/cluster.py ``Replica``) and must schedule
exactly the events the generator process it replaced did: same times, priorities and order.
The process is kept here as the reference; runs that exercise every path of the loop (runs cut
by arrivals on a coarse time grid, where arrivals and step ends coincide; multi-step blocks;
swap preemption; disaggregation's hooks and wake-ups) must give identical step logs and
request records. Also: the owned clock runs SimPy processes as SimPy does."""

import math

import numpy as np
import pytest
import simpy

from sim.core.batch import Batch
from sim.core.ttft import TTFTAccounting
from sim.cost.runs import run_sum_s
from sim.engine import cluster, topology
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from sim.workload.arrays import RequestArrays


class ProcessReplica(cluster.Replica):
    """The replica loop as a SimPy generator process (the code before the callbacks)."""

    def __init__(self, env, index, scheduler, cost, recorder, on_finish, swap_s_per_block=0.0, on_step=None):
        self.env, self.index, self.scheduler, self.cost = env, index, scheduler, cost
        self.clock = env.clock
        self.recorder, self.on_finish, self.on_step = recorder, on_finish, on_step
        self.swap_s_per_block = swap_s_per_block
        self.ttft = TTFTAccounting(cost)
        self._wake = None
        self._interruptible = False
        self.last_step_s = 0.0
        self.process = env.process(self._loop())

    def notify(self):
        self._notify_at(self.env.now)

    def _notify_at(self, now):
        if self._wake is not None:
            if not self._wake.triggered:
                self._wake.succeed()
        elif self._interruptible:
            self._interruptible = False
            self.process.interrupt()

    def _loop(self):
        env, sched, rec, cost, ttft = self.env, self.scheduler, self.recorder, self.cost, self.ttft
        while True:
            now = env.now
            plan = sched.schedule(now)
            ttft.on_schedule(plan, now)
            if plan.idle:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            if plan.block:
                start = env.now
                first, last = yield from self._process_block(plan)
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
            if plan.swap_blocks:
                first += plan.swap_blocks * self.swap_s_per_block
                last = first
            start = now
            done = k
            if k > 1:
                self._interruptible = True
                try:
                    yield env.timeout(run_sum_s(k, first, last, k, curve))
                except simpy.Interrupt:
                    done = cluster.steps_within(env.now - start, first, last, k, curve)
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
            kv_used = sched.kv.num_used
            finished = sched.on_step_done(plan, now, done)
            n = batch.num_decode_seqs
            rec.step((self.index, start, now - start, done, n + len(plan.chunks), batch.prefill_tokens, n * done,
                      kv_used, len(sched.waiting), first, last, 0))
            for gap in plan.ready_gaps_s:
                rec.itl_adjust.append((first, first + gap))
            for extra, count in plan.pause_extras:
                rec.itl_adjust.extend([(first, first + extra)] * count)
            if finished:
                self.on_finish(finished)
            self.last_step_s = now - start
            if self.on_step is not None:
                self.on_step(self)

    def _process_block(self, plan):
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


def _workload(n: int, grid_s: float, seed: int) -> RequestArrays:
    rng = np.random.default_rng(seed)
    # arrivals on a coarse grid: many share an instant, and some fall exactly on a step's end
    t = np.floor(np.cumsum(rng.exponential(0.08, n)) / grid_s) * grid_s
    return RequestArrays(t, rng.integers(20, 1500, n), rng.integers(1, 300, n))


CASES = {
    "chunked": {"engine": {"policy": "chunked", "max_num_batched_tokens": 256}},
    "continuous, KV short, swap": {"hardware": {"gpu": "l40s"},
                                   "engine": {"policy": "continuous", "preemption_mode": "swap",
                                              "gpu_memory_utilization": 0.42}},
    "multi-step": {"engine": {"policy": "continuous", "num_scheduler_steps": 6}},
    "disaggregated": {"disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}},
}


def _case_raw(case: str) -> dict:
    """Two replicas of Llama-3-8B on H100 with ``CASES[case]``'s keys in place of the defaults
    (a disaggregated case sizes its own pools: no ``cluster``)."""
    raw = {"name": "loop", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
           "cluster": {"replicas": 2}, "workload": {"synthetic": {"num_requests": 1}}, **CASES[case]}
    if "disaggregation" in raw:
        del raw["cluster"]
    return raw


@pytest.mark.parametrize("case", list(CASES))
def test_callback_loop_is_the_process_loop_event_for_event(case, monkeypatch):
    raw = _case_raw(case)
    workload = _workload(300, 0.05, 1)
    new = run_scenario(scenario_from_dict(raw), workload=workload)
    monkeypatch.setattr(cluster, "Replica", ProcessReplica)
    monkeypatch.setattr(topology, "Replica", ProcessReplica)
    old = run_scenario(scenario_from_dict(raw), workload=workload)
    assert new.steps.height > 300
    if case == "multi-step":
        assert int(new.steps["multi_step"].sum()) > 10
    else:
        assert int(new.steps["num_steps"].max()) > 1  # fast-forwarded runs, some cut
    assert new.steps.equals(old.steps)
    assert new.requests.equals(old.requests)
    if "swap" in case:
        assert sum(s.num_swaps for s in new.schedulers) > 0
    assert new.itl_adjust == old.itl_adjust and new.resume_gaps_s == old.resume_gaps_s


@pytest.mark.parametrize("run", [True, False])
def test_arrival_exactly_at_a_step_end(run, monkeypatch):
    """A request that arrives at the very instant a step (or a fast-forwarded run) ends: the
    cut of the run and the end of the step come in the process's order."""
    raw = {"name": "loop", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
           "cluster": {"replicas": 1}, "engine": {"policy": "chunked", "max_num_batched_tokens": 256},
           "workload": {"synthetic": {"num_requests": 1}}}
    base = _workload(60, 0.05, 2)
    steps = run_scenario(scenario_from_dict(raw), workload=base).steps
    end = steps["start_s"] + steps["duration_s"]
    pick = (steps["num_steps"] > 1) if run else (steps["num_steps"] == 1)
    t_end = float(end.filter(pick & (steps["start_s"] > 1.0) & (end > steps["start_s"] * 1.0))[0])
    t = np.sort(np.append(base.arrival_s, t_end))
    i = int(np.searchsorted(t, t_end))
    workload = RequestArrays(t, np.insert(base.input_tokens, i, 200), np.insert(base.output_tokens, i, 40))
    new = run_scenario(scenario_from_dict(raw), workload=workload)
    assert (new.steps["start_s"] == t_end).any()  # a step began at the arrival: the ends met
    monkeypatch.setattr(cluster, "Replica", ProcessReplica)
    old = run_scenario(scenario_from_dict(raw), workload=workload)
    assert new.steps.equals(old.steps) and new.requests.equals(old.requests)


def _trace(env: simpy.Environment, log: list):
    def proc(i):
        for j in range(4):
            log.append((env.now, i, j))
            yield env.timeout((i * 0.3 + j) % 1.0)
        if i == 2:
            raise KeyError("boom")

    for i in range(4):
        env.process(proc(i))


def test_the_owned_clock_runs_simpy_processes_as_simpy_does():
    """SimPy processes on ``ClockEnvironment`` (its public ``now``/``schedule``/``step``/``peek``
    overridden, sim/engine/simpy_clock.py) run as on SimPy's own Environment: the same steps at
    the same times, a failed process's exception raised, ``run(until=...)`` stopping there."""
    from sim.engine.simpy_clock import ClockEnvironment
    a, b = [], []
    env_a, env_b = simpy.Environment(), ClockEnvironment()
    _trace(env_a, a)
    _trace(env_b, b)
    with pytest.raises(KeyError, match="boom"):
        env_a.run()
    with pytest.raises(KeyError, match="boom"):
        env_b.clock.run()
    assert a == b and env_a.now == env_b.now and len(a) > 10
    c, d = [], []
    env_c, env_d = simpy.Environment(), ClockEnvironment()
    _trace(env_c, c)
    _trace(env_d, d)
    env_c.run(until=1.55)
    env_d.run(until=1.55)
    assert c == d and env_c.now == env_d.now == 1.55


def test_batch_derives_its_token_counts():
    b = Batch(3, 300, ((100, 0), (20, 50)), 4)
    assert (b.prefill_tokens, b.num_tokens, b.num_steps) == (120, 123, 1)
    assert b._replace(prefill_chunks=()) == Batch(3, 300, (), 4)
    assert Batch(num_decode_seqs=2).num_tokens == 2 and Batch().num_tokens == 0
    import pickle
    assert pickle.loads(pickle.dumps(b)) == b and math.isfinite(b.num_tokens)


def test_batch_fields_in_the_order_read_by_position():
    """The replica loop unpacks a plan's ``batch_values`` in ``Batch``'s field order: that order is this."""
    assert Batch._fields == ("num_decode_seqs", "decode_context_tokens", "prefill_chunks", "num_logits",
                             "num_steps", "prefill_tokens", "num_tokens")


class _SimpyCall:
    """What ``Call`` stands for, in SimPy's own terms: a triggered ``simpy.Event`` scheduled
    with ``Environment.schedule``, processed by ``env.run()``."""

    def __init__(self, env, fn):
        self.env, self.fn = env, fn

    def at(self, delay_s, priority=simpy.events.NORMAL):
        ev = simpy.Event(self.env)
        ev.callbacks.append(self.fn)
        ev._ok, ev._value = True, None  # (a triggered event, as Event.succeed leaves it, unscheduled)
        self.env.schedule(ev, priority, delay_s)
        return ev


def _call(env, fn):
    from sim.engine.calls import Call
    return Call(env.clock, fn)


def _calls_beside_a_process(env, make_call, abandon):
    seen = []
    a = make_call(env, lambda e: seen.append(("a", env.now)))
    emptied = make_call(env, lambda e: seen.append(("emptied", env.now)))

    def proc():
        yield env.timeout(1.0)
        seen.append(("process", env.now))
        a.at(0.5)  # again, after it ran at 1.0
        yield env.timeout(0.5)
        seen.append(("process", env.now))

    env.process(proc())
    a.at(1.0)
    abandon(emptied.at(1.0))
    make_call(env, lambda e: seen.append(("urgent", env.now))).at(1.0, simpy.events.URGENT)
    env.run()
    return seen


def test_calls_and_simpy_events_share_one_order():
    """A ``Call`` enters the clock's queue beside SimPy's own events: at one time and priority,
    in the order scheduled, URGENT first; rescheduled after it ran, it runs again; abandoned
    while pending (a cut run's end), it runs nothing. As SimPy orders its own events."""
    from sim.engine.simpy_clock import ClockEnvironment
    seen = _calls_beside_a_process(ClockEnvironment(), _call, lambda c: c.abandon())
    assert seen == _calls_beside_a_process(simpy.Environment(), _SimpyCall, lambda ev: ev.callbacks.clear())
    assert seen == [("urgent", 1.0), ("a", 1.0), ("process", 1.0), ("a", 1.5), ("process", 1.5)]


def test_calls_keep_simpys_order_beside_its_timeouts():
    """Calls at equal and distinct times and priorities, beside SimPy's own timeouts, some
    scheduled from callbacks: processed in the order SimPy's own loop processes the same events."""
    from sim.engine.simpy_clock import ClockEnvironment

    def order(env, make_call) -> list:
        seen = []
        rng = np.random.default_rng(5)

        def fire(name):
            def fn(_event):
                seen.append((name, env.now))
                if name % 3 == 0 and name < 200:  # reschedule a fresh one from inside the loop
                    make_call(env, fire(name + 1000)).at(float(rng.choice([0.0, 0.25])), int(rng.choice([0, 1])))
            return fn

        for i in range(120):
            make_call(env, fire(i)).at(float(rng.choice([0.0, 0.5, 1.0, 1.25])), int(rng.choice([0, 1])))
            if i % 7 == 0:
                env.timeout(float(rng.choice([0.5, 1.0]))).callbacks.append(lambda e, i=i: seen.append((-i, env.now)))
        env.run()
        return seen

    ours = order(ClockEnvironment(), _call)
    assert len(ours) > 150 and ours == order(simpy.Environment(), _SimpyCall)


def test_an_abandoned_call_stays_queued_and_calls_nothing():
    """``Call.abandon`` (a cut run's end): the pending Call stays in the queue until its time,
    calling nothing; the Call returned calls the same function once scheduled. Abandoning a Call
    that is not pending is refused."""
    from sim.engine.calls import Call
    from sim.engine.clock import Clock
    clock, seen = Clock(), []
    old = Call(clock, lambda e: seen.append(clock.now_s)).at(2.0)
    heir = old.abandon()
    assert heir is not old and not heir.pending and len(clock) == 1
    heir.at(1.0)
    clock.run()
    assert seen == [1.0] and clock.now_s == 2.0  # the abandoned one was processed at 2.0, calling nothing
    with pytest.raises(RuntimeError, match="not pending"):
        old.abandon()


def test_a_pending_call_is_not_scheduled_again():
    from sim.engine.calls import Call
    from sim.engine.clock import Clock
    clock = Clock()
    c = Call(clock, lambda e: None).at(1.0)
    with pytest.raises(RuntimeError, match="pending"):
        c.at(2.0)
    clock.run()
    c.at(0.5)  # after it ran: again
    clock.run()
    assert clock.now_s == 1.5


def test_the_replica_reads_run_cost_values_unless_run_cost_is_overridden():
    """``run_cost_values`` is ``run_cost``'s fields; the replica reads it only from a model
    whose ``run_cost`` is ``RooflineCostModel``'s (an override of ``run_cost`` is obeyed)."""
    from sim.cost.runs import RunCost
    from sim.engine.deployment import build_deployment
    raw = {"name": "rc", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
           "workload": {"synthetic": {"num_requests": 1}}}
    cost = build_deployment(scenario_from_dict(raw)).cost
    fresh = build_deployment(scenario_from_dict(raw)).cost  # its memos empty: a plain tuple costed first
    for b in (Batch(8, 8000, ((300, 0),), 9, 1), Batch(8, 8000, (), 8, 50), Batch(1, 10, (), 1, 1),
              Batch(3, 900, ((512, 1024), (20, 0)), 4, 1)):
        assert fresh.run_cost_values(tuple(b)) == cost.run_cost_values(b)  # a batch read by position
        rc = cost.run_cost(b)
        assert type(rc) is RunCost and rc == RunCost(*cost.run_cost_values(b))
    assert cluster.run_cost_reader(cost) == (cost.run_cost_values, True)

    class Own:
        def run_cost(self, batch):
            return RunCost(1.0, 1.0, 1, False, False)

        def run_cost_values(self, batch):
            raise AssertionError("not this model's run_cost")

    own = Own()
    assert cluster.run_cost_reader(own) == (own.run_cost, False)


def test_a_plans_batch_is_the_general_batch():
    from sim.core.request import Request
    from sim.policies.base import StepPlan
    a, b = Request(0, 0.0, 900, 10), Request(1, 0.0, 300, 10)
    a.prefill_target, b.prefill_target = 900, 300
    plan = StepPlan(3, 40, 40000, 100, chunks=[(a, 400), (b, 300)], chunk_contexts=[500, 0])
    assert plan.batch == Batch(40, 40000, ((400, 500), (300, 0)), 42, 3)  # both complete
    assert type(plan.batch_values()) is tuple and plan.batch_values() == plan.batch
    assert type(plan.batch) is Batch and type(StepPlan(1, 2, 20, 0).batch) is Batch
    assert plan.batch.prefill_tokens == plan.prefill_tokens == 700
    decode = StepPlan(5, 7, 7000, 10)
    assert decode.batch == Batch(7, 7000, (), 7, 5) and decode.batch.num_tokens == 7


@pytest.mark.parametrize("case", ["chunked", "multi-step"])
def test_cost_flags_are_the_process_loops(case, monkeypatch):
    """The cost model's flags reach the recorder as the process loop passed them."""
    raw = _case_raw(case)
    workload = _workload(200, 0.05, 3)
    new = run_scenario(scenario_from_dict(raw), workload=workload)
    monkeypatch.setattr(cluster, "Replica", ProcessReplica)
    monkeypatch.setattr(topology, "Replica", ProcessReplica)
    old = run_scenario(scenario_from_dict(raw), workload=workload)
    assert new.lm_head_extrapolated and new.lm_head_extrapolated == old.lm_head_extrapolated
    assert new.extrapolated_steps == old.extrapolated_steps
    assert new.overhead_outside_seqs == old.overhead_outside_seqs
