"""Data-parallel attention with expert parallelism: D engine cores stepping in lockstep.

Why: vLLM ``--data-parallel-size D --enable-expert-parallel`` runs D engine cores, each with
its own scheduler and KV cache and attention at its own TP, while every MoE layer spans all of
them (the all-to-all: sim/cost/dp_ep.py). The MoE layers are collective, so the cores step
together: while any core has work (a DP "wave", vLLM's DP coordinator), a core with nothing
scheduled runs a dummy batch (``EngineCore.execute_dummy_batch``: a 1-token forward pass) so
that the others' collectives complete; when none has work, all idle.

One group round: every rank plans its step (a normal scheduler: sim/policies/); the round
lasts the slowest rank's step, each rank costed on its own batch while the group's tokens
(dummy ones included) share the experts (``DataParallelEPCostModel.group_run_cost``); then
every rank applies its plan at the round's end. So a busy rank slows an idle one and a long
prefill on one rank stalls every rank's decodes. Requests go to ranks through the scenario's
router over all ranks (vLLM's internal DP load balancer sends each request to the least loaded
engine core: ``least_outstanding``, the default).

Each round is one step: the ranks' fast-forwarded decode runs are capped at one step
(``max_run_steps`` 1), since a lockstep round's time is the max over ranks and their runs have
no common length. This is exact and costs one event per step (a decode-heavy run takes
roughly as many events as it has decode steps, where a single replica fast-forwards them).
The step log has one row per rank that ran a batch in the round (dummy batches are not
logged), each with the round's duration.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from sim.core.batch import Batch
from sim.core.request import Request
from sim.core.ttft import SoloPrefill, TTFTAccounting
from sim.engine.deployment import build_deployment
from sim.engine.recorder import Recorder
from sim.engine.router import RouterFn
from sim.engine.topology import ColocatedLayout, _capped, _router
from sim.policies.base import Scheduler

# vLLM EngineCore.execute_dummy_batch: a forward pass of one token (model_runner._dummy_run(1))
DUMMY_BATCH = Batch(num_decode_seqs=1, decode_context_tokens=1)


def round_s(cost, batches: list[Batch | None], extra_s: list[float] | None = None) -> tuple[float, list]:
    """(seconds of one lockstep round, each rank's ``RunCost`` or None for a dummy batch):
    the slowest rank's step (plus its ``extra_s``), every rank's batch (an idle one's dummy)
    counted in the group's routed tokens; with CUDA graphs every rank padded to the round's
    most tokens (vLLM ``get_dp_padding``, sim/cost/dp_ep.py)."""
    real = [b.num_tokens if b is not None else DUMMY_BATCH.num_tokens for b in batches]
    pad = max(real) if cost.pads_to_max else 0
    group_tokens = pad * len(batches) if pad else sum(real)
    costs = [cost.group_run_cost(b if b is not None else DUMMY_BATCH, group_tokens, pad) for b in batches]
    extra = extra_s or [0.0] * len(batches)
    return (max(c.first_s + x for c, x in zip(costs, extra)),
            [c if b is not None else None for c, b in zip(costs, batches)])


class DataParallelGroup:
    """``len(schedulers)`` ranks of one replica, stepping together."""

    def __init__(self, env: simpy.Environment, first_index: int, schedulers: list[Scheduler], cost,
                 recorder: Recorder, on_finish: Callable[[list[Request]], None], swap_s_per_block: float = 0.0):
        self.env, self.first_index, self.schedulers, self.cost = env, first_index, schedulers, cost
        self.recorder, self.on_finish, self.swap_s_per_block = recorder, on_finish, swap_s_per_block
        solo = SoloPrefill(cost)
        self.ttft = [TTFTAccounting(cost, solo) for _ in schedulers]  # each rank's plans and steps observed
        self._wake: simpy.Event | None = None
        self.process = env.process(self._loop())

    def submit(self, rank: int, req: Request) -> None:
        req.replica = self.first_index + rank
        if not self.schedulers[rank].add_request(req, self.env.now):
            self.on_finish([req])
            return
        self.ttft[rank].on_arrival(req, self.env.now)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _loop(self):
        env, rec = self.env, self.recorder
        while True:
            now = env.now
            plans = [s.schedule(now) for s in self.schedulers]
            for ttft, p in zip(self.ttft, plans):
                ttft.on_schedule(p, now)
            if all(p.idle for p in plans):
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            # NOTE: a rank's PCIe swap copies are serialised with its step (as sim/engine/cluster.py)
            dur, costs = round_s(self.cost, [None if p.idle else p.batch for p in plans],
                                 [0.0 if p.idle else p.swap_blocks * self.swap_s_per_block for p in plans])
            start = env.now
            yield env.timeout(dur)
            for r, (sched, plan, rc) in enumerate(zip(self.schedulers, plans, costs)):
                if plan.idle:
                    continue
                index = self.first_index + r
                if self.ttft[r].concerns(plan):
                    self.ttft[r].on_step(plan, env.now, dur)
                rec.count_cost(index, rc.extrapolated, rc.lm_head_extrapolated, rc.overhead_outside_seqs, 1)
                kv_used = sched.kv.num_used
                finished = sched.on_step_done(plan, env.now, 1)
                rec.step((index, start, dur, 1, plan.num_decode_seqs + len(plan.chunks), plan.prefill_tokens,
                          plan.num_decode_seqs, kv_used, len(sched.waiting), dur, dur, 0))
                rec.lengthen_gaps(dur, plan.ready_gaps_s, plan.pause_extras)
                if finished:
                    self.on_finish(finished)


class DataParallelGroups:
    """``cluster.replicas`` groups of ``data_parallel_size`` ranks; the router picks a rank."""

    def __init__(self, env: simpy.Environment, schedulers: list[Scheduler], dp: int, cost, router: RouterFn,
                 recorder: Recorder, on_finish: Callable[[list[Request]], None], swap_s_per_block: float = 0.0):
        self.schedulers, self.dp, self.router = schedulers, dp, router
        self.groups = [DataParallelGroup(env, g * dp, schedulers[g * dp:(g + 1) * dp], cost, recorder, on_finish,
                                         swap_s_per_block) for g in range(len(schedulers) // dp)]

    def submit(self, req: Request) -> None:
        i = self.router(req, self.schedulers)
        self.groups[i // self.dp].submit(i % self.dp, req)


class DataParallelLayout(ColocatedLayout):
    """``cluster.replicas`` x ``data_parallel_size`` engine cores of ``tensor_parallel_size``
    GPUs each; a replica's cores step in lockstep (``DataParallelGroup``)."""

    @property
    def num_replicas(self) -> int:
        return super().num_replicas * self.scenario.cluster.data_parallel_size

    @property
    def num_gpus(self) -> int:
        return super().num_gpus * self.scenario.cluster.data_parallel_size

    def build(self, max_run_steps: int | None = None) -> Callable:
        s = self.scenario
        dep = _capped(build_deployment(s), 1)  # one step per lockstep round (module docstring)
        self.pools = [("replica", dep)]
        dp = s.cluster.data_parallel_size
        n = s.cluster.replicas * dp
        self.schedulers = [dep.new_scheduler(s.engine.policy) for _ in range(n)]
        router = _router(s, n)
        return lambda env, rec, on_finish: DataParallelGroups(env, self.schedulers, dp, dep.cost, router, rec,
                                                              on_finish, dep.swap_s_per_block)
