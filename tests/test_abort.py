"""A request aborted by its client (sim/live.py ``LiveSimulation.abort``, a trace's ``abort_s``,
a disconnect from ``simsrv serve``) ends as vLLM ends it: taken out of wherever it is at the
next step boundary (front-end queue, waiting, prefilling, decoding, preempted), its KV blocks
freed (the cached ones stay for prefix hits), status ``aborted``, counted apart from failures;
the others go on; a live run's aborts replay from its recorded arrivals byte for byte."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sim.core.request import ABORT_REASON, ABORTED
from sim.errors import UserError
from sim.live import LiveSimulation
from sim.metrics.summary import summarize
from sim.run import run_scenario
from sim.scenario import scenario_from_dict

ROOT = Path(__file__).resolve().parents[1]


def _write_trace(path: Path, arrival_s, input_tokens, output_tokens, abort_s=None) -> Path:
    cols = {"arrival_s": pa.array(np.asarray(arrival_s, dtype=np.float64)),
            "input_tokens": pa.array(np.asarray(input_tokens, dtype=np.int64)),
            "output_tokens": pa.array(np.asarray(output_tokens, dtype=np.int64))}
    if abort_s is not None:
        cols["abort_s"] = pa.array(np.asarray(abort_s, dtype=np.float64), from_pandas=True)
    pq.write_table(pa.table(cols), path)
    return path


def _scenario(path: Path, api_server: bool = False, replicas: int = 1, time_scale: float = 1.0, **engine):
    return scenario_from_dict({
        "name": "abort", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
        "cluster": {"replicas": replicas},
        "engine": {"policy": "chunked", "max_num_batched_tokens": 256, "api_server": api_server, **engine},
        "workload": {"trace": {"path": str(path), "format": "normalized", "time_scale": time_scale}}})


@pytest.fixture()
def trace(tmp_path) -> Path:
    """A trace file for the scenario's workload key (a live simulation takes its requests by inject)."""
    return _write_trace(tmp_path / "unused.parquet", [0.0], [10], [10])


class Ended:
    """``on_end``: every request as it ends."""

    def __init__(self):
        self.reqs = {}

    def __call__(self, finished):
        for r in finished:
            self.reqs[r.request_id] = r


def _until(live: LiveSimulation, done, dt_s: float = 1e-3, limit_s: float = 120.0) -> None:
    """Run the clock on in small steps until ``done()``."""
    while not done():
        assert live.now_s < limit_s, "the state never came"
        live.run_until(live.now_s + dt_s)


def _settle(live: LiveSimulation, dt_s: float = 0.2) -> None:
    """Past the step boundary after an abort (a decode step or a prompt chunk of this model
    takes milliseconds)."""
    live.run_until(live.now_s + dt_s)


def test_abort_while_waiting_lets_the_next_one_in(trace):
    ended = Ended()
    live = LiveSimulation(_scenario(trace, max_num_seqs=1), on_end=ended)
    a = live.inject(200, 400)
    b = live.inject(200, 50)
    c = live.inject(200, 50)
    sched = live.schedulers[0]
    _until(live, lambda: live.request(a).in_decode)
    req_b = live.request(b)
    assert req_b in sched.waiting and req_b.status == "waiting"
    t = live.now_s
    assert live.abort(b, t)
    assert not live.abort(b, t)  # (once)
    _settle(live)
    assert req_b not in sched.waiting and req_b.key not in sched.running
    assert req_b.status == ABORTED and req_b.fail_reason == ABORT_REASON and t <= req_b.finish_s
    live.run_until(math.inf)
    result = live.finish()
    assert ended.reqs[a].status == ended.reqs[c].status == "completed"
    # c took a's place when a finished: b held none
    assert ended.reqs[c].first_scheduled_s == ended.reqs[a].finish_s
    assert math.isnan(ended.reqs[b].first_scheduled_s)
    summary = summarize(result)
    assert (summary["completed"], summary["failed"], summary["simsrv_aborted"]) == (2, 0, 1)
    assert summary["simsrv_classes"]["0"]["failed"] == 0
    assert sched.kv.num_used == 0


