"""Speculative decoding (engine.speculative_config; issue 40 item 1): the expected tokens a step
emits, the step's cost (verify + draft), the token budget, and spec off unchanged."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.core.kv import KVBlockManager
from sim.cost.speculative import expected_tokens_per_step
from sim.engine.deployment import build_deployment
from sim.errors import UserError
from sim.metrics.summary import summarize
from sim.policies.decode_set import DecodeSet
from sim.run import run_scenario
from sim.scenario import scenario_from_dict

EAGLE = {"method": "eagle", "num_speculative_tokens": 2, "acceptance_length": 1.89}


def _raw(spec=None, n=40, rate=4.0, out_mean=120, seqs=256, **engine):
    eng = {"policy": "chunked", "max_num_seqs": seqs, **engine}
    if spec is not None:
        eng["speculative_config"] = spec
    return {"name": "sd", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}, "engine": eng,
            "workload": {"synthetic": {"num_requests": n, "request_rate": rate,
                                       "input_tokens": {"dist": "lognormal", "mean": 300, "sigma": 0.5, "max": 2048},
                                       "output_tokens": {"dist": "lognormal", "mean": out_mean, "sigma": 0.3,
                                                         "max": 1024}}}}


def _run(raw, **kw):
    return run_scenario(scenario_from_dict(raw), **kw)


def test_expected_length_formula():
    """E = 1 + sum_i prod_{j<=i} a_j (Leviathan et al. 2023): rates 0.8, 0.5, 0.5 give
    1 + 0.8 + 0.4 + 0.2; none accepted gives the bonus token alone, all accepted k + 1."""
    assert expected_tokens_per_step([0.8, 0.5, 0.5]) == pytest.approx(2.4)
    assert expected_tokens_per_step([0.0, 1.0]) == 1.0
    assert expected_tokens_per_step([1.0] * 4) == 5.0


@pytest.mark.parametrize("milli", [1000, 1890, 2400, 2999, 3000, 4687])
def test_step_tokens_sum_to_the_floor(milli):
    """Every sequence gains floor((s+1)E) - floor(sE) tokens at step s: after s steps the set
    has emitted floor(sE) per sequence exactly (no drift, whatever E)."""
    ds = DecodeSet(KVBlockManager(1000, 16))
    ds.spec_milli = milli
    total = 0
    for s in range(1, 1000):
        total += ds.spec_step_tokens()
        ds.engine_steps += 1
        assert total == s * milli // 1000
        assert ds.spec_step_tokens() in (milli // 1000, -(-milli // 1000))


def test_tpot_at_batch_one_falls_by_e_less_the_draft():
    """One request alone: TPOT off is the decode step; on, it is (verify + draft step) / E."""
    raw_on, raw_off = _raw(EAGLE, n=1, out_mean=400), _raw(None, n=1, out_mean=400)
    on, off = summarize(_run(raw_on)), summarize(_run(raw_off))
    spec = build_deployment(scenario_from_dict(raw_on)).cost.spec_run
    ctx = 300 + 200
    b = (1, ctx, (), 1, 1, 0, 1)
    step_off = spec.target.run_cost_values(b)[0]
    step_on = spec.verify_values(b)[0] + spec.draft_s(1, ctx, ())
    assert step_on > step_off  # verification and the draft cost something
    expect = off["mean_tpot_ms"] * (step_on / step_off) / 1.89
    assert on["mean_tpot_ms"] == pytest.approx(expect, rel=0.05)
    # (verification's extra token and EAGLE-1's two draft passes, each the head's layer, its fc and
    # the target's LM head: about a quarter of the step at batch 1, sim/cost/speculative.py)
    assert on["mean_tpot_ms"] < off["mean_tpot_ms"] / 1.89 * 1.3
    # ITL per streamed chunk: one gap per step, carrying E tokens
    assert on["mean_itl_ms"] == pytest.approx(on["mean_tpot_ms"] * 1.89, rel=0.05)


def test_budget_counts_one_plus_k_per_decode():
    """A decode takes 1 + k tokens of max_num_batched_tokens (vLLM V1 num_tokens_with_spec):
    with a budget of 20 and k = 4, at most 4 decodes share a step."""
    spec = {"method": "ngram", "num_speculative_tokens": 4, "acceptance_rates": [0.5, 0.5, 0.5, 0.5]}
    raw = _raw(spec, n=30, rate=math.inf, seqs=8, max_num_batched_tokens=20)
    r = _run(raw)
    steps = r.steps
    decode_seqs = np.asarray(steps["decode_tokens"]) // np.maximum(np.asarray(steps["num_steps"]), 1)
    assert summarize(r)["completed"] == 30
    assert decode_seqs.max() == 4
    off = _run(_raw(None, n=30, rate=math.inf, seqs=8, max_num_batched_tokens=20))
    off_seqs = np.asarray(off.steps["decode_tokens"]) // np.maximum(np.asarray(off.steps["num_steps"]), 1)
    assert off_seqs.max() > 4


def test_off_is_unchanged():
    """speculative_config unset and null: the same run, no speculative pricing."""
    a, b = _run(_raw(None)), _run({**_raw(None), "engine": {**_raw(None)["engine"], "speculative_config": None}})
    assert summarize(a)["mean_tpot_ms"] == summarize(b)["mean_tpot_ms"]
    dep = build_deployment(scenario_from_dict(_raw(None)))
    assert dep.cost.spec_run is None and dep.limits.spec_tokens_per_step_milli == 0


def test_fast_forward_setting_does_not_change_spec_runs():
    """Speculative steps run one at a time: capping runs at one step changes nothing."""
    raw = _raw(EAGLE, n=40, rate=8.0)
    a, b = summarize(_run(raw)), summarize(_run(raw, max_run_steps=1))
    for key in ("mean_ttft_ms", "p99_tpot_ms", "mean_itl_ms", "mean_e2el_ms", "simsrv_num_steps"):
        assert a[key] == b[key], key


def test_every_token_is_counted():
    """Output tokens on = off: a step that overshoots a request's end is cut to it."""
    on, off = summarize(_run(_raw(EAGLE))), summarize(_run(_raw(None)))
    assert on["total_output_tokens"] == off["total_output_tokens"]
    assert on["completed"] == off["completed"] == 40


