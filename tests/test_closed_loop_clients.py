"""Closed-loop benchmark clients as the real ones measure (issue 37, "Closed-loop clients
phase-lock"): a benchmark leaves its start-up out of what it reports (GenAI-Perf / AIPerf
``--warmup-request-count``, perf_analyzer's stable measurement windows), which
``workload.synthetic.warmup_requests`` models: the first requests sent load the engine and are
left out of every per-request latency figure, whatever the concurrency, lengths or engine.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sim.analysis.validate import load_rows, validation_dir
from sim.errors import UserError
from sim.metrics.summary import summarize
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from sim.workload.build import build_workload
from tests.conftest import small_scenario


def _closed_loop(concurrency: int, num_requests: int, warmup: int, prompt: int = 512, output: int = 24,
                 policy: str = "chunked") -> dict:
    raw = small_scenario(engine={"policy": policy, "max_num_batched_tokens": 8192})
    raw["workload"]["synthetic"] = {"num_requests": num_requests, "request_rate": float("inf"),
                                    "max_concurrency": concurrency, "warmup_requests": warmup,
                                    "input_tokens": {"dist": "fixed", "value": prompt},
                                    "output_tokens": {"dist": "fixed", "value": output}}
    return raw


LATENCY = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2el_s"}


@pytest.mark.parametrize("concurrency,num_requests,warmup,prompt,output,policy", [
    (4, 20, 8, 512, 24, "chunked"),
    (8, 24, 8, 2000, 8, "continuous"),
    (3, 12, 1, 64, 40, "chunked"),
    (1, 6, 2, 300, 12, "continuous"),
])
def test_warmup_requests_are_in_no_latency_figure(concurrency, num_requests, warmup, prompt, output, policy):
    """Every per-request latency figure is that of the requests sent after the warm-up (request
    id order is the order they are sent in), for any closed loop; the warm-up requests still ran
    (they are completed and counted) and the summary says how many there were."""
    res = run_scenario(scenario_from_dict(_closed_loop(concurrency, num_requests, warmup, prompt, output, policy)))
    s = summarize(res)
    assert s["simsrv_warmup_requests"] == warmup
    assert s["completed"] == num_requests  # simulated and counted like any other
    for metric, column in LATENCY.items():
        values = res.request_column(column)
        assert s[f"mean_{metric}_ms"] == pytest.approx(float(values[warmup:].mean()) * 1e3, rel=1e-12)
        assert s[f"p99_{metric}_ms"] == pytest.approx(float(np.percentile(values[warmup:], 99)) * 1e3, rel=1e-12)
    queue = res.request_column("queue_s")[warmup:]
    assert s["simsrv_mean_queue_time_ms"] == pytest.approx(float(queue.mean()) * 1e3, rel=1e-12)


def test_each_priority_class_leaves_out_the_warmup_too():
    """The per-class latencies (``simsrv_classes``) are of the measured requests, as the run's."""
    raw = _closed_loop(4, 24, 10)
    raw["workload"]["synthetic"]["priority_classes"] = [{"priority": 0, "weight": 1}, {"priority": 1, "weight": 1}]
    res = run_scenario(scenario_from_dict(raw))
    classes = summarize(res)["simsrv_classes"]
    priority, ttft = res.request_column("priority"), res.request_column("ttft_s")
    for p, figures in classes.items():
        mine = priority[10:] == int(p)
        assert figures["completed"] == int((priority == int(p)).sum())
        assert figures["p99_ttft_ms"] == pytest.approx(float(np.percentile(ttft[10:][mine], 99)) * 1e3, rel=1e-12)


def test_warmup_leaves_the_simulation_unchanged():
    """The warm-up is what the client reports, not what it sends: the same requests at the same
    times, the same steps, with or without it."""
    with_warmup = run_scenario(scenario_from_dict(_closed_loop(4, 16, 6)))
    without = run_scenario(scenario_from_dict(_closed_loop(4, 16, 0)))
    for column in ("arrival_s", "first_token_s", "finish_s"):
        assert np.array_equal(with_warmup.request_column(column), without.request_column(column))
    assert np.array_equal(with_warmup.step_column("duration_s"), without.step_column("duration_s"))
    assert summarize(without)["simsrv_warmup_requests"] == 0


def test_first_wave_is_what_the_warmup_leaves_out():
    """Under a closed loop with request_rate inf every client sends at once: their prompts are
    served one after another, a start-up that no later request sees. Leaving the first wave out
    can only lower the mean TTFT here (the queue it leaves out is the longest)."""
    c = 6
    res = run_scenario(scenario_from_dict(_closed_loop(c, 4 * c, c, prompt=3000, output=16, policy="continuous")))
    ttft = res.request_column("ttft_s")
    assert ttft[:c].max() > ttft[c:].max()
    assert summarize(res)["mean_ttft_ms"] == pytest.approx(ttft[c:].mean() * 1e3)


@pytest.mark.parametrize("warmup", [12, 13])
def test_warmup_must_leave_requests_to_measure(warmup):
    raw = _closed_loop(4, 12, warmup)
    with pytest.raises(UserError, match=r"workload\.synthetic\.warmup_requests"):
        build_workload(scenario_from_dict(raw))


def test_warmup_is_refused_below_zero():
    with pytest.raises(UserError, match="warmup_requests"):
        scenario_from_dict(_closed_loop(4, 12, -1))


def test_vc43_leaves_out_its_first_wave():
    """VC-43 (AIPerf / GenAI-Perf concurrency sweep): its mean TTFT is that of the measured
    requests, with the all-at-once first wave left out."""
    row = next(r for r in load_rows() if r.id == "VC-43/c5/ttft")
    scen = copy.deepcopy(row.scenario)
    syn = scen["workload"]["synthetic"]
    assert syn["warmup_requests"] >= syn["max_concurrency"]
    res = run_scenario(scenario_from_dict(scen, "VC-43 test", base_dir=str(validation_dir())))
    ttft = res.request_column("ttft_s")
    w = syn["warmup_requests"]
    assert summarize(res)["mean_ttft_ms"] == pytest.approx(ttft[w:].mean() * 1e3)
