"""What a scenario deploys (a layout the rest asks) and the disaggregated wiring in SimPy.

Why: a colocated cluster (replicas that each prefill and decode) and a disaggregated one
(DistServe/Splitwise: prefill pool -> KV transfer links -> decode pool) differ in GPUs,
deployments, schedulers and wiring; ``layout_for(scenario)`` answers those questions so that
run, summary, sweep and diagnose never test the policy's name.

Disaggregated wiring: prefill replicas run prompts; each request's KV (prompt tokens x KV
bytes per token) then leaves through its prefill replica's NIC and enters through its decode
replica's NIC, both shared by concurrent transfers (sim/engine/link.py); a decode replica admits
the request only when its KV has arrived and blocks are free, and only then does the prefill
replica release its copy. ``first_token: prefill`` (DistServe's convention) emits the first
token at the end of the prefill; ``first_token: decode`` (vLLM's P/D serving: a proxy sends
the request to a prefill instance with max_tokens 1, the decode instance pulls the KV through
its KV connector and produces the first token the client sees) emits it at the end of the
decode replica's first step with the request, so TTFT includes the transfer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import simpy

from sim.engine.cluster import Colocated, Replica
from sim.engine.deployment import Deployment, build_deployment
from sim.policies import get_policy
from sim.policies.disagg import DecodeScheduler, PrefillScheduler
from sim.engine.recorder import Recorder
from sim.core.request import Request
from sim.engine.router import RouterFn, least_outstanding, make_router
from sim.scenario import Disaggregation, Scenario
from sim.engine.link import LinkNetwork, layerwise_presend_bytes


def _capped(dep: Deployment, max_run_steps: int | None) -> Deployment:
    """``dep`` with fast-forwarded decode runs capped at ``max_run_steps`` (None: as is)."""
    if max_run_steps is None:
        return dep
    return replace(dep, limits=replace(dep.limits, max_run_steps=max_run_steps))


def _router(s: Scenario, num_replicas: int) -> RouterFn:
    c = s.cluster
    return make_router(c.router, num_replicas, s.seed, c.cache_aware)


class ColocatedLayout:
    """``cluster.replicas`` replicas of ``cluster.tensor_parallel_size`` GPUs each."""

    def __init__(self, s: Scenario):
        self.scenario = s
        self.pools: list[tuple[str, Deployment]] = []  # filled by build()
        self.schedulers: list = []

    @property
    def num_replicas(self) -> int:
        return self.scenario.cluster.replicas

    @property
    def num_gpus(self) -> int:
        c = self.scenario.cluster
        return c.replicas * c.tensor_parallel_size * c.pipeline_parallel_size

    def add_capacity(self) -> tuple[str, list[str]]:
        """The one-replica-more change (description, ``--set`` overrides)."""
        n = self.scenario.cluster.replicas + 1
        return f"one more replica ({n})", [f"cluster.replicas={n}"]

    @property
    def deployment(self) -> Deployment:
        """The replica (the decode pool's, when disaggregated)."""
        return self.pools[-1][1]

    def build(self, max_run_steps: int | None = None) -> Callable:
        """Deployments and schedulers; returns the topology factory ``simulate`` wires.
        ``max_run_steps`` caps fast-forwarded decode runs (sim/run.py ``run_scenario``)."""
        s = self.scenario
        dep = _capped(build_deployment(s), max_run_steps)
        self.pools = [("replica", dep)]
        n = s.cluster.replicas
        self.schedulers = [dep.new_scheduler(s.engine.policy) for _ in range(n)]
        router = _router(s, n)
        return lambda env, rec, on_finish: Colocated(env, self.schedulers, [dep.cost] * n, router, rec, on_finish,
                                                     dep.swap_s_per_block)

    def transfer_stats(self) -> dict:
        return {}


class DisaggregatedLayout(ColocatedLayout):
    """``disaggregation.prefill`` and ``decode`` pools; a pool's ``tensor_parallel_size`` and
    ``gpu`` default to the cluster's (``cluster.tensor_parallel_size``, ``hardware.gpu``)."""

    def __init__(self, s: Scenario):
        super().__init__(s)
        self.spec = s.disaggregation or Disaggregation()
        self.topology: Disaggregated | None = None

    def _tp(self, pool) -> int:
        return pool.tensor_parallel_size or self.scenario.cluster.tensor_parallel_size

    @property
    def num_replicas(self) -> int:
        return self.spec.prefill.replicas + self.spec.decode.replicas

    @property
    def num_gpus(self) -> int:
        """Pool replicas times their tensor_parallel_size: a pool replica is one pipeline stage
        (``cluster.pipeline_parallel_size`` > 1 with pools is refused by the scenario check)."""
        p, d = self.spec.prefill, self.spec.decode
        return p.replicas * self._tp(p) + d.replicas * self._tp(d)

    def add_capacity(self) -> tuple[str, list[str]]:
        n = self.spec.prefill.replicas + 1
        return f"one more prefill replica ({n})", [f"disaggregation.prefill.replicas={n}"]

    def build(self, max_run_steps: int | None = None) -> Callable:
        s, d = self.scenario, self.spec
        pdep = _capped(build_deployment(s, d.prefill.gpu, self._tp(d.prefill), "disaggregation.prefill"),
                       max_run_steps)
        ddep = _capped(build_deployment(s, d.decode.gpu, self._tp(d.decode), "disaggregation.decode"),
                       max_run_steps)
        self.pools = [("prefill", pdep), ("decode", ddep)]
        on_decode = d.first_token == "decode"
        prefill = [pdep.new_scheduler(PrefillScheduler) for _ in range(d.prefill.replicas)]
        decode = [ddep.new_scheduler(DecodeScheduler) for _ in range(d.decode.replicas)]
        for sched in prefill:
            sched.first_token_on_decode = on_decode
        self.schedulers = [*prefill, *decode]
        router = _router(s, d.prefill.replicas)
        t = d.kv_transfer
        if t.bandwidth_gb_per_s is not None:
            egress = t.bandwidth_gb_per_s * 1e9
            ingress = (t.decode_bandwidth_gb_per_s or t.bandwidth_gb_per_s) * 1e9
        else:  # the pools' placement: NVLink within one node, else the network (sim/spec/nodes.py)
            egress, ingress = s._kv_links_bytes_per_s(d)
            if t.decode_bandwidth_gb_per_s is not None:
                ingress = t.decode_bandwidth_gb_per_s * 1e9
        link = Links(egress, ingress, t.latency_ms / 1e3, pdep.model.num_layers if t.layerwise else 1)

        def factory(env, rec, on_finish):
            self.topology = Disaggregated(env, prefill, [pdep.cost] * len(prefill), decode,
                                          [ddep.cost] * len(decode), router,
                                          ddep.model.kv_bytes_per_token(ddep.kv_dtype_bytes), link, rec, on_finish,
                                          ddep.swap_s_per_block)
            return self.topology

        return factory

    def transfer_stats(self) -> dict:
        net = self.topology.network
        return {"bytes": net.bytes_sent, "count": net.num_transfers}


def layout_for(s: Scenario) -> ColocatedLayout:
    """The layout of ``s``: pools when its policy runs as pools (the policy registry's ``pools``);
    lockstep data-parallel groups with ``cluster.data_parallel_size`` > 1 (sim/engine/dp_group.py)."""
    if s.cluster.data_parallel_size > 1:
        from sim.engine.dp_group import DataParallelLayout  # it builds on this module's layouts
        return DataParallelLayout(s)
    return DisaggregatedLayout(s) if get_policy(s.engine.policy).pools else ColocatedLayout(s)


class Links:
    """The KV links of a disaggregated cluster: each prefill replica's egress and each decode
    replica's ingress bandwidth, a per-transfer latency, and the layers a layer-wise transfer
    is pipelined over (1: the KV is sent after the prefill step)."""

    def __init__(self, egress_bytes_per_s: float, ingress_bytes_per_s: float, latency_s: float,
                 layers: int = 1):
        self.egress_bytes_per_s, self.ingress_bytes_per_s = egress_bytes_per_s, ingress_bytes_per_s
        self.latency_s, self.layers = latency_s, layers


class Disaggregated:
    def __init__(self, env: simpy.Environment, prefill: list[PrefillScheduler], prefill_costs: list,
                 decode: list[DecodeScheduler], decode_costs: list, router: RouterFn,
                 kv_bytes_per_token: float, links: Links, recorder: Recorder,
                 on_finish: Callable[[list[Request]], None], decode_swap_s_per_block: float = 0.0):
        self.env, self.router = env, router
        self.prefill_scheds, self.decode_scheds = prefill, decode
        self.schedulers = [*prefill, *decode]
        self.kv_bytes_per_token = kv_bytes_per_token
        self.layers = links.layers
        n = len(prefill)
        self.prefill = [Replica(env, i, s, c, recorder, on_finish, on_step=self._drain_handoffs)
                        for i, (s, c) in enumerate(zip(prefill, prefill_costs))]
        self.decode = [Replica(env, n + i, s, c, recorder, on_finish, decode_swap_s_per_block)
                       for i, (s, c) in enumerate(zip(decode, decode_costs))]
        self.network = LinkNetwork([links.egress_bytes_per_s] * n, [links.ingress_bytes_per_s] * len(decode),
                                   links.latency_s)
        self._changed = env.event()
        self._owner: dict[int, int] = {}  # request id -> prefill replica holding its KV
        for s in decode:
            s.on_admitted = self._release
        env.process(self._link_loop())

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
        now, net = self.env.now, self.network
        for req in sched.handoffs:
            d = least_outstanding(req, self.decode_scheds)
            self.decode_scheds[d].incoming += 1
            req.replica = self.decode[d].index
            self._owner[req.request_id] = replica.index
            req.transfer_start_s = now
            num_bytes = req.prompt_tokens * self.kv_bytes_per_token
            net.start((req, d), replica.index, d, num_bytes, now)
            if self.layers > 1:  # layers sent while the step computed the later ones
                net.credit((req, d), layerwise_presend_bytes(num_bytes, self.layers, replica.last_step_s,
                                                             net.rate_of((req, d))))
        sched.handoffs.clear()
        if not self._changed.triggered:
            self._changed.succeed()

    def _link_loop(self):
        env, net = self.env, self.network
        while True:
            due = net.next_done_s()
            if due is None:
                yield self._changed
            else:
                yield env.any_of([env.timeout(max(0.0, due - env.now)), self._changed])
            if self._changed.triggered:
                self._changed = env.event()
            for req, d in net.pop_done(env.now):
                env.timeout(net.latency_s).callbacks.append(lambda _e, r=req, d=d: self._deliver(r, d))

    def _deliver(self, req: Request, d: int) -> None:
        req.transfer_end_s = self.env.now
        self.decode_scheds[d].add_transferred(req)
        self.decode[d].notify()

    # -- decode admitted (its wait recorded by the decode scheduler): the prefill side frees its copy
    def _release(self, req: Request) -> None:
        p = self._owner.pop(req.request_id)
        self.prefill_scheds[p].release_handoff(req)
        self.prefill[p].notify()
