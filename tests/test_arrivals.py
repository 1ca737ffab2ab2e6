"""The arrival process runs on event callbacks (sim/engine/arrivals.py ``Arrivals``) and must
schedule exactly the events of the generator process it replaced: same times, priorities and
order. The process is kept here as the reference; runs with arrivals on a coarse time grid
(many at one instant, some exactly at a step's end), a workload read as a stream of chunks,
prefix-cache hash ids, and a client limit (max_concurrency, with and without think time) must
give identical step logs and request records."""

import numpy as np
import pytest

import sim.workload.build as build
from sim.core.request import Request
from sim.engine import cluster
from sim.engine.arrivals import ARRIVAL_SLICE
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from sim.workload.arrays import RequestArrays


class ProcessArrivals:
    """The arrival process as a SimPy generator process (the code before the callbacks)."""

    def __init__(self, env, chunks, submit, requests, max_concurrency=None):
        self.env, self.requests, self.sent = env, requests, 0
        self.free = max_concurrency if max_concurrency is not None else -1
        self._gated = max_concurrency is not None
        self._wake = None
        env.process(self._loop(chunks, submit))

    def release(self, n):
        self.free += n
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _loop(self, chunks, submit):
        env, i = self.env, 0
        for chunk in chunks:
            hash_ids = chunk.hash_ids
            for lo in range(0, len(chunk), ARRIVAL_SLICE):
                arrival = chunk.arrival_s[lo:lo + ARRIVAL_SLICE].tolist()
                inp = chunk.input_tokens[lo:lo + ARRIVAL_SLICE].tolist()
                out = chunk.output_tokens[lo:lo + ARRIVAL_SLICE].tolist()
                for j in range(len(arrival)):
                    t = arrival[j]
                    now = env.now
                    if t > now:
                        yield env.timeout(t - now)
                    if self._gated:
                        while self.free <= 0:
                            self._wake = env.event()
                            yield self._wake
                            self._wake = None
                        self.free -= 1
                        t = env.now
                    req = Request(i, t, inp[j], out[j])
                    if hash_ids is not None:
                        req.hash_ids = hash_ids[lo + j]
                        req.hash_block_size = chunk.hash_block_size
                    if self.requests is not None:
                        self.requests.append(req)
                    self.sent = i = i + 1
                    submit(req)


def _workload(n: int, grid_s: float, seed: int, hashed: bool = False) -> RequestArrays:
    rng = np.random.default_rng(seed)
    # arrivals on a coarse grid: many share an instant, and some fall exactly on a step's end
    t = np.floor(np.cumsum(rng.exponential(0.05, n)) / grid_s) * grid_s
    hash_ids = None
    if hashed:  # prompts sharing one of a few prefixes (prefix-cache hits)
        hash_ids = [np.concatenate([np.arange(8) + 100 * (k % 3), rng.integers(1000, 10**6, 20)])
                    for k in range(n)]
    return RequestArrays(t, rng.integers(20, 1200, n), rng.integers(1, 200, n), hash_ids=hash_ids)


def _raw(**extra):
    raw = {"name": "arrivals", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
           "cluster": {"replicas": 2}, "engine": {"policy": "chunked", "max_num_batched_tokens": 256},
           "workload": {"synthetic": {"num_requests": 1}}}
    for key, value in extra.items():
        raw[key] = {**raw.get(key, {}), **value}
    return raw


def _logged(monkeypatch, log: list):
    """Log (time, priority) of every event the watched loop processes that has something to
    call (a process's end, which nothing waits on, has not: the callbacks leave it out)."""
    monkeypatch.setattr(cluster, "EVENT_LOG", log)


def _run_both(monkeypatch, run):
    """``run()`` with the callback arrivals and with the process; also the events each processed."""
    logs = [], []
    with monkeypatch.context() as m:
        _logged(m, logs[0])
        new = run()
    with monkeypatch.context() as m:
        _logged(m, logs[1])
        m.setattr(cluster, "Arrivals", ProcessArrivals)
        old = run()
    assert len(logs[0]) > 300 and logs[0] == logs[1]  # the same events, in the same order
    return new, old


def _both(raw, workload, monkeypatch):
    return _run_both(monkeypatch, lambda: run_scenario(scenario_from_dict(raw), workload=workload))


def _same(new, old):
    assert new.steps.height > 100
    assert new.steps.equals(old.steps)
    assert new.requests.equals(old.requests)
    assert new.itl_adjust == old.itl_adjust and new.resume_gaps_s == old.resume_gaps_s


@pytest.mark.parametrize("grid_s", [0.05, 0.0])
def test_callback_arrivals_are_the_process_event_for_event(grid_s, monkeypatch):
    workload = _workload(250, grid_s, 1) if grid_s else _workload(250, 1.0, 1).with_arrivals(
        np.cumsum(np.random.default_rng(3).exponential(0.05, 250)))
    new, old = _both(_raw(), workload, monkeypatch)
    _same(new, old)
    assert int(new.steps["num_steps"].max()) > 1  # fast-forwarded runs, cut by arrivals


def test_prefix_hash_ids_reach_the_requests(monkeypatch):
    raw = _raw(engine={"enable_prefix_caching": True})
    new, old = _both(raw, _workload(200, 0.05, 2, hashed=True), monkeypatch)
    _same(new, old)
    assert int(new.requests["prefix_hit_tokens"].sum()) > 0


def test_a_stream_of_chunks(monkeypatch):
    """Consecutive chunks (a trace read as it goes), one of them empty."""
    whole = _workload(240, 0.05, 4)
    parts = [whole.take(np.arange(0, 90)), whole.take(np.arange(90, 90)), whole.take(np.arange(90, 240))]
    monkeypatch.setattr(build, "should_stream", lambda scenario: True)
    monkeypatch.setattr(build, "stream_workload", lambda scenario: iter(parts))
    raw = _raw()
    new, old = _run_both(monkeypatch, lambda: run_scenario(scenario_from_dict(raw)))
    _same(new, old)
    assert new.requests.height == 240


@pytest.mark.parametrize("think_s", [0.0, 0.3])
@pytest.mark.parametrize("rate", [float("inf"), 30.0])
def test_a_client_limit(rate, think_s, monkeypatch):
    """max_concurrency: a request waits for a free client (woken as one frees), then is sent."""
    raw = _raw(workload={"synthetic": {"num_requests": 150, "request_rate": rate, "max_concurrency": 5,
                                       "think_time_s": think_s}})
    new, old = _run_both(monkeypatch, lambda: run_scenario(scenario_from_dict(raw)))
    _same(new, old)
    assert new.requests.height == 150


def test_stream_read_only_as_far_as_time_has_reached():
    """The next chunk is read when the previous one's last request has been sent, not before."""
    from sim.engine.arrivals import Arrivals
    from sim.engine.simpy_clock import ClockEnvironment
    env, read, sent = ClockEnvironment(), [], []
    whole = _workload(30, 0.5, 5)
    whole = whole.with_arrivals(whole.arrival_s + 1.0)

    def chunks():
        for lo in (0, 10, 20):
            read.append(env.now)
            yield whole.take(np.arange(lo, lo + 10))

    a = Arrivals(env, chunks(), lambda req: sent.append((env.now, req.arrival_s)), [])
    env.run()
    assert a.sent == 30 and [s for s, _ in sent] == whole.arrival_s.tolist()
    assert read == [0.0, whole.arrival_s[9], whole.arrival_s[19]]