def test_abort_mid_prefill_frees_its_blocks_and_keeps_them_cached(trace):
    live = LiveSimulation(_scenario(trace))
    hashes = list(range(250))  # 4,000 prompt tokens in 16-token blocks
    a = live.inject(4000, 10, hash_ids=hashes, hash_block_size=16)
    sched, kv = live.schedulers[0], live.schedulers[0].kv
    req = live.request(a)
    _until(live, lambda: req.num_computed >= 1024)
    assert req.key in sched.prefilling and kv.num_used > 0
    computed = req.num_computed
    live.abort(a, live.now_s)
    _settle(live)
    assert req.status == ABORTED and req.key not in sched.prefilling and req.key not in sched.running
    assert kv.num_used == 0 and not sched.running and not sched.waiting
    assert live.next_event_s() == math.inf  # nothing more is simulated for it
    # its computed blocks stay in the prefix cache (vLLM frees an aborted request's blocks as any
    # finished one's: cached blocks stay evictable): the same prompt hits them
    assert req.num_computed >= computed  # (the chunk in flight at the abort ran to its end)
    b = live.inject(4000, 10, hash_ids=hashes, hash_block_size=16)
    live.run_until(math.inf)
    hit = live.finish().requests.row(b, named=True)["prefix_hit_tokens"]
    assert 0 < hit <= req.num_computed and hit % 16 == 0


def _decoding_run(trace, then):
    """One request decoding alone (a fast-forwarded run of decode steps); ``then(live, t)`` at a
    time ``t`` inside the run; the finished result."""
    live = LiveSimulation(_scenario(trace))
    live.inject(100, 3000)
    _until(live, lambda: live.request(0).in_decode)
    t = live.now_s + 0.0503
    live.run_until(t)
    then(live, t)
    live.run_until(math.inf)
    return live, live.finish(), t


def test_abort_while_decoding_cuts_the_run_as_an_arrival_does(trace):
    live, aborted, t = _decoding_run(trace, lambda live, t: live.abort(0, t))
    _, arrived, _ = _decoding_run(trace, lambda live, t: live.inject(10, 1))
    row = aborted.requests.row(0, named=True)
    assert row["status"] == ABORTED and row["fail_reason"] == ABORT_REASON
    steps = aborted.steps
    run = steps.filter((steps["start_s"] < t) & (steps["start_s"] + steps["duration_s"] >= t))
    assert run.height == 1 and int(run["num_steps"][0]) > 1
    # cut at the boundary of the step running at t, as the arrival at t cuts it
    same = [c for c in run.columns if c != "num_waiting"]  # (the arrival waits)
    assert run.select(same).row(0) == arrived.steps.filter(arrived.steps["start_s"] == run["start_s"][0]).select(same).row(0)
    end = float(run["start_s"][0] + run["duration_s"][0])
    assert end - t < float(run["duration_s"][0]) / int(run["num_steps"][0]) + 1e-12
    assert steps["start_s"].max() <= end  # nothing ran after it: no token simulated past the abort
    assert int(steps["decode_tokens"].sum()) < 3000
    assert live.schedulers[0].kv.num_used == 0 and live.schedulers[0].decode.num_seqs == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_abort_a_preempted_request(trace, mode):
    ended = Ended()
    live = LiveSimulation(_scenario(trace, max_num_batched_tokens=2048, gpu_memory_utilization=0.215,
                                    preemption_mode=mode), on_end=ended)
    sched = live.schedulers[0]
    ids = [live.inject(1500, 2500) for _ in range(6)]
    victim = None

    def preempted() -> bool:
        nonlocal victim
        for rid in ids:
            r = live.request(rid)
            if r is not None and r.status == "waiting" and r.num_preemptions > 0:
                victim = r
                return True
        return False

    _until(live, preempted, dt_s=5e-3)
    assert victim in sched.waiting
    live.abort(victim.request_id, live.now_s)
    _settle(live, 0.02)
    assert victim.status == ABORTED and victim not in sched.waiting and victim.key not in sched.running
    assert victim.key not in sched.kv.tables and sched.kv.swap_in(victim) == 0  # no blocks, no host copy
    live.run_until(math.inf)
    summary = summarize(live.finish())
    assert summary["completed"] == 5 and summary["simsrv_aborted"] == 1 and summary["failed"] == 0
    assert sched.kv.num_used == 0
    assert all(ended.reqs[r].status == "completed" for r in ids if r != victim.request_id)


