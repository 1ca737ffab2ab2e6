"""Per-request and front-end costs (issue 37 item 1): the serving front end's terms add to the
client's times as stated, offline runs pay none, the TTFT parts (front end included) add up to
the client's TTFT, an overlapping front end delays requests while an in-process one lengthens
steps, the per-chunk cost follows the streamed chunks, and the keys are documented and checked."""

from __future__ import annotations

import numpy as np
import pytest

from sim.core.ttft import ENGINE_TTFT_PARTS, FRONTEND_PART, TTFT_PARTS
from sim.cost.engine_profile import FRONTEND_MS_KEYS, get_profile
from sim.engine.columns import ColumnBuffer
from sim.engine.deployment import build_deployment
from sim.engine.frontend import EntryQueue, Frontend, shifted
from sim.errors import UserError
from sim.metrics.summary import summarize
from sim.run import run_scenario
from sim.scenario import EngineOverhead, scenario_from_dict
from sim.workload.arrays import RequestArrays
from tests.conftest import ROOT, small_scenario

MS = 1e-3


def _one_request(prompt: int = 128, output: int = 16, **engine) -> dict:
    """One request on an idle engine: nothing waits on anything else."""
    raw = small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 4096, **engine})
    raw["workload"]["synthetic"] = {"num_requests": 1, "request_rate": 1.0,
                                    "input_tokens": {"dist": "fixed", "value": prompt},
                                    "output_tokens": {"dist": "fixed", "value": output}}
    return raw


def _run(raw: dict):
    return run_scenario(scenario_from_dict(raw))


def _col(res, name):
    return res.request_column(name)


FE = {"frontend_request_ms": 3.0, "frontend_per_prompt_token_ms": 0.01, "frontend_per_output_token_ms": 0.2,
      "frontend_chunk_ms": 0.5}


def test_frontend_terms_add_as_stated():
    f = Frontend(request_s=3 * MS, per_prompt_token_s=0.01 * MS, per_output_token_s=0.2 * MS, chunk_s=0.5 * MS,
                 stream_interval=4)
    assert f.input_s(np.array([100]))[0] == pytest.approx(3 * MS + 1 * MS)
    # the first token goes alone; then chunks of 4, the last holding what is left
    n = np.array([1, 2, 5, 6, 9])
    assert f.num_chunks(n).tolist() == [1, 2, 2, 3, 3]
    assert f.first_out_s(n) == pytest.approx(np.full(5, 0.7 * MS))
    assert f.last_out_s(n) == pytest.approx(0.5 * MS + 0.2 * MS * np.array([1, 1, 4, 1, 4]))
    assert f.output_work_s(n) == pytest.approx(0.5 * MS * f.num_chunks(n) + 0.2 * MS * n)


def test_entry_queue_is_one_fifo_server_across_chunks():
    rng = np.random.default_rng(3)
    a = np.cumsum(rng.exponential(0.002, 500))
    c = rng.uniform(0.0005, 0.004, 500)
    expect, last = [], -np.inf
    for ai, ci in zip(a, c):  # e_i = max(a_i, e_{i-1}) + c_i, one by one
        last = max(ai, last) + ci
        expect.append(last)
    q = EntryQueue()
    got = np.concatenate([q.entries(a[i:i + 70], c[i:i + 70]) for i in range(0, 500, 70)])
    assert got == pytest.approx(np.array(expect), rel=0, abs=1e-12)
    assert (np.diff(got) >= 0).all() and (got - a >= c - 1e-12).all()
    # a stream of chunks is shifted as the whole array is, and each request's time in the front end recorded
    f = Frontend(request_s=1 * MS, per_prompt_token_s=0.01 * MS, per_output_token_s=0.0, chunk_s=0.0)
    arrays = RequestArrays(a, rng.integers(1, 400, 500), rng.integers(1, 50, 500))
    whole_rec, stream_rec = ColumnBuffer(("frontend_in_s",)), ColumnBuffer(("frontend_in_s",))
    whole = shifted(arrays, f, whole_rec)
    parts = list(shifted((arrays.take(np.arange(i, min(i + 64, 500))) for i in range(0, 500, 64)), f, stream_rec))
    assert np.concatenate([p.arrival_s for p in parts]) == pytest.approx(whole.arrival_s, rel=0, abs=1e-12)
    whole_rec.finish(), stream_rec.finish()
    assert stream_rec.read("frontend_in_s") == pytest.approx(whole.arrival_s - a, rel=0, abs=1e-12)


