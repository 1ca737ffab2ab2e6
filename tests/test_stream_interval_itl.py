"""Issue 37: with ``engine.stream_interval`` N > 1 a client receives a request's first token
alone, then a chunk every N tokens (the last what is left), and measures ITL between chunks
(vLLM bench serve); TPOT is unchanged (sim/metrics/chunk_itl.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.engine.frontend import Frontend
from sim.errors import UserError
from sim.metrics.summary import summarize
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from tests.conftest import small_scenario

MS = 1e-3


def _one_request(output: int, **engine) -> dict:
    raw = small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 4096, **engine})
    raw["workload"]["synthetic"] = {"num_requests": 1, "request_rate": 1.0,
                                    "input_tokens": {"dist": "fixed", "value": 128},
                                    "output_tokens": {"dist": "fixed", "value": output}}
    return raw


def _run(raw):
    res = run_scenario(scenario_from_dict(raw))
    return res, summarize(res)


@pytest.mark.parametrize("output", [2, 5, 17, 64])
def test_batch_one_gaps_are_n_steps_and_add_up_to_the_decode_time(output):
    """One request alone: each decode step takes the same time (within a fraction of a
    percent: its context grows), so the median gap is N steps; mean ITL x gaps = its decode time
    as the client sees it; TPOT is the same as with N = 1."""
    n_int = 4  # (offline: no front-end terms, so the chunks' detokenisation does not move TPOT)
    _, one = _run(_one_request(output, stream_interval=1, api_server=False))
    res4, four = _run(_one_request(output, stream_interval=n_int, api_server=False))
    assert four["mean_tpot_ms"] == pytest.approx(one["mean_tpot_ms"], rel=1e-12)
    gaps = (output - 2) // n_int + 1
    assert four["simsrv_num_itl_samples"] == gaps == Frontend(0, 0, 0, 0, n_int).num_chunks(np.array([output]))[0] - 1
    decode_s = res4.request_column("finish_s")[0] - res4.request_column("first_token_s")[0]
    assert four["mean_itl_ms"] * gaps == pytest.approx(decode_s / MS, rel=1e-9)
    step_ms = one["median_itl_ms"]
    if output - 1 >= 2 * n_int:  # full chunks are the majority
        assert four["median_itl_ms"] == pytest.approx(n_int * step_ms, rel=5e-3)


def test_stream_interval_one_is_per_token():
    """N = 1: the step log's pooled gaps, as before (one per decode step per sequence)."""
    _, one = _run(_one_request(17, stream_interval=1))
    assert one["simsrv_num_itl_samples"] == 16


def test_frontend_detokenisation_shifts_the_first_and_last_gap():
    """With a per-output-token front-end term p, a chunk of m tokens reaches the client p x m
    after its last token: the first gap (1 token before, N after) is (N - 1) p longer."""
    over = {"frontend_per_output_token_ms": 0.2, "frontend_chunk_ms": 0.5}
    _, plain = _run(_one_request(9, stream_interval=4, api_server=False))
    res, fe = _run(_one_request(9, stream_interval=4, overhead=over))
    # 9 tokens: chunks of 1, 4, 4: gaps of N steps each, the first (4 - 1) x 0.2 ms longer
    assert fe["simsrv_num_itl_samples"] == 2
    assert fe["max_itl_ms"] if "max_itl_ms" in fe else True
    assert fe["mean_itl_ms"] == pytest.approx(plain["mean_itl_ms"] + 3 * 0.2 / 2, rel=1e-9)
    client_decode = res.request_column("finish_s")[0] - res.request_column("first_token_s")[0]
    assert fe["mean_itl_ms"] * 2 == pytest.approx(client_decode / MS, rel=1e-9)


@pytest.mark.parametrize("policy,mode,memory", [("chunked", "recompute", 0.9), ("chunked", "recompute", 0.235),
                                                ("continuous", "recompute", 0.235), ("chunked", "swap", 0.235)])
def test_loaded_runs_pool_one_gap_per_chunk_and_sum_to_the_decode_times(policy, mode, memory):
    """Many requests, batches that change every step and (with a small KV cache) preemptions,
    recomputed or swapped: every completed request gives ceil((n - 1) / N) gaps, and the pooled
    gaps sum to the requests' decode times (each request's token times are checked against its
    output tokens inside, its breaks included)."""
    n_int = 3
    engine = {"policy": policy, "stream_interval": n_int, "max_num_batched_tokens": 8192 if policy == "continuous" else 2048,
              "gpu_memory_utilization": memory, "preemption_mode": mode, "api_server": False}
    raw = small_scenario(engine=engine, seed=2)
    raw["workload"]["synthetic"].update(num_requests=120, request_rate=60.0)
    res, out = _run(raw)
    ok = res.completed()
    n = res.request_column("output_tokens")[ok]
    assert out["simsrv_num_itl_samples"] == int(((n[n > 1] - 2) // n_int + 1).sum())
    decode_s = (res.request_column("finish_s") - res.request_column("first_token_s"))[ok][n > 1].sum()
    assert out["mean_itl_ms"] * out["simsrv_num_itl_samples"] == pytest.approx(decode_s / MS, rel=1e-9)
    if memory < 0.5:
        assert sum(len(s.itl_breaks) for s in res.schedulers) > 0


@pytest.mark.parametrize("engine", [{"num_scheduler_steps": 4, "policy": "continuous"}])
def test_multi_step_with_a_stream_interval_is_refused(engine):
    with pytest.raises(UserError, match="stream_interval"):
        scenario_from_dict(_one_request(9, stream_interval=4, **engine))