def test_abort_in_the_front_end_queue(trace):
    ended = Ended()
    live = LiveSimulation(_scenario(trace, api_server=True), on_end=ended)
    a = live.inject(3000, 20)
    assert live.num_at_frontend == 1 and live.request(a) is None
    t = live.now_s
    assert live.abort(a, t)
    assert live.num_at_frontend == 0
    b = live.inject(100, 20)
    live.run_until(math.inf)
    summary = summarize(live.finish())
    req = ended.reqs[a]
    assert req.status == ABORTED and req.finish_s == t and req.replica == -1
    assert math.isnan(req.first_scheduled_s)
    assert ended.reqs[b].status == "completed" and b == 1
    assert summary["simsrv_aborted"] == 1 and summary["completed"] == 1


def test_abort_held_by_the_front_end_at_finish(trace):
    """A request aborted in the front end's queue that the run's finish catches there ends aborted, not failed."""
    live = LiveSimulation(_scenario(trace, api_server=True))
    live.inject(3000, 20)
    live.abort(0, live.now_s)
    live.inject(3000, 20)
    result = live.finish()
    assert result.requests["status"].to_list() == [ABORTED, "failed"]


def test_live_aborts_replay_byte_for_byte(tmp_path, trace):
    """Aborts at arbitrary times of a live run (in every state, with the front end on) and the
    same arrivals and abort times replayed from a trace by ``run_scenario`` (``simsrv run``)
    give the same requests and steps, bit for bit."""
    rng = np.random.default_rng(3)
    n = 160
    t = np.cumsum(rng.exponential(0.03, n))
    t -= t[0]
    inp, out = rng.integers(20, 1500, n), rng.integers(1, 300, n)
    abort = np.full(n, np.nan)
    pick = np.arange(0, n, 4)
    abort[pick] = t[pick] + rng.exponential(0.3, len(pick))
    abort[5] = t[5]  # at its arrival: in the front end's queue
    live = LiveSimulation(_scenario(trace, api_server=True, replicas=2))
    events = sorted([(float(t[i]), 0, i) for i in range(n)]
                    + [(float(abort[i]), 1, i) for i in range(n) if not math.isnan(abort[i])])
    for when, kind, i in events:
        if kind == 0:
            live.run_until(when)
            assert live.inject(int(inp[i]), int(out[i])) == i
        else:
            live.abort(i, when)
    live.run_until(math.inf)
    served = live.finish()
    replay = run_scenario(_scenario(_write_trace(tmp_path / "t.parquet", t, inp, out, abort),
                                    api_server=True, replicas=2))
    assert served.steps.height > 200
    assert served.requests.equals(replay.requests) and served.steps.equals(replay.steps)
    status = served.requests["status"]
    aborted = served.requests.filter(status == ABORTED)
    assert aborted.height > 20
    assert aborted["first_token_s"].is_nan().sum() > 0 and aborted["first_token_s"].is_not_nan().sum() > 0
    assert summarize(replay)["simsrv_aborted"] == aborted.height


def test_trace_abort_before_arrival_is_refused(tmp_path):
    path = _write_trace(tmp_path / "bad.parquet", [0.0, 1.0], [10, 10], [5, 5], [np.nan, 0.5])
    with pytest.raises(UserError, match="abort_s"):
        run_scenario(_scenario(path))


def test_trace_abort_times_follow_the_time_scale(tmp_path):
    """abort_s is on arrival_s's clock: a trace that starts later and is scaled maps both alike."""
    path = _write_trace(tmp_path / "t.parquet", [10.0, 11.0], [100, 100], [2000, 5], [10.5, np.nan])
    result = run_scenario(_scenario(path, time_scale=2.0))
    assert result.requests["status"].to_list() == [ABORTED, "completed"]
    assert 1.0 <= result.requests["finish_s"][0] < 1.1  # (10.5 - 10) x 2, then the step boundary


# -- simsrv serve: a client that goes away -----------------------------------------------------------

