"""Queueing theory: with a constant step cost and one request at a time, the replica is an
M/D/1 queue, whose mean wait is rho * D / (2 * (1 - rho)) (Pollaczek-Khinchine formula)."""

import numpy as np
import pytest

from sim.core.batch import Batch
from sim.engine.cluster import simulate
from sim.cost.runs import RunCost
from sim.core.kv import KVBlockManager
from sim.policies import EngineLimits
from sim.policies.continuous import ContinuousScheduler
from sim.engine.router import make_router
from sim.workload.arrays import RequestArrays
from sim.workload.synthetic import arrival_times_s


class ConstantCost:
    def __init__(self, d_s: float):
        self.d_s = d_s

    def run_cost(self, batch: Batch) -> RunCost:
        return RunCost(self.d_s, self.d_s, batch.num_steps, False, False)

    def overhead_s(self, num_seqs: int) -> float:
        return 0.0

    def prefill_alone_s(self, tokens: int, context_tokens: int, completing: bool) -> float:
        return self.d_s


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_mean_wait(rho):
    d_s, n = 0.1, 60_000
    rng = np.random.default_rng(7)
    arrival = arrival_times_s(rng, n, rho / d_s, 1.0)
    w = RequestArrays(arrival, np.full(n, 100), np.ones(n, dtype=np.int64))  # one step each
    sched = ContinuousScheduler(EngineLimits(max_num_seqs=1), KVBlockManager(10_000, 16))
    reqs, _ = simulate(w, [sched], [ConstantCost(d_s)], make_router("round_robin"))
    wait = np.array([r.first_scheduled_s - r.arrival_s for r in reqs])
    theory = rho * d_s / (2 * (1 - rho))
    assert wait.mean() == pytest.approx(theory, rel=0.05)
    # the TTFT decomposition puts all of it in waiting for the batch slot, the rest in prefill
    assert np.array([r.ttft_wait_batch_s for r in reqs]) == pytest.approx(wait, abs=1e-9)
    assert np.array([r.ttft_prefill_s for r in reqs]) == pytest.approx(d_s, rel=1e-9)
