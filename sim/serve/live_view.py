"""What ``simsrv serve`` reads of a live simulation: each request's tokens so far, the next
decode-step boundary, the replicas' queues and KV use, and the arrivals it was sent.

Why: the live simulation (sim/live.py) advances a fast-forwarded run of identical decode steps
in one event; a client streaming a request in that run must still get each token at its own
step's end. A run's step times are known when it starts (sim/cost/runs.py ``run_sum_s``), so
the tokens a request in the run has at time t are those of the steps ended by t
(sim/engine/cluster.py ``Replica.steps_ended_by``), without cutting the run: the simulation
stays event for event the one ``simsrv run`` replays.
"""

from __future__ import annotations

import math
from typing import Any

from sim.core.request import Request
from sim.engine.admission_control import REJECTED
from sim.live import LiveSimulation
from sim.scenario import Scenario


class LiveView:
    """A ``LiveSimulation`` of ``scenario`` and the serve-side readings of it."""

    def __init__(self, scenario: Scenario):
        self.sim = LiveSimulation(scenario, on_end=self._ended)
        self.replicas = self.sim.replicas()
        self.num_replicas = len(self.sim.schedulers)
        self.max_model_len = self.sim.max_model_len
        self.frontend_out_s = self.sim.frontend_out_s  # engine token -> client (sim/engine/frontend.py)
        self._ended_rows: dict[int, dict[str, Any]] = {}  # ended, not yet read by the driver
        self._arrival_s: list[float] = []
        self._input: list[int] = []
        self._output: list[int] = []
        self._max_tokens: list[int] = []
        self._priority: list[int] = []
        self._abort_s: list[float] = []  # when a client aborted its request (NaN: never)

    # -- the simulation ----------------------------------------------------------------------
    @property
    def now_s(self) -> float:
        return self.sim.now_s

    def run_until(self, t_s: float) -> None:
        self.sim.run_until(t_s)

    def next_event_s(self) -> float:
        return self.sim.next_event_s()

    def inject(self, input_tokens: int, output_tokens: int, max_tokens: int, priority: int = 0) -> int:
        """A request arriving now that will generate ``output_tokens``, sent with ``max_tokens``
        (what the engine knows of its length: the scheduler never reads ``output_tokens``)."""
        self._arrival_s.append(self.sim.now_s)
        self._input.append(input_tokens)
        self._output.append(output_tokens)
        self._max_tokens.append(max_tokens)
        self._priority.append(priority)
        self._abort_s.append(math.nan)
        rid = len(self._arrival_s) - 1
        got = self.sim.inject(input_tokens, output_tokens, max_tokens=max_tokens, priority=priority)
        assert got == rid, "request ids are given in the order injected"
        return rid

    def abort(self, rid: int, t_s: float) -> None:
        """Request ``rid``'s client went away at simulated time ``t_s`` (the simulation's
        present or later): the simulation aborts it (``LiveSimulation.abort``) and the time is
        recorded with its arrival, so that ``simsrv run`` replays the abort. Where aborts are not
        modelled (``LiveSimulation.can_abort``: disaggregated or data-parallel deployments) the
        request is served to its end, as before aborts were modelled (README, "simsrv serve")."""
        if self.sim.can_abort and self.sim.abort(rid, t_s):
            self._abort_s[rid] = t_s

    def recorded(self) -> tuple[list[float], list[int], list[int], list[int], list[int], list[float]]:
        """Every arrival sent: (simulated time, prompt tokens, tokens it generates, max_tokens,
        priority, abort time or NaN)."""
        return self._arrival_s, self._input, self._output, self._max_tokens, self._priority, self._abort_s

    def rejection(self, rid: int) -> str | None:
        """Admission control's answer to request ``rid``: its reason if it rejected it, '' once
        it was admitted (or ended otherwise), None while the API server still holds it (the
        decision is taken when it reaches the engines: sim/engine/admission_control.py)."""
        row = self._ended_rows.get(rid)
        if row is not None:
            return row["fail_reason"] if row["status"] == REJECTED else ""
        if self.sim.request(rid) is not None:
            return ""
        return None

    def finish(self, reason: str):
        return self.sim.finish(reason)

    # -- readings ------------------------------------------------------------------------------
    def _ended(self, finished: list[Request]) -> None:
        for req in finished:
            self._ended_rows[req.request_id] = {
                "status": req.status, "fail_reason": req.fail_reason, "replica": req.replica,
                "arrival_s": req.arrival_s, "first_scheduled_s": req.first_scheduled_s,
                "first_token_s": req.first_token_s, "finish_s": req.finish_s,
                "prompt_tokens": req.prompt_tokens, "output_tokens": req.output_tokens,
                "num_generated": req.output_tokens if req.status == "completed" else req.num_generated,
                "num_preemptions": req.num_preemptions, "prefix_hit_tokens": req.prefix_hit_tokens,
            }

    def progress(self, rid: int, t_s: float) -> tuple[int, bool, str]:
        """(tokens emitted by ``t_s``, ended, failure reason or "")."""
        row = self._ended_rows.get(rid)
        if row is not None:
            return row["num_generated"], True, row["fail_reason"] if row["status"] != "completed" else ""
        req = self.sim.request(rid)  # None: the front end still holds it
        if req is None:
            return 0, False, ""
        if not req.in_decode or req.replica < 0:
            return req.num_generated, False, ""
        rep = self.replicas[req.replica] if req.replica < len(self.replicas) else None
        sched = self.sim.schedulers[req.replica]
        ds = sched.decode
        n = req.g_join + (ds.steps - req.step_join)
        if rep is not None:
            n += rep.steps_ended_by(t_s)
        return min(n, req.output_tokens), False, ""

    def replica_of(self, rid: int) -> int:
        """The replica request ``rid`` runs (or ran) on; -1 while the front end holds it."""
        row = self._ended_rows.get(rid)
        if row is not None:
            return int(row["replica"])
        req = self.sim.request(rid)
        return -1 if req is None else int(req.replica)

    def request_times(self, rid: int) -> dict[str, Any] | None:
        """An ended request's figures (for the metrics), read once."""
        return self._ended_rows.pop(rid, None)

    def next_token_s(self) -> float:
        """The next decode-step boundary inside a fast-forwarded run, on any replica."""
        t = math.inf
        for rep in self.replicas:
            if rep is not None:
                t = min(t, rep.next_step_end_s(self.sim.now_s))
        return t

    def num_waiting(self) -> int:
        """Requests not yet scheduled: in the front end's queue or a replica's waiting queue."""
        return self.sim.num_at_frontend + sum(len(s.waiting) for s in self.sim.schedulers)

    def gauges(self) -> list[dict[str, float]]:
        """Per replica, vLLM's gauges: requests running, waiting, KV-cache use (a fraction)."""
        out = []
        for s in self.sim.schedulers:
            kv = s.kv
            out.append({"vllm:num_requests_running": float(len(s.running)),
                        "vllm:num_requests_waiting": float(len(s.waiting)),
                        "vllm:kv_cache_usage_perc": (kv.num_blocks - kv.num_free) / kv.num_blocks})
        return out