def _metric(text: str, name: str, extra: str = "") -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and extra in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def _post(host: str, port: int, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def test_serve_aborts_a_request_whose_client_goes_away(tmp_path):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    out = tmp_path / "served"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "serve", str(ROOT / "scenarios" / "chat.yaml"), "--port", "0", "--out",
         str(out), "--speed", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path)
    try:
        line = proc.stdout.readline()
        assert "http://" in line, line + proc.stderr.read()
        base = line.split("http://", 1)[1].split()[0].removesuffix("/v1")
        host, port = base.rsplit(":", 1)

        def metrics() -> str:
            with urllib.request.urlopen(f"http://{base}/metrics", timeout=10) as r:
                return r.read().decode()

        def running() -> float:
            return _metric(metrics(), "vllm:num_requests_running")

        def wait_for(done) -> None:
            deadline = time.monotonic() + 5
            while not done():
                assert time.monotonic() < deadline
                time.sleep(0.02)

        # a stream closed after its first tokens (500 asked: at 0.05x it would take minutes)
        s = _post(host, int(port), {"prompt": "hello " * 100, "max_tokens": 500, "stream": True})
        got = b""
        while got.count(b"data:") < 3:
            got += s.recv(65536)
        assert running() == 1.0
        s.close()
        wait_for(lambda: running() == 0.0)
        text = metrics()
        assert _metric(text, "vllm:request_success_total", 'finished_reason="abort"') == 1.0
        assert _metric(text, "vllm:kv_cache_usage_perc") == 0.0
        # a whole answer whose client goes away before it
        s = _post(host, int(port), {"prompt": "hello " * 100, "max_tokens": 500})
        wait_for(lambda: running() == 1.0)
        s.close()
        wait_for(lambda: running() == 0.0)
        assert _metric(metrics(), "vllm:request_success_total", 'finished_reason="abort"') == 2.0
        proc.send_signal(signal.SIGINT)
        log = "".join(proc.communicate(timeout=60))
        assert proc.returncode == 0, log
        assert "2 aborted" in log
    finally:
        if proc.poll() is None:
            proc.kill()
    import polars as pl

    served = pl.read_parquet(out / "requests.parquet")
    assert served["status"].to_list() == [ABORTED, ABORTED]
    arrivals = pl.read_parquet(out / "arrivals.parquet")
    assert arrivals["abort_s"].is_not_null().all()
    assert (arrivals["abort_s"] > arrivals["arrival_s"]).all()
    assert json.loads((out / "result.json").read_text())["simsrv_aborted"] == 2
    # simsrv run on the session's scenario replays the aborts to the same requests and steps
    replay = tmp_path / "replay"
    subprocess.run([sys.executable, "-m", "sim", "run", str(out / "scenario.resolved.yaml"), "--out", str(replay),
                    "-q"], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert pl.read_parquet(replay / "requests.parquet").equals(served)
    assert pl.read_parquet(replay / "steps.parquet").equals(pl.read_parquet(out / "steps.parquet"))


def test_aborts_under_disaggregation_are_refused_in_one_line(tmp_path):
    """Not modelled there yet: a trace's abort_s is an error (not silently ignored), and a
    live server serves the request to its end (``LiveSimulation.can_abort``)."""
    path = _write_trace(tmp_path / "t.parquet", [0.0, 0.5], [500, 500], [50, 50], [np.nan, 0.6])
    s = scenario_from_dict({
        "name": "pd", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}, "cluster": {"replicas": 2},
        "engine": {"policy": "disaggregated"},
        "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1},
                           "kv_transfer": {"bandwidth_gb_per_s": 50, "latency_ms": 0.05}},
        "workload": {"trace": {"path": str(path), "format": "normalized"}}})
    with pytest.raises(UserError, match="colocated replicas only"):
        run_scenario(s)
    assert not LiveSimulation(s).can_abort


def test_an_abort_pending_at_finish_ends_aborted(trace):
    """Aborted during a step that the run's finish cuts short: aborted, not failed."""
    live = LiveSimulation(_scenario(trace))
    live.inject(2000, 50)
    live.run_until(1e-4)  # (its first chunk is in flight)
    live.abort(0, live.now_s)
    assert live.finish().requests["status"].to_list() == [ABORTED]


def test_csv_trace_abort_column_with_empty_fields(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens,abort_s\n0,100,500,0.3\n0.1,100,20,\n")
    result = run_scenario(_scenario(path))
    assert result.requests["status"].to_list() == [ABORTED, "completed"]
    path.write_text("arrival_s,input_tokens,output_tokens,abort_s\n0,100,500,0.3\n0.2,100,20,0.1\n")
    with pytest.raises(UserError, match=r"t.csv: line 3: column abort_s"):
        run_scenario(_scenario(path))
