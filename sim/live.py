"""``LiveSimulation``: a scenario's cluster run as time goes, its requests injected while it runs.

Why: a simulated HTTP endpoint (a live ``serve``) does not know its requests in advance: it
runs the simulation up to the simulated time a request comes in (``run_until``), sends it
there (``inject``), and reads the clock and the next event's time to pace itself. The loop is
the one every run uses (sim/engine/cluster.py ``Simulation`` on sim/engine/clock.py's clock):
a run whose arrivals are all injected one by one at their times gives, request for request and
step for step, what the same arrivals give replayed from a trace (tests/test_live_loop.py).
The one difference is an exact tie: ``run_until(t)`` processes every event due at ``t`` before
a request injected at ``t``, where a trace's arrival at ``t`` comes after only the events at
``t`` scheduled before its own wait began.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from sim.core.request import ABORTED, Request, end_aborted
from sim.engine.admission_control import AdmissionControl
from sim.engine.arrivals import NO_ABORT
from sim.engine.calls import Call
from sim.engine.cluster import Replica, Simulation
from sim.engine.columns import ColumnBuffer
from sim.engine.deployment import engine_profile
from sim.engine.frontend import Frontend, LiveEntryQueue
from sim.engine.results import RequestResults
from sim.engine.topology import layout_for
from sim.errors import UserError
from sim.run import RunResult, run_result
from sim.scenario import Scenario
from sim.workload.build import closed_loop

# the failure reason of a request still in flight when the live run finishes
IN_FLIGHT_AT_FINISH = "still in flight when the live simulation finished"


class LiveSimulation:
    """``scenario``'s cluster (its workload is not used: requests come by ``inject``), at
    simulated time ``now_s`` (0 to begin with)."""

    def __init__(self, scenario: Scenario, max_run_steps: int | None = None,
                 on_end: Callable[[list[Request]], None] | None = None):
        """``on_end`` (if given) sees each request as it ends (completed, or failed with a reason)."""
        if closed_loop(scenario)[0] is not None:
            raise UserError("workload.synthetic.max_concurrency: a live simulation's clients send its "
                            "requests (inject); a closed loop cannot run live")
        self.scenario = scenario
        self._t0 = time.perf_counter()
        self._layout = layout_for(scenario)
        self._results = RequestResults()
        self._in_flight: dict[int, Request] = {}
        self._on_end = on_end
        # the serving front end (sim/engine/frontend.py), as run_scenario applies it: a request
        # reaches the engine when the API server hands it over (``inject`` schedules that)
        self._frontend = Frontend.of(engine_profile(scenario.engine), scenario.engine.stream_interval)
        self._entries = LiveEntryQueue()
        # the time of the last hand-off's event: the replayed arrival process's ``now`` (0: its start)
        self._handoff_s = 0.0
        self._spent_in = ColumnBuffer(("frontend_in_s",)) if self._frontend is not None else None
        # id -> (entry time, prompt, output, max_tokens, priority) of those the front end still holds
        self._at_frontend: dict[int, tuple[float, int, int, int, int]] = {}
        # id -> abort time of those aborted while the front end held them (``abort``)
        self._frontend_aborts: dict[int, float] = {}
        self._aborts_sent: set[int] = set()  # ids aborted (``abort``), ended or not yet
        self._next_id = 0
        self._sim = Simulation([], topology=self._layout.build(max_run_steps), results=self._results,
                               on_end=self._ended, admission=AdmissionControl.of(scenario.admission_control))
        self._finished = False

    @property
    def schedulers(self) -> list:
        """Each replica's scheduler, by replica index (its queues, its KV manager)."""
        return self._sim.topology.schedulers

    def replicas(self) -> list[Replica | None]:
        """Each replica's loop by replica index (None where replicas step in lockstep groups:
        data parallelism, whose steps are single)."""
        topo = self._sim.topology
        loops = getattr(topo, "replicas", None) or [*getattr(topo, "prefill", []), *getattr(topo, "decode", [])]
        by_index: list[Replica | None] = [None] * len(self.schedulers)
        for rep in loops:
            by_index[rep.index] = rep
        return by_index

    @property
    def max_model_len(self) -> int:
        """The longest prompt plus output a request may have (vLLM's ``max_model_len``)."""
        return self._layout.deployment.limits.max_model_len

    @property
    def num_at_frontend(self) -> int:
        """Requests injected that the API server has not yet handed to the engine (nor aborted)."""
        return len(self._at_frontend) - len(self._frontend_aborts)

    def request(self, request_id: int) -> Request | None:
        """The request with this id while it is in flight (None once it has ended)."""
        return self._in_flight.get(request_id)

    @property
    def now_s(self) -> float:
        """The simulated clock."""
        return self._sim.clock.now_s

    def next_event_s(self) -> float:
        """When the next event is due (``inf``: nothing will happen until a request comes)."""
        return self._sim.clock.next_event_s()

    def run_until(self, t_s: float) -> None:
        """Run every event due at or before ``t_s``; the clock is then ``t_s`` and later events
        wait. A fast-forwarded run of decode steps spanning ``t_s`` is not cut by this: only an
        arrival injected during it cuts it (at the step boundary after, as in any run)."""
        self._check_open()
        # (the cyclic collector paused as in run_scenario: millions of acyclic objects)
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._sim.clock.run_until(t_s)
        finally:
            if was_enabled:
                gc.enable()

    def inject(self, input_tokens: int, output_tokens: int, hash_ids: Any = None,
               hash_block_size: int = 16, max_tokens: int = 0, priority: int = 0) -> int:
        """A request arriving now (``now_s``) with ``input_tokens`` prompt tokens that will
        produce ``output_tokens``; optional prompt block-hash ids for prefix caching, and its
        priority (vLLM's request ``priority``). Returns its request id (0, 1, ... in the order
        injected)."""
        self._check_open()
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"inject: {name} must be a positive integer, got {value!r}")
        rid = self._next_id
        self._next_id += 1
        fe = self._frontend
        if fe is None:
            self._enter(input_tokens, output_tokens, hash_ids, hash_block_size, max_tokens, priority)
            return rid
        # the API server's input side: one request at a time, first come first served, so the
        # engine sees requests in the order injected and numbers them so (``_enter``)
        now = self.now_s
        entry = self._entries.entry(now, float(fe.input_s(np.array([input_tokens]))[0]))
        self._spent_in.add_block(np.array([[entry - now]]))
        self._at_frontend[rid] = (entry, input_tokens, output_tokens, max_tokens, priority)
        # when ``simsrv run`` sends it, to the bit: its arrival process (sim/engine/arrivals.py
        # ``_send``) waits from the previous arrival's event time ``prev`` with ``at_from(prev,
        # entry - prev)``, which may miss ``entry`` by a rounding, and the request arrives at
        # ``entry`` itself (``arrival_s``); never before the clock (a miss below it, at most one
        # rounding, only where the front end's time is under one)
        prev = self._handoff_s
        fire = prev + (entry - prev)
        self._handoff_s = fire = fire if fire >= now else now
        clock = self._sim.clock
        Call(clock, lambda _e: self._enter(input_tokens, output_tokens, hash_ids, hash_block_size, max_tokens,
                                           priority, entry)).at_time(fire)
        return rid

    def _enter(self, input_tokens: int, output_tokens: int, hash_ids: Any, hash_block_size: int,
               max_tokens: int, priority: int, arrival_s: float = NO_ABORT) -> None:
        """A request reaches the engine now (through admission control, where configured); one
        aborted while the API server held it ends as aborted here instead (``abort``), as a
        replayed one does (sim/engine/arrivals.py)."""
        arrivals = self._sim.arrivals
        aborted_s = self._frontend_aborts.pop(arrivals.sent, NO_ABORT)  # (the front end keeps their order)
        req = arrivals.inject(input_tokens, output_tokens, hash_ids, hash_block_size, max_tokens, priority,
                              aborted_s, arrival_s)
        self._at_frontend.pop(req.request_id, None)
        if req.status not in ("completed", "failed", "rejected", ABORTED):  # (ended at the door already)
            self._in_flight[req.request_id] = req

    @property
    def can_abort(self) -> bool:
        """Whether ``abort`` is modelled for this deployment's topology (colocated replicas; not
        disaggregated prefill/decode pools nor data-parallel groups)."""
        return hasattr(self._sim.topology, "abort")

    def abort(self, request_id: int, t_s: float) -> bool:
        """Request ``request_id``'s client aborts it at simulated time ``t_s`` (not before the
        clock: the run goes on to ``t_s`` first). Held by the API server still, it ends as
        aborted when the front end would have handed it over (its abort time its finish); in
        the engine, it ends at the replica's next step boundary (sim/engine/cluster.py
        ``Replica.abort``: vLLM's engine core takes aborts between steps), its KV freed.
        A trace's ``abort_s`` column replays it (``simsrv run``) to the same results. False if
        the request has ended already (or was aborted before)."""
        self._check_open()
        if t_s < self.now_s:
            raise ValueError(f"abort at {t_s} s, before the simulated clock's {self.now_s} s")
        self.run_until(t_s)
        if request_id in self._aborts_sent:
            return False
        if request_id in self._at_frontend:
            self._frontend_aborts[request_id] = t_s
        else:
            req = self._in_flight.get(request_id)
            if req is None:
                return False
            self._sim.abort(req)
        self._aborts_sent.add(request_id)
        return True

    @property
    def frontend_out_s(self) -> float:
        """Seconds from a token's emission by the engine to the client (one token a chunk:
        ``Frontend.first_out_s``); 0 without a front end."""
        fe = self._frontend
        return float(fe.first_out_s(np.array([1]))[0]) if fe is not None else 0.0

    def finish(self, reason: str = IN_FLIGHT_AT_FINISH) -> RunResult:
        """End the run now: each request still in flight is counted failed (with ``reason``) at
        the clock's time, or aborted if its client aborted it (``abort``); the result of the run
        so far."""
        self._check_open()
        self._finished = True
        now = self.now_s
        for rid, (entry, n_in, n_out, max_tokens, priority) in self._at_frontend.items():  # not yet handed to the engine
            self._in_flight[rid] = Request(rid, entry, n_in, n_out, max_tokens, priority)
        self._at_frontend.clear()
        left = [self._in_flight[k] for k in sorted(self._in_flight)]
        for req in left:
            aborted_s = self._frontend_aborts.get(req.request_id)
            if aborted_s is not None:  # aborted while the front end held it: as it would end (``_enter``)
                end_aborted(req, aborted_s)
                continue
            if req.request_id in self._aborts_sent:  # aborted, its replica's next step boundary not yet come
                end_aborted(req, now)
                continue
            req.status, req.fail_reason, req.finish_s = "failed", reason, now
        self._frontend_aborts.clear()
        self._in_flight.clear()
        if left:
            self._results.add(left)
        rec = self._sim.close()
        self._results.sent = self._next_id  # (those the front end still held were never sent to the engine)
        return run_result(self.scenario, self._layout, self._results, rec, None, time.perf_counter() - self._t0,
                          self._frontend, self._spent_in)

    def _ended(self, finished: list[Request]) -> None:
        for req in finished:
            self._in_flight.pop(req.request_id, None)
        if self._on_end is not None:
            self._on_end(finished)

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("the live simulation has finished")