def test_online_adds_frontend_in_and_first_chunk_to_ttft_and_last_chunk_to_e2el():
    off = _run(_one_request(api_server=False, overhead=FE))
    on = _run(_one_request(api_server=True, overhead=FE))
    fin = 3 * MS + 0.01 * MS * 128
    first_out, last_out = 0.5 * MS + 0.2 * MS, 0.5 * MS + 0.2 * MS
    assert _col(on, "ttft_s")[0] == pytest.approx(_col(off, "ttft_s")[0] + fin + first_out, rel=1e-12)
    assert _col(on, "e2el_s")[0] == pytest.approx(_col(off, "e2el_s")[0] + fin + last_out, rel=1e-12)
    assert _col(on, "tpot_s")[0] == pytest.approx(_col(off, "tpot_s")[0], rel=1e-12)  # overlapped: steps unchanged
    assert _col(on, FRONTEND_PART)[0] == pytest.approx(fin + first_out, rel=1e-12)
    # the client sends at its arrival time; the engine saw the request fin later
    assert _col(on, "arrival_s")[0] == pytest.approx(_col(off, "arrival_s")[0], abs=1e-12)
    assert _col(on, "queue_s")[0] == pytest.approx(_col(off, "queue_s")[0], abs=1e-12)


def test_offline_pays_no_frontend_term():
    dep = build_deployment(scenario_from_dict(_one_request(api_server=False, overhead=FE)))
    eng = dep.cost.engine
    assert all(getattr(eng, k[:-3] + "_s") == 0.0 for k in FRONTEND_MS_KEYS)
    assert Frontend.of(eng) is None
    res = _run(small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 512, "api_server": False,
                                      "overhead": FE}))
    assert res.frontend is None and res.frontend_in is None
    assert not _col(res, FRONTEND_PART).any()
    # and an offline run is the run of the same engine with every front-end term at 0
    zero = {k: 0.0 for k in FRONTEND_MS_KEYS}
    same = _run(small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 512, "overhead": zero}))
    assert np.array_equal(_col(res, "ttft_s"), _col(same, "ttft_s"))
    assert np.array_equal(_col(res, "e2el_s"), _col(same, "e2el_s"))


@pytest.mark.parametrize("engine", [
    {"policy": "chunked", "max_num_batched_tokens": 512},
    {"policy": "continuous", "profile": "sglang"},
    {"policy": "chunked", "max_num_batched_tokens": 512, "overhead": {**FE, "frontend_overlap": False,
                                                                      "per_prompt_chunk_ms": 0.7}},
])
def test_ttft_parts_add_up_exactly_to_the_clients_ttft(engine):
    raw = small_scenario(engine={**engine, "overhead": {**FE, **engine.get("overhead", {})}})
    raw["workload"]["synthetic"]["request_rate"] = 60  # queueing in the front end and the engine
    res = _run(raw)
    frame = res.request_frame()
    ok = frame["status"].to_numpy() == "completed"
    parts = sum(frame[p].to_numpy()[ok] for p in TTFT_PARTS)
    assert parts == pytest.approx(frame["ttft_s"].to_numpy()[ok], rel=1e-9, abs=1e-12)
    assert min(frame[p].to_numpy()[ok].min() for p in TTFT_PARTS) >= -1e-12
    assert TTFT_PARTS == (*ENGINE_TTFT_PARTS, FRONTEND_PART)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ttft_parts_add_up_for_drawn_terms(seed):
    rng = np.random.default_rng(seed)
    over = {k: float(rng.uniform(0.0, 2.0)) for k in FRONTEND_MS_KEYS}
    over["frontend_per_prompt_token_ms"] /= 100
    over.update(frontend_overlap=bool(seed % 2), per_prompt_chunk_ms=float(rng.uniform(0.0, 1.0)))
    raw = small_scenario(engine={"policy": ("chunked", "continuous")[seed % 2], "max_num_batched_tokens": 8192,
                                 "stream_interval": int(rng.integers(1, 5)), "overhead": over})
    raw["workload"]["synthetic"].update(num_requests=80, request_rate=float(rng.uniform(5.0, 80.0)))
    frame = _run(raw).request_frame()
    ok = frame["status"].to_numpy() == "completed"
    parts = sum(frame[p].to_numpy()[ok] for p in TTFT_PARTS)
    assert parts == pytest.approx(frame["ttft_s"].to_numpy()[ok], rel=1e-9, abs=1e-12)
    assert min(frame[p].to_numpy()[ok].min() for p in TTFT_PARTS) >= -1e-12
    assert (frame["arrival_s"].to_numpy() <= frame["first_scheduled_s"].to_numpy()).all()


