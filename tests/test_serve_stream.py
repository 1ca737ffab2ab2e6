"""``simsrv serve``'s streaming without HTTP: the tokens a client gets, and when.

Inside a fast-forwarded decode run the tokens are read off the run (sim/serve/live_view.py,
``Replica.steps_ended_by``); they must come at the times the same requests' tokens come when
every step is simulated alone (``max_run_steps=1``: each token an event), and the driver must
never run the simulation past the wall clock."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from sim.scenario import load_scenario
from sim.serve.driver import Driver
from sim.serve.live_view import LiveView
from sim.serve.openai_api import ApiError, Asked

ROOT = Path(__file__).resolve().parents[1]


def _token_times(view: LiveView, arrivals: list[tuple[float, int, int]], horizon_s: float) -> dict[int, list[float]]:
    """Walk the times a driver wakes at (events and step ends), injecting the arrivals at
    theirs; each request's token times (when its count grows)."""
    times: dict[int, list[float]] = {}
    pending = list(arrivals)
    ids: list[int] = []
    t = 0.0
    while t < horizon_s:
        nxt = min(view.next_event_s(), view.next_token_s(), pending[0][0] if pending else math.inf)
        if math.isinf(nxt):
            break
        t = nxt
        view.run_until(t)
        while pending and pending[0][0] <= t:
            _, n_in, n_out = pending.pop(0)
            ids.append(view.inject(n_in, n_out, n_out))
        for rid in ids:
            n, _, _ = view.progress(rid, t)
            got = times.setdefault(rid, [])
            got.extend([t] * (n - len(got)))
    return times


@pytest.mark.parametrize("policy", ["chunked", "continuous"])
def test_tokens_inside_a_run_come_at_their_steps_end(policy):
    s = load_scenario(ROOT / "scenarios" / "chat.yaml", [f"engine.policy={policy}"])
    arrivals = [(0.0, 900, 120), (0.05, 300, 40), (0.31, 2000, 90), (0.32, 50, 200), (0.9, 700, 30)]
    fast = _token_times(LiveView(s), arrivals, 60.0)
    from sim.live import LiveSimulation

    slow_view = LiveView(s)
    slow_view.sim = LiveSimulation(s, max_run_steps=1, on_end=slow_view._ended)
    slow_view.replicas = slow_view.sim.replicas()
    slow = _token_times(slow_view, arrivals, 60.0)
    assert sorted(fast) == sorted(slow) == list(range(len(arrivals)))
    for rid, (_, _, n_out) in enumerate(arrivals):
        assert len(fast[rid]) == len(slow[rid]) == n_out
        for a, b in zip(fast[rid], slow[rid]):
            # the fast-forward's exactness (README, Speed): within 0.005% of a step per step
            assert a == pytest.approx(b, rel=1e-6, abs=2e-6)


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _asked(max_tokens: int = 8, ignore_eos: bool = False) -> Asked:
    return Asked(chat=False, model="m", prompt_tokens=100, max_tokens=max_tokens, ignore_eos=ignore_eos,
                 stream=True, include_usage=False)


def test_the_driver_never_runs_past_the_wall_clock():
    async def go():
        s = load_scenario(ROOT / "scenarios" / "chat.yaml", [])
        clock = FakeClock()
        d = Driver(LiveView(s), speed=2.0, clock=clock)
        stream = d.submit(_asked(), 8)
        assert d.live.now_s == 0.0  # time 0 is the first arrival
        got = []
        for step_s in (0.001, 0.003, 0.01, 0.02, 0.05, 1.0):
            clock.t += step_s
            d.catch_up()
            assert d.live.now_s <= d.sim_now() + 1e-12
            while not stream.tokens.empty():
                got.append(stream.tokens.get_nowait())
        assert got[-1] is None and len(got) == 9
        # each token handed out no earlier than its simulated time
        times = [t for _, t in got[:-1]]
        assert times == sorted(times)

    asyncio.run(go())


def test_a_full_queue_answers_503():
    async def go():
        s = load_scenario(ROOT / "scenarios" / "chat.yaml", ["engine.max_num_seqs=1", "engine.api_server=false"])
        d = Driver(LiveView(s), max_waiting=2, clock=FakeClock())
        d.submit(_asked(), 8)  # running
        d.submit(_asked(), 8)  # waiting
        d.submit(_asked(), 8)  # waiting
        with pytest.raises(ApiError) as e:
            d.submit(_asked(), 8)
        assert e.value.status == 503

    asyncio.run(go())


def test_eos_from_the_workload_is_seeded_and_capped():
    from sim.serve.session import OutputLengths

    s = load_scenario(ROOT / "scenarios" / "chat.yaml", [])
    if s.workload.synthetic is None:
        s = load_scenario(ROOT / "scenarios" / "batching.yaml", [])
    a, b = OutputLengths(s, "workload"), OutputLengths(s, "workload")
    draws = [a(_asked(10_000), i) for i in range(50)]
    assert draws == [b(_asked(10_000), i) for i in range(50)]
    assert len(set(draws)) > 10
    assert all(a(_asked(5), i) <= 5 for i in range(50))
    assert all(a(_asked(7, ignore_eos=True), i) == 7 for i in range(50))
    assert OutputLengths(s, "max_tokens")(_asked(7), 3) == 7
