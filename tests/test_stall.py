"""Time advances by construction: the KV link never spins, and a stalled run fails clearly."""

import pytest

from sim.engine.simpy_clock import ClockEnvironment
from sim.errors import SimulationStalled
from sim.engine.link import SharedLink


@pytest.mark.parametrize("bandwidth_bytes_per_s", [50e9, 7e14, 1e18])
@pytest.mark.parametrize("start_s", [0.0, 0.37, 612.3, 86_400.0])
def test_link_finishes_every_transfer_strictly_after_now(bandwidth_bytes_per_s, start_s):
    """Float residues of ``advance`` once left a transfer 'not done' with next_done_s == now."""
    link = SharedLink(bandwidth_bytes_per_s, 0.0)
    now = start_s
    for i, size in enumerate([3.3e6, 1.7e8, 5.5e5, 9.1e7, 1.0e6]):
        link.start(i, size * 1.0000001, now)
        now += 1e-4 * (i + 1) / 3.0
    finished = []
    for _ in range(100):  # five transfers end in at most five distinct instants
        due = link.next_done_s()
        if due is None:
            break
        finished += link.pop_done(due)
        nxt = link.next_done_s()
        assert nxt is None or nxt > due, "the link would re-wake at the same instant forever"
    assert sorted(finished) == list(range(5))


def test_watchdog_stops_a_process_that_never_advances_time():
    env = ClockEnvironment()
    env.clock.stall_events_base, env.clock.stall_events_per_request = 1000, 0

    def spin():
        while True:
            yield env.timeout(0.0)

    def tick():
        for _ in range(5):
            yield env.timeout(1.0)
        env.process(spin())

    env.process(tick())
    with pytest.raises(SimulationStalled, match=r"t=5 s"):
        env.clock.run()


def test_watchdog_allows_many_events_on_one_instant_when_requests_share_it():
    env = ClockEnvironment()
    env.clock.stall_events_base = 100
    env.clock.num_requests = lambda: 300
    for _ in range(300):  # 300 arrivals on one grid instant, each a handful of events
        env.timeout(2.0)
    env.clock.run()
    assert env.now == 2.0
