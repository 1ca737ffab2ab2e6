"""Speculative decoding's ITL (issue 40 item 1): a step's accepted tokens reach the client as one
streamed chunk, so ITL has one gap per step per sequence (vLLM bench serve pools the gaps between
chunks), not one per token; TPOT stays the mean per token."""

from __future__ import annotations

import pytest

from sim.metrics.summary import summarize
from sim.run import run_scenario
from sim.scenario import scenario_from_dict


def _one_request(e: float, k: int, out: int) -> dict:
    raw = {"name": "itl", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
           "engine": {"api_server": False, "speculative_config": {"method": "eagle", "num_speculative_tokens": k,
                                                                  "acceptance_length": e}},
           "workload": {"max_tokens": "output",
                        "synthetic": {"num_requests": 1, "request_rate": 1.0,
                                      "input_tokens": {"dist": "fixed", "value": 200},
                                      "output_tokens": {"dist": "fixed", "value": out}}}}
    return summarize(run_scenario(scenario_from_dict(raw)))


@pytest.mark.parametrize("e,k,steps", [(2.0, 3, 50), (2.5, 3, 40), (1.25, 2, 80), (4.0, 4, 25)])
def test_one_gap_per_step(e, k, steps):
    """101 tokens: the first from the prompt's step, the other 100 at E a step (floor((s+1)E) -
    floor(sE) at step s), so ``steps`` decode steps and as many gaps; the mean ITL is the decode
    time over the steps, E times the TPOT."""
    r = _one_request(e, k, 101)
    decode_ms = r["mean_e2el_ms"] - r["mean_ttft_ms"]
    assert r["mean_itl_ms"] == pytest.approx(decode_ms / steps, rel=1e-9)
    assert r["mean_tpot_ms"] == pytest.approx(decode_ms / 100, rel=1e-9)
    assert r["mean_itl_ms"] == pytest.approx(r["mean_tpot_ms"] * 100 / steps, rel=1e-9)
