"""The disaggregated topology: prefill pool -> KV transfer links -> decode pool.

Why: DistServe/Splitwise-style serving is wiring, not a scheduler mode: prefill replicas run
prompts and emit first tokens; each request's KV (prompt tokens x KV bytes per token) then
crosses its prefill replica's link, shared by concurrent transfers; a decode replica admits
the request only when its KV has arrived and blocks are free, and only then does the prefill
replica release its copy.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from sim.cluster import Replica
from sim.policies.disagg import DecodeScheduler, PrefillScheduler
from sim.recorder import Recorder
from sim.request import Request
from sim.router import RouterFn, least_outstanding
from sim.transfer import SharedLink


class Disaggregated:
    def __init__(self, env: simpy.Environment, prefill: list[PrefillScheduler], prefill_costs: list,
                 decode: list[DecodeScheduler], decode_costs: list, router: RouterFn,
                 kv_bytes_per_token: float, link_bytes_per_s: float, link_latency_s: float,
                 recorder: Recorder, on_finish: Callable[[list[Request]], None],
                 decode_swap_s_per_block: float = 0.0):
        self.env, self.router = env, router
        self.prefill_scheds, self.decode_scheds = prefill, decode
        self.schedulers = [*prefill, *decode]
        self.kv_bytes_per_token = kv_bytes_per_token
        n = len(prefill)
        self.prefill = [Replica(env, i, s, c, recorder, on_finish, on_step=self._drain_handoffs)
                        for i, (s, c) in enumerate(zip(prefill, prefill_costs))]
        self.decode = [Replica(env, n + i, s, c, recorder, on_finish, decode_swap_s_per_block)
                       for i, (s, c) in enumerate(zip(decode, decode_costs))]
        self.links = [SharedLink(link_bytes_per_s, link_latency_s) for _ in prefill]
        self._link_changed = [env.event() for _ in prefill]
        self._owner: dict[int, int] = {}  # request id -> prefill replica holding its KV
        for s in decode:
            s.on_admitted = self._release
        for i in range(n):
            env.process(self._link_loop(i))

    def submit(self, req: Request) -> None:
        reason = self.decode_scheds[0].admission_error(req)
        if reason:  # it could never be decoded: fail it at the door
            req.replica = self.prefill[0].index
            self.decode_scheds[0]._fail(req, self.env.now, reason)
            self.prefill[0].on_finish([req])
            return
        self.prefill[self.router(req, self.prefill_scheds)].submit(req)

    # -- prefill -> link ------------------------------------------------------------------------
    def _drain_handoffs(self, replica: Replica) -> None:
        sched = replica.scheduler
        if not sched.handoffs:
            return
        now = self.env.now
        for req in sched.handoffs:
            d = least_outstanding(req, self.decode_scheds)
            self.decode_scheds[d].incoming += 1
            req.replica = self.decode[d].index
            self._owner[req.request_id] = replica.index
            req.transfer_start_s = now
            self.links[replica.index].start((req, d), req.prompt_tokens * self.kv_bytes_per_token, now)
        sched.handoffs.clear()
        ev = self._link_changed[replica.index]
        if not ev.triggered:
            ev.succeed()

    def _link_loop(self, i: int):
        env, link = self.env, self.links[i]
        while True:
            due = link.next_done_s()
            if due is None:
                yield self._link_changed[i]
            else:
                yield env.any_of([env.timeout(max(0.0, due - env.now)), self._link_changed[i]])
            if self._link_changed[i].triggered:
                self._link_changed[i] = env.event()
            for req, d in link.pop_done(env.now):
                env.timeout(link.latency_s).callbacks.append(lambda _e, r=req, d=d: self._deliver(r, d))

    def _deliver(self, req: Request, d: int) -> None:
        req.transfer_end_s = self.env.now
        self.decode_scheds[d].add_transferred(req)
        self.decode[d].notify()

    # -- decode admitted: prefill side frees its copy ------------------------------------------
    def _release(self, req: Request) -> None:
        p = self._owner.pop(req.request_id)
        self.prefill_scheds[p].release_handoff(req)
        self.prefill[p].notify()
