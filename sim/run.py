"""``run_scenario``: scenario in, requests and steps out (DESIGN.md section 2)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from sim.cluster import simulate
from sim.deployment import Deployment, build_deployment
from sim.metrics import request_metrics
from sim.router import make_router
from sim.scenario import Scenario
from sim.workload import RequestArrays, build_workload


@dataclass
class RunResult:
    scenario: Scenario
    deployment: Deployment
    workload: RequestArrays
    requests: pl.DataFrame
    steps: pl.DataFrame
    resume_gaps_s: list[float]
    wall_s: float
    peak_kv_blocks: list[int] = field(default_factory=list)


def _request_frame(reqs) -> pl.DataFrame:
    col = {
        "request_id": np.fromiter((r.request_id for r in reqs), np.int64, len(reqs)),
        "arrival_s": np.fromiter((r.arrival_s for r in reqs), np.float64, len(reqs)),
        "first_scheduled_s": np.fromiter((r.first_scheduled_s for r in reqs), np.float64, len(reqs)),
        "first_token_s": np.fromiter((r.first_token_s for r in reqs), np.float64, len(reqs)),
        "finish_s": np.fromiter((r.finish_s for r in reqs), np.float64, len(reqs)),
        "input_tokens": np.fromiter((r.prompt_tokens for r in reqs), np.int64, len(reqs)),
        "output_tokens": np.fromiter((r.output_tokens for r in reqs), np.int64, len(reqs)),
    }
    col["status"] = np.array([r.status for r in reqs], dtype=object)
    m = request_metrics(col)
    frame = pl.DataFrame({
        **{k: col[k] for k in ("request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
                               "input_tokens", "output_tokens")},
        **m,
        "num_preemptions": np.fromiter((r.num_preemptions for r in reqs), np.int64, len(reqs)),
        "replica": np.fromiter((r.replica for r in reqs), np.int64, len(reqs)),
        "status": [r.status for r in reqs],
        "fail_reason": [r.fail_reason for r in reqs],
    }, nan_to_null=False)
    return frame


def run_scenario(scenario: Scenario, progress: Callable[[int, int], None] | None = None,
                 workload: RequestArrays | None = None) -> RunResult:
    """Simulate ``scenario``; ``progress(done, total)`` is called as requests end."""
    t0 = time.perf_counter()
    dep = build_deployment(scenario)
    arrays = workload if workload is not None else build_workload(scenario)
    n = scenario.cluster.replicas
    schedulers = [dep.new_scheduler(scenario.engine.policy) for _ in range(n)]
    costs = [dep.cost] * n
    cb = (lambda done: progress(done, len(arrays))) if progress else None
    reqs, rec = simulate(arrays, schedulers, costs, make_router(scenario.cluster.router), cb)
    steps = pl.DataFrame(rec.step_columns())
    return RunResult(scenario, dep, arrays, _request_frame(reqs), steps, rec.resume_gaps_s,
                     time.perf_counter() - t0, [s.kv.peak_used for s in schedulers])
