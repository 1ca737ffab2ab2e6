"""``run_scenario``: scenario in, requests and steps out (DESIGN.md section 2)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from sim.cluster import simulate
from sim.deployment import Deployment, build_deployment
from sim.metrics import request_metrics
from sim.router import make_router
from sim.policies.disagg import DecodeScheduler, PrefillScheduler
from sim.scenario import Disaggregation, Scenario
from sim.topology import Disaggregated
from sim.ttft import TTFT_PARTS
from sim.workload import RequestArrays, build_workload


@dataclass
class RunResult:
    scenario: Scenario
    deployment: Deployment          # the replica (the decode pool's, when disaggregated)
    workload: RequestArrays
    requests: pl.DataFrame
    steps: pl.DataFrame
    resume_gaps_s: list[float]
    wall_s: float
    schedulers: list = field(default_factory=list)
    itl_adjust: list[tuple[float, float]] = field(default_factory=list)
    transfers: dict = field(default_factory=dict)

    @property
    def peak_kv_usage(self) -> float:
        return max((s.kv.peak_used / s.kv.num_blocks for s in self.schedulers), default=0.0)


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
        "prefix_hit_tokens": np.fromiter((r.prefix_hit_tokens for r in reqs), np.int64, len(reqs)),
        "kv_transfer_s": np.fromiter((r.transfer_end_s - r.transfer_start_s for r in reqs), np.float64, len(reqs)),
        "decode_wait_s": np.fromiter((r.decode_wait_s for r in reqs), np.float64, len(reqs)),
        "decode_rounds_waited": np.fromiter((r.decode_rounds_waited for r in reqs), np.int64, len(reqs)),
        **{part: np.fromiter((getattr(r, part) for r in reqs), np.float64, len(reqs)) for part in TTFT_PARTS},
        "status": [r.status for r in reqs],
        "fail_reason": [r.fail_reason for r in reqs],
    }, nan_to_null=False)
    return frame


def _disaggregated(scenario: Scenario, router):
    """Schedulers and a topology factory for ``policy: disaggregated``."""
    d = scenario.disaggregation or Disaggregation()
    pdep = build_deployment(scenario, d.prefill.gpu, d.prefill.tensor_parallel_size, "disaggregation.prefill")
    ddep = build_deployment(scenario, d.decode.gpu, d.decode.tensor_parallel_size, "disaggregation.decode")
    prefill = [pdep.new_scheduler(PrefillScheduler) for _ in range(d.prefill.replicas)]
    decode = [ddep.new_scheduler(DecodeScheduler) for _ in range(d.decode.replicas)]
    kv_bytes_per_token = ddep.model.kv_bytes_per_token(ddep.kv_dtype_bytes)

    def factory(env, rec, on_finish):
        topo = Disaggregated(env, prefill, [pdep.cost] * len(prefill), decode, [ddep.cost] * len(decode),
                             router, kv_bytes_per_token, d.kv_transfer.bandwidth_gb_per_s * 1e9,
                             d.kv_transfer.latency_ms / 1e3, rec, on_finish, ddep.swap_s_per_block)
        factory.topology = topo
        return topo

    factory.prefill_deployment = pdep
    return ddep, [*prefill, *decode], factory


def run_scenario(scenario: Scenario, progress: Callable[[int, int], None] | None = None,
                 workload: RequestArrays | None = None) -> RunResult:
    """Simulate ``scenario``; ``progress(done, total)`` is called as requests end.

    The cyclic garbage collector is paused meanwhile: the run builds millions of acyclic
    objects, and each full collection would rescan all live requests and step records (25-30%
    of the wall time at 100k requests; see sim/cluster.py and bench/README.md)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(scenario, progress, workload)
    finally:
        if was_enabled:
            gc.enable()


def _run(scenario: Scenario, progress, workload: RequestArrays | None) -> RunResult:
    t0 = time.perf_counter()
    router = make_router(scenario.cluster.router)
    from sim.workload.build import closed_loop, should_stream, stream_workload

    streamed = workload is None and should_stream(scenario)  # a large trace is read chunk by chunk
    arrays = workload if workload is not None else (stream_workload(scenario) if streamed else build_workload(scenario))
    cb = (lambda done: progress(done, len(arrays))) if progress and not streamed else None
    concurrency, think_s = closed_loop(scenario)
    loop = {"max_concurrency": concurrency, "think_time_s": think_s} if concurrency is not None else {}
    transfers: dict = {}
    if scenario.engine.policy == "disaggregated":
        dep, schedulers, factory = _disaggregated(scenario, router)
        reqs, rec = simulate(arrays, progress=cb, topology=factory, **loop)
        links = factory.topology.links
        transfers = {"bytes": sum(l.bytes_sent for l in links), "count": sum(l.num_transfers for l in links),
                     "prefill_deployment": factory.prefill_deployment}
    else:
        dep = build_deployment(scenario)
        n = scenario.cluster.replicas
        schedulers = [dep.new_scheduler(scenario.engine.policy) for _ in range(n)]
        reqs, rec = simulate(arrays, schedulers, [dep.cost] * n, router, cb, swap_s_per_block=dep.swap_s_per_block,
                             **loop)
    steps = pl.DataFrame(rec.step_columns())
    frame = _request_frame(reqs)
    if streamed or concurrency is not None:  # the requests as sent
        arrays = RequestArrays(frame["arrival_s"].to_numpy(), frame["input_tokens"].to_numpy(),
                               frame["output_tokens"].to_numpy())
    return RunResult(scenario, dep, arrays, frame, steps, rec.resume_gaps_s,
                     time.perf_counter() - t0, schedulers, rec.itl_adjust, transfers)
