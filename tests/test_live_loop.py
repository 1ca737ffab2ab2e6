"""A live simulation (sim/live.py ``LiveSimulation``) whose arrivals are all injected one by one,
each at its time (``run_until(t)`` then ``inject``), gives byte for byte the requests and steps
that the same arrivals give replayed from a trace file by ``run_scenario`` (``simsrv run``);
stopping the clock in between changes nothing; finishing early counts the requests in flight
as failed, with the reason."""

import math

import numpy as np
import pytest

from sim.errors import UserError
from sim.live import IN_FLIGHT_AT_FINISH, LiveSimulation
from sim.run import run_scenario
from sim.scenario import scenario_from_dict

POLICIES = {"chunked": {"policy": "chunked", "max_num_batched_tokens": 256},
            "continuous": {"policy": "continuous"}}


def _trace(tmp_path, n: int, seed: int):
    """A generic CSV trace: continuous arrival times (no two on one instant, none on a step's
    end), written with every digit (repr), so the trace reads back the very floats."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.04, n))
    t -= t[0]  # (a trace's times are read from its first arrival on: the first at 0 reads as itself)
    inp, out = rng.integers(20, 1500, n), rng.integers(1, 300, n)
    path = tmp_path / "trace.csv"
    lines = ["arrival_s,input,output"] + [f"{float(a)!r},{int(i)},{int(o)}" for a, i, o in zip(t, inp, out)]
    path.write_text("\n".join(lines) + "\n")
    return path, [(float(a), int(i), int(o)) for a, i, o in zip(t, inp, out)]


def _scenario(path, policy: str, replicas: int = 2, api_server: bool = True):
    """(``api_server``: online, the serving front end delays each request's entry, as in
    ``simsrv run``: sim/engine/frontend.py; offline, the engine sees it at once)"""
    return scenario_from_dict({
        "name": "live", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
        "cluster": {"replicas": replicas}, "engine": {**POLICIES[policy], "api_server": api_server},
        "workload": {"trace": {"path": str(path), "format": "generic", "time_unit": "s",
                               "columns": {"arrival": "arrival_s", "input": "input", "output": "output"}}}})


def _live(scenario, rows, stops=()) -> object:
    live = LiveSimulation(scenario)
    stops = sorted(stops)
    for t, inp, out in rows:
        while stops and stops[0] < t:
            live.run_until(stops.pop(0))
        live.run_until(t)
        assert live.now_s == t
        assert live.inject(inp, out) == rows.index((t, inp, out))
    live.run_until(math.inf)
    assert live.next_event_s() == math.inf
    return live.finish()


def _same(a, b):
    assert a.steps.height > 200
    assert a.steps.equals(b.steps) and a.requests.equals(b.requests)
    assert a.itl_adjust == b.itl_adjust and a.resume_gaps_s == b.resume_gaps_s


@pytest.mark.parametrize("policy", list(POLICIES))
def test_injected_arrivals_are_the_trace_replayed(policy, tmp_path):
    path, rows = _trace(tmp_path, 300, 1)
    scenario = _scenario(path, policy)
    replay = run_scenario(scenario)
    live = _live(scenario, rows)
    _same(live, replay)
    assert int(live.steps["num_steps"].max()) > 1  # fast-forwarded runs, cut by the arrivals
    assert (live.requests["status"] == "completed").all()


def test_stopping_the_clock_mid_run_cuts_nothing(tmp_path):
    """``run_until`` at times inside fast-forwarded decode runs (no arrival there) leaves the
    runs whole: the same steps as without the stops."""
    path, rows = _trace(tmp_path, 120, 2)
    scenario = _scenario(path, "chunked", replicas=1)
    replay = run_scenario(scenario)
    runs = replay.steps.filter(replay.steps["num_steps"] > 3)
    mids = (runs["start_s"] + runs["duration_s"] / 2).to_list()
    assert len(mids) > 5
    _same(_live(scenario, rows, stops=mids), replay)


def test_run_until_processes_the_instant_and_keeps_the_rest(tmp_path):
    path, rows = _trace(tmp_path, 5, 3)
    live = LiveSimulation(_scenario(path, "chunked", replicas=1, api_server=False))
    live.run_until(0.0)
    assert live.next_event_s() == math.inf  # the replicas started and went idle
    live.run_until(1.0)
    assert live.now_s == 1.0
    live.inject(200, 50)
    nxt = live.next_event_s()
    assert nxt == 1.0  # the replica's wake-up, now
    live.run_until(1.0)  # events at exactly t are processed
    step_end = live.next_event_s()
    assert step_end > 1.0
    live.run_until(step_end)
    assert live.now_s == step_end and live.next_event_s() > step_end
    with pytest.raises(ValueError, match="already at"):
        live.run_until(0.5)


def test_finish_counts_the_requests_in_flight_failed(tmp_path):
    path, rows = _trace(tmp_path, 40, 4)
    live = LiveSimulation(_scenario(path, "chunked", replicas=1))
    for t, inp, out in rows:
        live.run_until(t)
        live.inject(inp, out)
    live.run_until(rows[-1][0] + 0.05)
    result = live.finish()
    req = result.requests
    failed = req.filter(req["status"] == "failed")
    assert result.num_requests == 40 and 0 < failed.height < 40
    assert set(failed["fail_reason"].to_list()) == {IN_FLIGHT_AT_FINISH}
    assert req["request_id"].to_list() == list(range(40))
    with pytest.raises(RuntimeError, match="finished"):
        live.inject(10, 10)


def test_inject_refuses_bad_token_counts(tmp_path):
    path, _ = _trace(tmp_path, 5, 5)
    live = LiveSimulation(_scenario(path, "chunked", replicas=1))
    for bad in (0, -3, 2.5, True):
        with pytest.raises(UserError, match="input_tokens"):
            live.inject(bad, 10)


def test_the_front_end_delays_entry_as_a_replay_does(tmp_path):
    """Online, a request reaches the engine when the API server hands it over (one at a time,
    first come first served), computed to the bit as ``simsrv run`` computes it; offline at once."""
    path, rows = _trace(tmp_path, 5, 3)
    online = LiveSimulation(_scenario(path, "chunked", replicas=1))
    assert online.frontend_out_s > 0
    online.run_until(1.0)
    online.inject(2000, 5)
    online.inject(10, 5)  # behind the first in the API server's queue
    assert online.request(0) is None and online.next_event_s() > 1.0
    first = online.next_event_s()
    online.run_until(first)
    assert online.request(0) is not None and online.request(1) is None
    assert online.next_event_s() > first
    result = online.finish()
    assert result.requests["status"].to_list() == ["failed", "failed"]
    assert result.requests["arrival_s"].to_list() == [1.0, 1.0]  # the client's arrival
    offline = LiveSimulation(_scenario(path, "chunked", replicas=1, api_server=False))
    offline.run_until(1.0)
    offline.inject(2000, 5)
    assert offline.request(0) is not None and offline.frontend_out_s == 0.0