def test_high_load_throughput_falls_with_a_costly_draft():
    """Saturated at a large batch with a draft model (Llama-3.2-1B, 4 drafts, low acceptance),
    the verification work (5 tokens a decode through the GEMMs) and the draft's steps cost more
    than the accepted tokens give: throughput below spec off; at batch 1 TPOT still falls."""
    spec = {"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4, "acceptance_length": 2.0}
    hi = {"n": 600, "rate": math.inf, "out_mean": 100, "seqs": 512}
    on, off = summarize(_run(_raw(spec, **hi))), summarize(_run(_raw(None, **hi)))
    assert on["output_throughput"] < off["output_throughput"]
    lo_on, lo_off = summarize(_run(_raw(spec, n=1))), summarize(_run(_raw(None, n=1)))
    assert lo_on["mean_tpot_ms"] < lo_off["mean_tpot_ms"]


@pytest.mark.parametrize("spec,words", [
    ({"method": "eagle", "num_speculative_tokens": 2}, "no default"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "acceptance_length": 1.5}, "draft model"),
    ({"method": "eagle", "num_speculative_tokens": 2, "acceptance_rates": [0.5]}, "1 rates"),
    ({"method": "eagle", "num_speculative_tokens": 2, "acceptance_length": 3.5}, "the most a step can emit"),
])
def test_bad_config_is_one_line(spec, words):
    with pytest.raises((UserError, ValueError)) as e:
        scenario_from_dict(_raw(spec))
    assert words in str(e.value)


def test_sliding_window_model_refused():
    raw = {**_raw(EAGLE), "model": "mistral-7b-v0.1-window"}
    with pytest.raises(UserError, match="sliding-window"):
        build_deployment(scenario_from_dict(raw))


def test_diagnose_offers_turning_it_off():
    """diagnose's candidates: speculative decoding off where it is on, and only there (turning it
    on needs an acceptance the scenario lacks)."""
    from types import SimpleNamespace

    from sim.analysis.diagnose_fixes import whole_trace_candidates

    arrays = SimpleNamespace(hash_ids=None)
    on = whole_trace_candidates(scenario_from_dict(_raw(EAGLE)), arrays, False)
    off = whole_trace_candidates(scenario_from_dict(_raw(None)), arrays, False)
    assert [sets for c, sets in on if c.name == "speculative decoding off"] == [["engine.speculative_config=null"]]
    assert not [c for c, _ in off if "speculative" in c.name]


