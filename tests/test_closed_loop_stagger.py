"""What real closed-loop benchmark clients do, and what they measure (issue 37, "Closed-loop
clients phase-lock").

- DeepSpeed-MII's benchmark client (the DeepSpeed-FastGen blog's, VC-19) reports "Query
  throughput" as its number of clients over the mean request latency (DeepSpeedExamples
  benchmarks/inference/mii/postprocess_results.py ``get_summary``: ``throughput = client_num /
  latency``), not completed requests over the run's duration: validation metric
  ``closed_loop_query_throughput``.
- Clients of identical lengths that start together stay locked one step apart whatever their
  per-request delay, as long as it is shorter than a prefill step (validation/README.md, VC-43):
  no client-side cost of the size AIPerf, GenAI-Perf or perf_analyzer spend per request (fetching
  the prompt, formatting the body, ZMQ credits: milliseconds) unlocks them.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sim.analysis.validate import MetricMissing, load_rows, metric_value, validation_dir
from sim.run import run_scenario
from sim.scenario import scenario_from_dict


def test_query_throughput_is_clients_over_mean_latency():
    """32 clients whose requests take 16 s on average: 2 queries/s, whatever the run's duration."""
    summary = {"max_concurrency": 32, "mean_e2el_ms": 16_000.0, "request_throughput": 1.7, "duration": 300.0}
    assert metric_value(summary, "closed_loop_query_throughput") == pytest.approx(2.0)


@pytest.mark.parametrize("summary", [{"max_concurrency": None, "mean_e2el_ms": 16_000.0},
                                     {"max_concurrency": 8, "mean_e2el_ms": None}])
def test_query_throughput_needs_a_closed_loop_and_latencies(summary):
    """An open loop has no number of clients; a run with no completed request no mean latency."""
    with pytest.raises(MetricMissing):
        metric_value(summary, "closed_loop_query_throughput")


def test_vc19_reads_the_mii_clients_figure():
    """VC-19's published figure is the MII client's: its row is computed as that client does."""
    row = next(r for r in load_rows() if r.id == "VC-19/fastgen/32-clients/throughput")
    assert row.metric == "closed_loop_query_throughput"


def _vc43_c5(think_time_s: float):
    row = next(r for r in load_rows() if r.id == "VC-43/c5/ttft")
    scen = copy.deepcopy(row.scenario)
    scen["workload"]["synthetic"]["think_time_s"] = think_time_s
    return run_scenario(scenario_from_dict(scen, "VC-43 c5", base_dir=str(validation_dir())))


@pytest.mark.parametrize("think_time_s", [0.0, 0.02, 0.2])
def test_a_client_delay_shorter_than_a_prefill_keeps_the_lock(think_time_s):
    """Five clients of 5,000-token prompts and 500-token outputs, one context per step: past the
    warm-up, four of every five requests wait for another client's whole prefill step, for any
    per-request client delay below that step (about 0.43 s here)."""
    res = _vc43_c5(think_time_s)
    prefill_step_s = float(np.max(res.step_column("duration_s")[res.step_column("prefill_tokens") > 0]))
    assert think_time_s < prefill_step_s
    warmup = 10
    ids = res.request_column("request_id")
    queue_s = res.request_column("queue_s")[ids >= warmup]
    waited_a_prefill = np.count_nonzero(queue_s > 0.9 * prefill_step_s)
    assert waited_a_prefill == pytest.approx(0.8 * len(queue_s), abs=1)