def test_frontend_queue_delays_simultaneous_requests_one_after_another():
    raw = small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 8192,
                                 "overhead": {"frontend_request_ms": 10.0}})
    raw["workload"]["synthetic"] = {"num_requests": 5, "request_rate": float("inf"),
                                    "input_tokens": {"dist": "fixed", "value": 64},
                                    "output_tokens": {"dist": "fixed", "value": 4}}
    res = _run(raw)
    spent = res.frontend_in.read("frontend_in_s")
    base = 64 * 0.0021 * MS  # the profile's tokenisation
    assert spent == pytest.approx((10 * MS + base) * np.arange(1, 6), rel=1e-9)


def test_overlapping_frontend_delays_requests_in_process_frontend_lengthens_steps():
    off = _run(_one_request(api_server=False, overhead=FE))
    inproc = _run(_one_request(overhead={**FE, "frontend_overlap": False}))
    # no client-side term: the front end's work is in the engine's (serial, vllm-v1) steps
    assert inproc.frontend is None and not _col(inproc, FRONTEND_PART).any()
    per_token = 0.2 * MS + 0.5 * MS  # detokenise one token, one SSE event per token (stream_interval 1)
    assert _col(inproc, "tpot_s")[0] == pytest.approx(_col(off, "tpot_s")[0] + per_token, rel=1e-9)
    # the prompt's step pays the request and its tokenisation (and the first token's output work)
    fin = 3 * MS + 0.01 * MS * 128
    assert _col(inproc, "ttft_s")[0] == pytest.approx(_col(off, "ttft_s")[0] + fin + per_token, rel=1e-9)
    assert _col(inproc, "ttft_overhead_s")[0] == pytest.approx(_col(off, "ttft_overhead_s")[0] + fin + per_token,
                                                               rel=1e-9)


def test_per_chunk_cost_scales_with_streamed_chunks():
    out = 33
    chunk = {"frontend_chunk_ms": 2.0, "frontend_per_output_token_ms": 0.0, "frontend_request_ms": 0.0,
             "frontend_per_prompt_token_ms": 0.0}
    # in the engine's thread: each scheduled sequence pays 1/stream_interval of an event per step
    tpot = {k: _col(_run(_one_request(output=out, stream_interval=k, overhead={**chunk, "frontend_overlap": False})),
                    "tpot_s")[0] for k in (1, 4)}
    assert tpot[1] - tpot[4] == pytest.approx(2 * MS * (1 - 1 / 4), rel=1e-9)
    # in its own process: the server's output work is one event per chunk (1 + ceil(32 / k))
    f1, f4 = (Frontend.of(get_profile("custom", chunk), k) for k in (1, 4))
    assert f1.output_work_s(np.array([out]))[0] == pytest.approx(33 * 2 * MS)
    assert f4.output_work_s(np.array([out]))[0] == pytest.approx(9 * 2 * MS)


