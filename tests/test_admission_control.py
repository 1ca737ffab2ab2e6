"""``admission_control``: per-class token buckets and concurrency limits in front of the engines
(issue 40 item 4). A rejected request never reaches a scheduler, is counted apart from failures,
with its reason, is in no latency figure, and ``simsrv serve`` answers it 429."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from sim.core.request import Request
from sim.engine.admission_control import AdmissionControl, ClassLimit, TokenBucket
from sim.errors import UserError
from sim.metrics.summary import summarize
from sim.output import write_run
from sim.reporting.metrics_table import best_by_metric, best_cells
from sim.reporting.rundata import load_run
from sim.run import run_scenario
from sim.scenario import load_scenario
from sim.serve.driver import Driver
from sim.serve.live_view import LiveView
from sim.serve.openai_api import ApiError, Asked

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "priority.yaml"


def _req(i: int, priority: int = 0) -> Request:
    return Request(i, 0.0, 10, 5, priority=priority)


def test_token_bucket_math():
    b = TokenBucket(rate_per_s=2.0, burst=3)
    ac = AdmissionControl([ClassLimit(None, b, None)])
    assert [ac.decide(_req(i), 0.0) for i in range(3)] == ["", "", ""]  # the burst, full at start
    assert "token_bucket empty" in ac.decide(_req(4), 0.0)
    assert "token_bucket empty" in ac.decide(_req(5), 0.49)  # 0.98 tokens: not one yet
    assert ac.decide(_req(6), 0.5) == ""                     # 2/s x 0.5 s = one token
    assert b.level(100.0) == 3                               # never above the burst
    assert ac.rejected == 2


def test_concurrency_limit_counts_requests_in_the_system_per_class():
    ac = AdmissionControl([ClassLimit(1, None, 2)])
    a, b, c, hi = _req(0, 1), _req(1, 1), _req(2, 1), _req(3, 0)
    assert ac.decide(a, 0.0) == "" and ac.decide(b, 0.0) == ""
    assert ac.decide(c, 0.0) == "admission_control: max_concurrency 2 reached (priority 1)"
    assert ac.decide(hi, 0.0) == ""  # another class: not limited
    ac.ended(a)
    assert ac.decide(c, 0.1) == ""


def test_a_rejected_request_takes_nothing_from_the_other_limits():
    bucket = TokenBucket(rate_per_s=1.0, burst=5)
    ac = AdmissionControl([ClassLimit(None, bucket, None), ClassLimit(1, None, 1)])
    assert ac.decide(_req(0, 1), 0.0) == ""
    assert ac.decide(_req(1, 1), 0.0).startswith("admission_control: max_concurrency 1")
    assert bucket.tokens == 4  # only the admitted one took a token


def _bucket_replay(arrival_s: np.ndarray, rate: float, burst: int) -> np.ndarray:
    tokens, last, out = float(burst), 0.0, []
    for t in arrival_s.tolist():
        tokens = min(burst, tokens + rate * (t - last))
        last = t
        ok = tokens >= 1.0
        if ok:
            tokens -= 1.0
        out.append(ok)
    return np.array(out)


def test_rejections_are_counted_apart_and_out_of_the_latencies():
    limits = 'admission_control={"limits":[{"priority":1,"token_bucket":{"rate_per_s":4,"burst":8}}]}'
    s = load_scenario(SCENARIO, ["workload.synthetic.num_requests=600", "engine.api_server=false", limits])
    result = run_scenario(s)
    summary = summarize(result)
    req = result.requests
    rejected = req["status"].to_numpy() == "rejected"
    assert rejected.sum() == summary["simsrv_rejected"] > 0
    assert summary["failed"] == int((req["status"].to_numpy() == "failed").sum())
    assert summary["completed"] + summary["failed"] + summary["simsrv_rejected"] == 600
    assert list(summary["simsrv_rejected_reasons"]) == [
        "admission_control: token_bucket empty (priority 1: 4/s, burst 8)"]
    assert not any("admission_control" in k for k in summary["simsrv_failed_reasons"])
    # only priority 1 is limited, and exactly as a token bucket over its arrivals decides
    prio = req["priority"].to_numpy()
    assert not rejected[prio == 0].any()
    arrivals = req["arrival_s"].to_numpy()[prio == 1]
    assert np.array_equal(~rejected[prio == 1], _bucket_replay(arrivals, 4.0, 8))
    assert (req["replica"].to_numpy()[rejected] == -1).all()
    ok = req["status"].to_numpy() == "completed"
    assert summary["p99_ttft_ms"] == pytest.approx(float(np.percentile(req["ttft_s"].to_numpy()[ok], 99)) * 1e3)
    assert summary["simsrv_classes"]["1"]["rejected"] == int(rejected.sum())


def test_runs_under_different_limits_are_never_ranked_against_each_other(tmp_path):
    base = ["workload.synthetic.num_requests=300"]
    limited = [*base, 'admission_control={"limits":[{"max_concurrency":4}]}']
    runs = []
    for name, sets in (("open", base), ("limited", limited)):
        result = run_scenario(load_scenario(SCENARIO, sets))
        write_run(result, summarize(result), tmp_path / name)
        runs.append(load_run(tmp_path / name, name))
    assert runs[1].summary["simsrv_rejected"] > 0
    assert best_cells(runs) == set() and best_by_metric(runs, ["open", "limited"]) == {}
    from sim.reporting.compare_page import build_compare_page

    page = build_compare_page(runs, "t").render()
    assert "different admission_control limits" in page
    assert "Per priority class" in page and "priority 1: rejected" in page


def test_bad_limits_are_one_clear_error():
    with pytest.raises(UserError, match="give token_bucket, max_concurrency or both"):
        load_scenario(SCENARIO, ['admission_control={"limits":[{"priority":1}]}'])
    with pytest.raises(UserError, match="listed twice"):
        load_scenario(SCENARIO, ['admission_control={"limits":[{"max_concurrency":1},{"max_concurrency":2}]}'])


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _asked(priority: int = 0) -> Asked:
    return Asked(chat=False, model="m", prompt_tokens=100, max_tokens=8, ignore_eos=False, stream=True,
                 include_usage=False, priority=priority)


def test_serve_answers_a_rejection_with_429():
    async def go():
        s = load_scenario(SCENARIO, ["engine.api_server=false",
                                     'admission_control={"limits":[{"priority":1,"max_concurrency":1}]}'])
        d = Driver(LiveView(s), clock=FakeClock())
        first = d.submit(_asked(1), 8)
        assert first.decided.is_set() and not first.rejected
        with pytest.raises(ApiError) as e:
            d.submit(_asked(1), 8)
        assert e.value.status == 429 and e.value.err_type == "RateLimitError"
        assert "max_concurrency 1 reached (priority 1)" in e.value.message
        d.submit(_asked(0), 8)  # another class passes
        result = d.live.finish("stopped")
        assert summarize(result)["simsrv_rejected"] == 1

    asyncio.run(go())


def test_serve_with_a_front_end_decides_when_the_request_reaches_the_engine():
    async def go():
        s = load_scenario(SCENARIO, ['admission_control={"limits":[{"token_bucket":{"rate_per_s":1,"burst":1}}]}'])
        clock = FakeClock()
        d = Driver(LiveView(s), clock=clock)
        a = d.submit(_asked(), 8)
        b = d.submit(_asked(), 8)
        assert not b.decided.is_set()  # the API server holds it: no answer yet
        for _ in range(50):
            if a.decided.is_set() and b.decided.is_set():
                break
            clock.t += 0.01
            d.catch_up()
        assert a.decided.is_set() and b.decided.is_set()
        assert not a.rejected and "token_bucket empty" in b.rejected

    asyncio.run(go())


def test_a_live_session_with_priorities_and_limits_replays_to_the_same_requests(tmp_path):
    import math

    from sim.live import LiveSimulation
    from sim.serve.session import replay_scenario, write_arrivals
    from sim.workload import build_workload

    limits = 'admission_control={"limits":[{"priority":1,"max_concurrency":20},{"token_bucket":{"rate_per_s":12,"burst":20}}]}'
    s = load_scenario(SCENARIO, ["workload.synthetic.num_requests=300", limits])
    w = build_workload(s)
    rows = list(zip(w.arrival_s.tolist(), w.input_tokens.tolist(), w.output_tokens.tolist(), w.priority.tolist()))
    live = LiveSimulation(s)
    for t, inp, out, prio in rows:
        live.run_until(t)
        live.inject(inp, out, max_tokens=out, priority=prio)
    live.run_until(math.inf)
    online = live.finish()
    path = tmp_path / "arrivals.parquet"
    write_arrivals(path, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[2] for r in rows],
                   [r[3] for r in rows])
    replay = run_scenario(replay_scenario(s, path))
    assert (online.requests["status"] == "rejected").sum() > 0
    assert online.requests.equals(replay.requests)


def test_shutdown_answers_a_request_the_api_server_still_held():
    async def go():
        s = load_scenario(SCENARIO, ['admission_control={"limits":[{"max_concurrency":5}]}'])
        d = Driver(LiveView(s), clock=FakeClock())
        a = d.submit(_asked(), 8)
        assert not a.decided.is_set()
        d.stop("stopped")
        assert a.decided.is_set() and a.failure == "stopped" and not a.rejected

    asyncio.run(go())
