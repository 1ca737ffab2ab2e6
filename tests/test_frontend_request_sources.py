"""The per-request front-end cost of the vLLM V1 profiles (issue 37 item 1) is the figure its cited
public measurement gives, and no profile carries such a cost without naming its source.

Source (sim/catalog/engine_profiles.yaml header, "frontend_request_ms"): andyluo7/cpu-gpu-codesign-
agentic-inference @ 7006a687, results/phase2-deepdive/server_decomposition.json: vLLM 0.19.0's OpenAI
server, one streamed /v1/chat/completions request at a time, the mean time from sending a request to
its response headers (the serving layer's parse, validation, chat template and tokenisation: vLLM
returns its StreamingResponse after them, before the engine sees the request) against vLLM's own
prompt-token count. A least-squares line through the four sizes: its intercept is the per-request
part, its slope the per-token part (tokenisation and the payload that grows with the prompt)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.analysis.explain import explain
from sim.cost.engine_profile import profile_entry, profile_names
from sim.engine.deployment import build_deployment
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from tests.conftest import small_scenario

MS = 1e-3
# (prompt tokens per request: vllm:request_prompt_tokens_sum / count, mean ms to the response
# headers: t_http_overhead_ms_mean) for the source's single_1k, single_8k, single_32k, single_100k
HEADERS_MS = ((9950 / 5, 6.998852640390396), (29950 / 5, 15.202923119068146),
              (59112 / 3, 46.5388490508), (175680 / 3, 131.42361926535764))
V1_PROFILES = ("vllm-v1", "vllm-v1-0.34")  # vLLM V1's API server (AsyncLLM), the source's 0.19 between them


def _fit_ms() -> tuple[float, float]:
    """(intercept ms, slope ms per token) of the least-squares line through the source's points."""
    tokens, ms = np.array(HEADERS_MS).T
    slope, intercept = np.polyfit(tokens, ms, 1)
    return float(intercept), float(slope)


def test_v1_request_term_is_the_measured_intercept():
    intercept, slope = _fit_ms()
    assert intercept == pytest.approx(2.53, abs=0.01) and slope == pytest.approx(0.00220, abs=1e-5)
    for name in V1_PROFILES:
        p = profile_entry(name)
        assert p["frontend_request_ms"] == pytest.approx(round(intercept, 1)), name
        # the fit's own per-token slope cross-checks the profile's tokenisation term (kept)
        assert slope / p["frontend_per_prompt_token_ms"] == pytest.approx(1.0, abs=0.1), name


def test_every_per_request_term_names_its_source():
    """A profile's per-request front-end cost is a cited figure: its sources name the term."""
    costed = [n for n in profile_names() if profile_entry(n)["frontend_request_ms"] > 0.0]
    assert set(V1_PROFILES) <= set(costed)
    for name in costed:
        assert any("frontend_request_ms" in s for s in profile_entry(name)["sources"]), name


def _one_request(prompt: int, api_server: bool) -> dict:
    """One request on an idle engine, the default (vllm-v1) profile, no overrides."""
    raw = small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 4096, "api_server": api_server})
    raw["workload"]["synthetic"] = {"num_requests": 1, "request_rate": 1.0,
                                    "input_tokens": {"dist": "fixed", "value": prompt},
                                    "output_tokens": {"dist": "fixed", "value": 8}}
    return raw


def test_default_profile_client_ttft_pays_the_request_term():
    prompt = 256
    p = profile_entry(scenario_from_dict(_one_request(prompt, True)).engine.profile)
    assert p["frontend_request_ms"] > 0.0
    on, off = (run_scenario(scenario_from_dict(_one_request(prompt, a))) for a in (True, False))
    # in: the request and its tokenisation; out: the first token alone (a chunk of one)
    front_ms = (p["frontend_request_ms"] + p["frontend_per_prompt_token_ms"] * prompt
                + p["frontend_chunk_ms"] + p["frontend_per_output_token_ms"])
    ttft_on, ttft_off = on.request_column("ttft_s")[0], off.request_column("ttft_s")[0]
    assert ttft_on - ttft_off == pytest.approx(front_ms * MS, rel=1e-9)
    e = explain(build_deployment(scenario_from_dict(_one_request(prompt, True))), prompt, 1)
    assert e["frontend_in_ms_at_context"] == pytest.approx(p["frontend_request_ms"]
                                                           + p["frontend_per_prompt_token_ms"] * prompt)



def test_live_run_is_its_replay_to_the_bit_where_the_arrival_timer_rounds(tmp_path):
    """A live run (``simsrv serve``) gives the requests ``simsrv run`` gives for its recorded
    arrivals, to the bit, also where the replay's arrival process (sim/engine/arrivals.py: from
    the previous arrival's event time ``prev``, ``at_from(prev, t - prev)``) fires a rounding away
    from the request's time ``t``: the live hand-off fires where the replay's does and the
    request arrives at ``t`` as there (sim/live.py ``inject``)."""
    from sim.engine.deployment import engine_profile
    from sim.engine.frontend import EntryQueue, Frontend
    from sim.live import LiveSimulation

    prompt, out = 300, 8
    path = tmp_path / "trace.csv"

    def scenario():
        return scenario_from_dict({
            "name": "live", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
            "engine": {"policy": "chunked", "max_num_batched_tokens": 4096},
            "workload": {"trace": {"path": str(path), "format": "generic", "time_unit": "s",
                                   "columns": {"arrival": "arrival_s", "input": "input", "output": "output"}}}})

    path.write_text("arrival_s,input,output\n0.0,1,1\n")
    s = scenario()
    fe = Frontend.of(engine_profile(s.engine), s.engine.stream_interval)
    c = float(fe.input_s(np.array([prompt]))[0])

    def misses(arrivals: list[float]) -> bool:
        """Whether the replay's timer fires the last request a rounding away from its time."""
        prev = fire = 0.0
        for e in EntryQueue().entries(np.array(arrivals), np.full(len(arrivals), c)).tolist():
            prev = fire = prev + (e - prev)
        return fire != e

    a2 = next(a for a in (0.9 + k * 0.00137 for k in range(2000)) if misses([0.0, 0.37, a]))
    rows = [(0.0, prompt, out), (0.37, prompt, out), (a2, prompt, out)]
    path.write_text("arrival_s,input,output\n" + "".join(f"{t!r},{i},{o}\n" for t, i, o in rows))
    replay = run_scenario(scenario())
    live = LiveSimulation(scenario())
    for t, i, o in rows:
        live.run_until(t)
        live.inject(i, o)
    live.run_until(float("inf"))
    result = live.finish()
    assert result.requests["status"].to_list() == ["completed"] * 3
    assert result.requests.equals(replay.requests) and result.steps.equals(replay.steps)