def test_two_drafts_beat_four_at_batch_one():
    """vLLM PR 16035 (EAGLE, Llama-3-8B-Instruct, MT-Bench, one sequence): k = 2 with acceptance
    1.89 gave more output tok/s than k = 4 with 2.08; the longer draft's passes cost more than
    its extra accepted tokens give, here too."""
    def tput(k, al):
        spec = {"method": "eagle", "num_speculative_tokens": k, "acceptance_length": al}
        return summarize(_run(_raw(spec, n=20, rate=math.inf, seqs=1)))["output_throughput"]

    off = summarize(_run(_raw(None, n=20, rate=math.inf, seqs=1)))["output_throughput"]
    assert tput(2, 1.89) > tput(4, 2.08) > off


def test_capacity_searches_speculative_on_and_off():
    """capacity --rate --search speculative: both shapes simulated, the answer says which; a
    scenario without speculative_config refuses the dimension in one line."""
    from sim.sweep.cheapest import cheapest_deployment, parse_search
    from sim.sweep.executors import SerialExecutor
    from sim.sweep.slo import parse_slo

    raw = _raw(EAGLE, n=60, rate=4.0)
    s = scenario_from_dict(raw)
    res = cheapest_deployment(s, parse_slo("tpot_p99_ms=8"), 4.0, parse_search("speculative"), [0],
                              SerialExecutor(), pareto=False)
    assert sorted(sh.values["speculative"] for sh in res.shapes) == ["off", "on"]
    assert res.answer is not None and res.answer["speculative"] == "on"  # ~5 ms a token on, ~8 off
    with pytest.raises(UserError, match="no engine.speculative_config"):
        cheapest_deployment(scenario_from_dict(_raw(None)), parse_slo("tpot_p99_ms=8"), 4.0,
                            parse_search("speculative"), [0], SerialExecutor(), pareto=False)


def test_unknown_draft_model_names_its_key():
    spec = {"method": "draft_model", "model": "no-such-model", "num_speculative_tokens": 2, "acceptance_length": 1.5}
    with pytest.raises(UserError, match=r"^engine\.speculative_config\.model: unknown model 'no-such-model'"):
        build_deployment(scenario_from_dict(_raw(spec)))


# -- invariants over random workloads (tests/test_properties.py's harness) ----------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (pytest's importlib mode: tests/ is not on the path)
from test_properties import COST, _check, workloads  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(w=workloads(), policy=st.sampled_from(["chunked", "continuous"]), blocks=st.integers(3, 60),
       bs=st.sampled_from([1, 4, 16]), budget=st.integers(64, 600), seqs=st.integers(1, 40),
       k=st.integers(1, 6), e_frac=st.floats(0.0, 1.0), caching=st.booleans(),
       mode=st.sampled_from(["recompute", "swap"]))
def test_spec_invariants(w, policy, blocks, bs, budget, seqs, k, e_frac, caching, mode):
    """Speculative decoding under any load and KV size: nothing lost, KV within capacity and all
    given back, every output token emitted once, the pooled gaps adding up to each request's
    decode time."""
    from sim.core.kv import KVBlockManager
    from sim.engine.cluster import simulate
    from sim.engine.router import make_router
    from sim.policies import POLICIES, EngineLimits

    milli = 1000 + int(round(e_frac * k * 1000))  # E in [1, k + 1]
    limits = EngineLimits(max_num_seqs=min(seqs, budget), max_num_batched_tokens=budget, max_model_len=10_000,
                          preemption_mode=mode, num_speculative_tokens=k, spec_tokens_per_step_milli=milli)
    scheds = [POLICIES[policy](limits, KVBlockManager(blocks, bs, caching))]
    reqs, rec = simulate(w, scheds, [COST], make_router("round_robin"), swap_s_per_block=1e-5)
    _check(w, reqs, rec, scheds, [blocks])
