"""``run_scenario``: scenario in, requests and steps out (ARCHITECTURE.md section 2)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from sim.engine.admission_control import AdmissionControl
from sim.engine.cluster import simulate
from sim.engine.deployment import Deployment, engine_profile
from sim.engine.frontend import CLIENT_COLUMNS, ClosedLoopFrontend, Frontend, client_times, shifted
from sim.engine.columns import ColumnBuffer
from sim.engine.recorder import Recorder
from sim.engine.results import RequestResults
from sim.metrics.vllm_bench import REQUEST_METRICS, request_metric
from sim.scenario import Scenario
from sim.engine.topology import layout_for
from sim.core.ttft import ENGINE_TTFT_PARTS, TTFT_PARTS
from sim.workload import RequestArrays, build_workload
from sim.workload.arrays import mean_rate_per_s

if TYPE_CHECKING:
    import polars as pl


# requests.parquet's columns taken as recorded (sim/engine/results.py field names)
_RAW = {"request_id": "request_id", "arrival_s": "arrival_s", "first_scheduled_s": "first_scheduled_s",
        "first_token_s": "first_token_s", "finish_s": "finish_s", "input_tokens": "prompt_tokens",
        "output_tokens": "output_tokens", "num_preemptions": "num_preemptions", "replica": "replica",
        "prefix_hit_tokens": "prefix_hit_tokens", "decode_wait_s": "decode_wait_s",
        "decode_rounds_waited": "decode_rounds_waited", "priority": "priority", **{p: p for p in ENGINE_TTFT_PARTS}}
# the requests frame's columns, in its order
REQUEST_FRAME_COLUMNS = ("request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
                         "input_tokens", "output_tokens", *REQUEST_METRICS, "num_preemptions", "replica",
                         "prefix_hit_tokens", "kv_transfer_s", "decode_wait_s", "decode_rounds_waited",
                         *TTFT_PARTS, "status", "fail_reason", "priority")


@dataclass
class RunResult:
    """A finished run. Its per-request results and step rows stay in their column stores
    (spilled to disk for a large run, sim/engine/columns.py): ``request_column`` /
    ``step_column`` read one column, ``request_frame`` / ``step_frame`` a range of rows, and
    ``requests`` / ``steps`` build the whole polars frames (on first use; a large run's
    summary and run directory never need them)."""
    scenario: Scenario
    deployment: Deployment          # the replica (the decode pool's, when disaggregated)
    results: RequestResults
    step_store: ColumnBuffer
    given_workload: RequestArrays | None   # None: the requests as sent are read from the results
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
    # the serving front end (sim/engine/frontend.py; None: offline, in-process or no terms)
    # and each request's seconds in it before the engine saw it (column
    # frontend_in_s, by request id)
    frontend: Frontend | None = None
    frontend_in: ColumnBuffer | None = None

    @property
    def peak_kv_usage(self) -> float:
        return max((s.kv.peak_used / s.kv.num_blocks for s in self.schedulers), default=0.0)

    @property
    def num_requests(self) -> int:
        return len(self.results)

    @property
    def num_step_rows(self) -> int:
        return len(self.step_store)

    @property
    def workload(self) -> RequestArrays:
        """The requests as sent (a streamed or closed-loop run: read back from the results,
        each time: a 10M-request run does not keep them)."""
        if self.given_workload is not None:
            return self.given_workload
        return RequestArrays(self.request_column("arrival_s"), self.request_column("input_tokens"),
                             self.request_column("output_tokens"))

    @property
    def mean_rate_per_s(self) -> float:
        """The workload's mean arrival rate (``RequestArrays.mean_rate_per_s``)."""
        if self.given_workload is not None:
            return self.given_workload.mean_rate_per_s
        return mean_rate_per_s(self.request_column("arrival_s"))

    def completed(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Per request (rows [start, stop)): completed (status "completed")."""
        done = [i for i, (status, _) in enumerate(self.results.labels()) if status == "completed"]
        return np.isin(self.results.read("label", start, stop), done)

    def request_column(self, name: str, start: int = 0, stop: int | None = None,
                       ok: np.ndarray | None = None) -> np.ndarray:
        """Rows [start, stop) of one requests-frame column (by request id); ``ok``: those rows'
        ``completed`` if the caller has it (the metrics read it)."""
        read = self.results.read
        if name in CLIENT_COLUMNS:
            return self._client(name, start, stop)
        if name in _RAW:
            return read(_RAW[name], start, stop)
        if name == "queue_s":  # the engine's: from the request's arrival there (vLLM's queue time)
            return read("first_scheduled_s", start, stop) - read("arrival_s", start, stop)
        if name in REQUEST_METRICS:
            if ok is None:
                ok = self.completed(start, stop)
            return request_metric(name, lambda f: self._client(f, start, stop) if f in CLIENT_COLUMNS
                                  else read(f, start, stop), ok)
        if name == "kv_transfer_s":
            return read("transfer_end_s", start, stop) - read("transfer_start_s", start, stop)
        if name in ("status", "fail_reason", "label"):  # label: the (status, fail_reason) code
            return read(name, start, stop)
        raise KeyError(name)

    def _client(self, name: str, start: int, stop: int | None) -> np.ndarray:
        """A ``CLIENT_COLUMNS`` column of rows [start, stop) as the client sees it
        (sim/engine/frontend.py ``client_times``)."""
        recorded = self.frontend_in
        return client_times(name, self.frontend, lambda f: self.results.read(f, start, stop),
                            lambda: recorded.read("frontend_in_s", start, stop))

    def request_frame(self, start: int = 0, stop: int | None = None,
                      columns: tuple[str, ...] = REQUEST_FRAME_COLUMNS) -> pl.DataFrame:
        """Rows [start, stop) of the requests frame (every value computed per row, so any split
        into row ranges gives the same values)."""
        ok = self.completed(start, stop) if any(c in REQUEST_METRICS for c in columns) else None
        data = {c: self.request_column(c, start, stop, ok) for c in columns}
        for c in ("status", "fail_reason"):
            if c in data:
                data[c] = data[c].tolist()
        import polars as pl

        return pl.DataFrame(data, nan_to_null=False)

    def step_column(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self.step_store.read(name, start, stop)

    def step_frame(self, start: int = 0, stop: int | None = None, columns: tuple[str, ...] | None = None) -> pl.DataFrame:
        import polars as pl

        return pl.DataFrame({c: self.step_column(c, start, stop) for c in (columns or self.step_store.names)})

    @cached_property
    def requests(self) -> pl.DataFrame:
        return self.request_frame()

    @cached_property
    def steps(self) -> pl.DataFrame:
        return self.step_frame()


def frontend_status(scenario: Scenario) -> str:
    """How the run treats the serving front end (result.json ``simsrv_frontend``): ``offline``
    (``engine.api_server: false``), ``in the engine's steps`` (an in-process front end:
    ``frontend_overlap`` false), ``no front-end terms`` (all 0) or ``own process`` (delays on
    requests, open or closed loop: sim/engine/frontend.py)."""
    e = scenario.engine
    if not e.api_server:
        return "offline"
    p = engine_profile(e)
    if not p.frontend_overlap:
        return "in the engine's steps"
    if Frontend.of(p, e.stream_interval) is None:
        return "no front-end terms"
    return "own process"


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
    # the serving front end (sim/engine/frontend.py): the engine sees each request when the API
    # server hands it over. Under a closed loop its clients send from inside the simulation
    # (sim/engine/arrivals.py) when their last chunk reached them, through the same API server
    # (``ClosedLoopFrontend``); otherwise the workload's arrivals are shifted before the run
    frontend = Frontend.of(engine_profile(scenario.engine), scenario.engine.stream_interval)
    client = ClosedLoopFrontend(frontend) if frontend is not None and concurrency is not None else None
    spent_in: ColumnBuffer | None = None
    sent = arrays
    if client is not None:
        spent_in = client.spent_in
    elif frontend is not None:
        spent_in = ColumnBuffer(("frontend_in_s",))
        sent = shifted(arrays, frontend, spent_in)
    _, rec = simulate(sent, progress=cb, topology=layout.build(max_run_steps), results=results,
                      admission=AdmissionControl.of(scenario.admission_control), client=client, **loop)
    return run_result(scenario, layout, results, rec,
                      None if streamed or concurrency is not None else arrays,  # else: the requests as sent
                      time.perf_counter() - t0, frontend, spent_in)


def run_result(scenario: Scenario, layout, results: RequestResults, rec: Recorder,
               given_workload: RequestArrays | None, wall_s: float, frontend: Frontend | None = None,
               frontend_in: ColumnBuffer | None = None) -> RunResult:
    """The ``RunResult`` of a simulation that has ended (its results finished here); ``frontend``
    and ``frontend_in``: the serving front end and each request's seconds in it, if applied."""
    results.finish()
    if frontend_in is not None:
        frontend_in.finish()
    return RunResult(scenario, layout.deployment, results, rec.step_store(), given_workload,
                     rec.resume_gaps_s, wall_s, layout.schedulers, rec.itl_adjust,
                     layout.transfer_stats(), dict(sorted(rec.extrapolated_steps.items())),
                     rec.lm_head_extrapolated, layout=layout,
                     overhead_outside_seqs=dict(sorted(rec.overhead_outside_seqs.items())),
                     frontend=frontend, frontend_in=frontend_in)
