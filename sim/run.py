"""``run_scenario``: scenario in, requests and steps out (DESIGN.md section 2)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from sim.engine.cluster import simulate
from sim.engine.deployment import Deployment
from sim.engine.results import RequestResults
from sim.analysis.metrics import request_metrics
from sim.scenario import Scenario
from sim.engine.topology import layout_for
from sim.core.ttft import TTFT_PARTS
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
    transfers: dict = field(default_factory=dict)   # disaggregated: KV transfers' bytes and count
    # engine steps run at shapes outside a calibrated table, per replica index (sim/engine/recorder.py)
    extrapolated_steps: dict[int, int] = field(default_factory=dict)
    lm_head_extrapolated: bool = False
    # (fewest, most) scheduled sequences of a step whose engine overhead was taken outside the
    # profile's measured batch range, per replica index (sim/engine/recorder.py)
    overhead_outside_seqs: dict[int, tuple[int, int]] = field(default_factory=dict)
    layout: object = None                            # sim.engine.topology layout: pools, GPUs, replicas

    @property
    def peak_kv_usage(self) -> float:
        return max((s.kv.peak_used / s.kv.num_blocks for s in self.schedulers), default=0.0)


def _request_frame(cols: dict[str, np.ndarray]) -> pl.DataFrame:
    """requests.parquet's columns from the finished requests' results (sim/engine/results.py)."""
    times = {"request_id": cols["request_id"], "arrival_s": cols["arrival_s"],
             "first_scheduled_s": cols["first_scheduled_s"],
             "first_token_s": cols["first_token_s"], "finish_s": cols["finish_s"],
             "input_tokens": cols["prompt_tokens"], "output_tokens": cols["output_tokens"]}
    metrics = request_metrics({**times, "status": cols["status"]})
    return pl.DataFrame({
        **times,
        **metrics,
        "num_preemptions": cols["num_preemptions"],
        "replica": cols["replica"],
        "prefix_hit_tokens": cols["prefix_hit_tokens"],
        "kv_transfer_s": cols["transfer_end_s"] - cols["transfer_start_s"],
        "decode_wait_s": cols["decode_wait_s"],
        "decode_rounds_waited": cols["decode_rounds_waited"],
        **{part: cols[part] for part in TTFT_PARTS},
        "status": cols["status"].tolist(),
        "fail_reason": cols["fail_reason"].tolist(),
    }, nan_to_null=False)


def run_scenario(scenario: Scenario, progress: Callable[[int, int], None] | None = None,
                 workload: RequestArrays | None = None, max_run_steps: int | None = None) -> RunResult:
    """Simulate ``scenario``; ``progress(done, total)`` is called as requests end.
    ``max_run_steps`` caps a fast-forwarded run of decode steps (1: every step planned and
    costed alone; the exactness check of tests/test_fastforward.py and bench/fastforward.py).

    The cyclic garbage collector is paused meanwhile: the run builds millions of acyclic
    objects, and each full collection would rescan all live requests and step records (25-30%
    of the wall time at 100k requests; see sim/engine/cluster.py and bench/README.md)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(scenario, progress, workload, max_run_steps)
    finally:
        if was_enabled:
            gc.enable()


def _run(scenario: Scenario, progress, workload: RequestArrays | None, max_run_steps: int | None) -> RunResult:
    t0 = time.perf_counter()
    from sim.workload.build import closed_loop, should_stream, stream_workload

    streamed = workload is None and should_stream(scenario)  # a large trace is read chunk by chunk
    arrays = workload if workload is not None else (stream_workload(scenario) if streamed else build_workload(scenario))
    cb = (lambda done: progress(done, len(arrays))) if progress and not streamed else None
    concurrency, think_s = closed_loop(scenario)
    loop = {"max_concurrency": concurrency, "think_time_s": think_s} if concurrency is not None else {}
    layout = layout_for(scenario)
    results = RequestResults()
    _, rec = simulate(arrays, progress=cb, topology=layout.build(max_run_steps), results=results, **loop)
    steps = pl.DataFrame(rec.step_columns())
    frame = _request_frame(results.columns())
    if streamed or concurrency is not None:  # the requests as sent
        arrays = RequestArrays(frame["arrival_s"].to_numpy(), frame["input_tokens"].to_numpy(),
                               frame["output_tokens"].to_numpy())
    return RunResult(scenario, layout.deployment, arrays, frame, steps, rec.resume_gaps_s,
                     time.perf_counter() - t0, layout.schedulers, rec.itl_adjust, layout.transfer_stats(),
                     dict(sorted(rec.extrapolated_steps.items())), rec.lm_head_extrapolated, layout=layout,
                     overhead_outside_seqs=dict(sorted(rec.overhead_outside_seqs.items())))