def test_engine_side_prompt_host_work_is_step_cpu_and_engine_overhead():
    base = _run(_one_request(api_server=False))
    setup = _run(_one_request(api_server=False, overhead={"per_prompt_chunk_ms": 2.0, "per_prompt_token_ms": 0.01}))
    extra = 2 * MS + 0.01 * MS * 128
    assert _col(setup, "ttft_s")[0] == pytest.approx(_col(base, "ttft_s")[0] + extra, rel=1e-9)
    assert _col(setup, "ttft_overhead_s")[0] == pytest.approx(_col(base, "ttft_overhead_s")[0] + extra, rel=1e-9)
    assert _col(setup, "tpot_s")[0] == pytest.approx(_col(base, "tpot_s")[0], rel=1e-12)  # decode steps: no prompts


def test_closed_loop_applies_the_frontend_inside_the_simulation():
    # (issue 37, closed-loop phase-locking: was "not applied"; tests/test_online_ttft.py has the rest)
    raw = _one_request(overhead=FE)
    raw["workload"]["synthetic"].update(num_requests=3, max_concurrency=1)
    off = dict(raw, engine={**raw["engine"], "api_server": False})
    on, offr = _run(raw), _run(off)
    # one client: each request pays the input side (3 + 1.28 ms) and the first chunk (0.7 ms)
    assert on.frontend is not None and on.frontend_in is not None
    assert _col(on, "ttft_s") == pytest.approx(_col(offr, "ttft_s") + 4.98 * MS)
    s = summarize(on)
    assert s["simsrv_frontend"] == "own process"
    assert not any("front end" in n for n in s["simsrv_uncertainty"])
    assert summarize(offr)["simsrv_frontend"] == "offline"
    assert not any("front end" in n for n in summarize(offr)["simsrv_uncertainty"])
    # a front end in the engine's thread is step time: it applies under a closed loop too
    inproc = dict(raw, engine={**raw["engine"], "overhead": {**FE, "frontend_overlap": False}})
    r = _run(inproc)
    assert summarize(r)["simsrv_frontend"] == "in the engine's steps"
    assert (_col(r, "ttft_s") > _col(offr, "ttft_s") + 3 * MS).all()


def test_summary_and_explain_show_the_terms():
    from sim.analysis.explain import explain

    res = _run(_one_request(overhead=FE))
    s = summarize(res)
    prof = s["simsrv_engine_profile"]
    assert prof["frontend_request_ms"] == pytest.approx(3.0) and prof["frontend_overlap"] is True
    assert s["simsrv_frontend"] == "own process"
    e = explain(build_deployment(scenario_from_dict(_one_request(overhead=FE))), 1000, 1)
    assert e["frontend_in_ms_at_context"] == pytest.approx(3.0 + 0.01 * 1000)
    assert e["frontend_first_chunk_ms"] == pytest.approx(0.7)
    off = explain(build_deployment(scenario_from_dict(_one_request(api_server=False, overhead=FE))), 1000, 1)
    assert off["frontend_in_ms_at_context"] == 0.0 and off["frontend_first_chunk_ms"] == 0.0


def test_keys_are_documented_and_checked():
    readme = (ROOT / "README.md").read_text()
    new_keys = [k for k in EngineOverhead.model_fields if k.startswith(("frontend_", "per_prompt_"))]
    assert len(new_keys) == 7
    for k in [*new_keys, "api_server", "stream_interval", "ttft_frontend_s", "frontend_in_ms_at_context",
              "frontend_first_chunk_ms", "prompt_host_ms_at_context"]:
        assert f"`{k}`" in readme or f"{k}:" in readme, k
    with pytest.raises(UserError):
        scenario_from_dict(_one_request(stream_interval=0))
    with pytest.raises(UserError):
        scenario_from_dict(_one_request(overhead={"frontend_chunk_ms": -1.0}))
    with pytest.raises(UserError):
        scenario_from_dict(_one_request(api_server=1))  # strict: no 1 for true
