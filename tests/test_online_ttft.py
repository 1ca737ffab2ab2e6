"""Online TTFT as the client measures it under a closed loop (issue 37, "Closed-loop clients
phase-lock"): a closed loop's requests go through the serving front end too. Each client is free
when its request's last chunk reached it and sends the next one at once (vLLM bench
``--max-concurrency``: a semaphore, no delay between requests); the requests pass the API
server one at a time, so clients released together reach the engine one input cost apart, never
at one instant; the client's times add the front end exactly as in an open loop."""

from __future__ import annotations

import numpy as np
import pytest

from sim.engine.frontend import ClosedLoopFrontend, Frontend
from sim.metrics.summary import summarize
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from tests.conftest import small_scenario

MS = 1e-3
FE = {"frontend_request_ms": 3.0, "frontend_per_prompt_token_ms": 0.01, "frontend_per_output_token_ms": 0.2,
      "frontend_chunk_ms": 0.5}


def _closed_loop(clients: int, requests: int, prompt: int = 128, output: int = 16, **engine) -> dict:
    raw = small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 4096, **engine})
    raw["workload"]["synthetic"] = {"num_requests": requests, "request_rate": "inf", "max_concurrency": clients,
                                    "input_tokens": {"dist": "fixed", "value": prompt},
                                    "output_tokens": {"dist": "fixed", "value": output}}
    return raw


def _run(raw: dict):
    return run_scenario(scenario_from_dict(raw))


def test_closed_loop_entry_is_the_api_servers_fifo():
    f = Frontend(request_s=3 * MS, per_prompt_token_s=0.01 * MS, per_output_token_s=0.2 * MS, chunk_s=0.5 * MS,
                 stream_interval=1)
    c = ClosedLoopFrontend(f)
    # three sent at one instant enter one input cost apart; a later one waits for the server
    e = [c.entry(1.0, 100) for _ in range(3)] + [c.entry(1.005, 100)]
    assert np.diff(e[:3]) == pytest.approx([4 * MS, 4 * MS])
    assert e[0] == pytest.approx(1.0 + 4 * MS) and e[3] == pytest.approx(e[2] + 4 * MS)
    c.spent_in.finish()
    assert c.spent_in.read("frontend_in_s") == pytest.approx(np.array(e) - [1.0, 1.0, 1.0, 1.005])
    assert c.client_free_after_s(16) == pytest.approx(float(f.last_out_s(np.array([16]))[0]))


@pytest.mark.parametrize("clients", [1, 4])
def test_closed_loop_applies_the_frontend(clients):
    raw = _closed_loop(clients, 3 * clients, overhead=FE)
    on = _run(raw)
    off = _run({**raw, "engine": {**raw["engine"], "api_server": False}})
    s = summarize(on)
    assert s["simsrv_frontend"] == "own process"
    assert not any("front end" in n for n in s["simsrv_uncertainty"])
    ttft_on, ttft_off = on.request_column("ttft_s"), off.request_column("ttft_s")
    # the client waits at least the input cost (3 ms + 1.28 ms) and the first chunk (0.7 ms) more
    assert (on.request_column("ttft_frontend_s") >= (4.28 + 0.7) * MS - 1e-9).all()
    if clients == 1:  # nothing else changes: the engine sees one request at a time either way
        assert ttft_on == pytest.approx(ttft_off + (4.28 + 0.7) * MS)
    # the parts add up to the client's TTFT, front end included
    parts = on.request_frame().select([c for c in on.request_frame().columns if c.startswith("ttft_") and
                                       c != "ttft_s"]).to_numpy().sum(axis=1)
    assert parts == pytest.approx(ttft_on, abs=1e-9)
    # a client sends its next request only when its last chunk reached it
    arrival, finish = on.request_column("arrival_s"), on.request_column("finish_s")
    sent_after = np.sort(arrival)[clients:]
    assert (sent_after >= np.sort(finish)[:len(sent_after)] - 1e-12).all()


def test_clients_released_together_do_not_enter_together():
    """The class of the phase-lock bug: clients released by one step's finishes all reach the
    engine at one instant. With any input cost they enter one after another, ``c`` apart."""
    raw = _closed_loop(8, 32, overhead=FE)
    res = _run(raw)
    c_s = (3.0 + 0.01 * 128) * MS
    engine_arrival = res.request_column("arrival_s") + np.asarray(res.frontend_in.read("frontend_in_s"))
    gaps = np.diff(np.sort(engine_arrival))
    assert gaps.min() >= c_s - 1e-9
    # vs. no front end: the first wave of 8 all reach the engine at the same instant
    off = _run({**raw, "engine": {**raw["engine"], "api_server": False}})
    assert np.count_nonzero(off.request_column("arrival_s") == 0.0) == 8


def test_closed_loop_same_seed_same_result():
    raw = _closed_loop(4, 12, overhead=FE)
    a, b = _run(raw), _run(raw)
    for col in ("arrival_s", "ttft_s", "e2el_s"):
        assert np.array_equal(a.request_column(col), b.request_column(col))
