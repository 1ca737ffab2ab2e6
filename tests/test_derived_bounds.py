"""Derived quantities are bounded, not only inputs (issue 38, "Silently wrong").

- Arrival times drawn from a rate, a rate profile, session think times or a closed loop's
  think time, or rescaled from a trace, must end within ``MAX_TIME_S``: one error line naming
  the key (``sim.limits.check_last_arrival_s``), never a run of 0 s steps and dropped requests.
- ``engine.max_num_batched_tokens``: vLLM's start-up rule (vllm/config/scheduler.py
  ``SchedulerConfig._verify_args``) for every policy and pool, a legal default for every
  shipped scenario and policy, and no prefill step over a legal budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.engine.deployment import build_deployment
from sim.errors import UserError
from sim.limits import MAX_TIME_S
from sim.policies import get_policy, policy_names
from sim.policies.budget import policy_engines
from sim.run import run_scenario
from sim.scenario import load_scenario, scenario_from_dict
from sim.workload.build import build_workload
from tests.conftest import small_scenario

ROOT = Path(__file__).resolve().parents[1]


def _synthetic(**over) -> dict:
    raw = small_scenario()
    raw["workload"]["synthetic"].update(num_requests=20, **over)
    return raw


def _workload(raw: dict):
    return build_workload(scenario_from_dict(raw))


# -- arrival times ----------------------------------------------------------------------------

@pytest.mark.parametrize("rate", [1e-20, 5e-324, 1e-9])
def test_a_rate_whose_arrivals_pass_the_time_limit_is_refused_naming_it(rate):
    # 1e-20: arrivals at ~1e21 s (steps of 0 s, latencies 0 or negative); 5e-324: infinite gaps
    # (19 of 20 requests never arrived and vanished from the results); 1e-9: 19 gaps ~2e10 s
    with pytest.raises(UserError, match=r"^workload\.synthetic\.request_rate: .* puts the last arrival at"):
        _workload(_synthetic(request_rate=rate))


def test_a_rate_within_the_limit_still_runs():
    arr = _workload(_synthetic(request_rate=1e-7))  # 19 gaps of ~1e7 s
    assert 0 < arr.arrival_s[-1] <= MAX_TIME_S


@pytest.mark.parametrize("profile", [
    {"shape": "piecewise", "segments": [[1, 1], [1, 1e-15]]},
    {"shape": "diurnal", "min_rate": 0, "max_rate": 1e-15},
])
def test_a_rate_profile_whose_arrivals_pass_the_limit_is_refused(profile):
    with pytest.raises(UserError, match=r"^workload\.synthetic\.rate_profile: .* puts the last arrival at"):
        _workload(_synthetic(rate_profile=profile))


def test_a_diurnal_profile_of_too_many_periods_is_refused_before_its_grid_is_built():
    profile = {"shape": "diurnal", "min_rate": 0, "max_rate": 1, "period_s": 1e-6}  # 2e10 grid points
    with pytest.raises(UserError, match=r"^workload\.synthetic\.rate_profile\.period_s: "):
        _workload(_synthetic(rate_profile=profile))


def test_session_think_times_past_the_limit_are_refused():
    with pytest.raises(UserError, match=r"^workload\.synthetic\.multi_turn\.think_time_s: "):
        _workload(_synthetic(request_rate=100, multi_turn={"think_time_s": 1e10}))


def test_a_closed_loop_whose_think_times_pass_the_limit_is_refused():
    # one client sends all 20: its last request goes out at least 19 x 1e10 s in
    with pytest.raises(UserError, match=r"^workload\.synthetic\.think_time_s: "):
        _workload(_synthetic(max_concurrency=1, think_time_s=1e10))
    _workload(_synthetic(max_concurrency=1, think_time_s=1e8))  # 1.9e9 s: within the limit


def _trace(tmp_path: Path) -> str:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{i * 10},100,10\n" for i in range(11)))
    return str(path)


@pytest.mark.parametrize("key,value", [("time_scale", 1e12), ("target_rate", 1e-12)])
def test_a_trace_rescaled_past_the_limit_is_refused_naming_the_key(tmp_path, key, value):
    raw = small_scenario(workload={"trace": {"path": _trace(tmp_path), "format": "generic", key: value}})
    with pytest.raises(UserError, match=rf"^workload\.trace\.{key}: .* puts the last arrival at"):
        _workload(raw)
    raw["workload"]["trace"][key] = 1e3 if key == "time_scale" else 1e-4  # 0.1 req/s to 1e-4
    assert _workload(raw).arrival_s[-1] == pytest.approx(1e5)  # 100 s of trace x 1e3


def test_a_streamed_trace_rescaled_past_the_limit_is_refused(tmp_path):
    from sim.workload.readers import ReadOptions
    from sim.workload.trace import stream_trace

    with pytest.raises(UserError, match=r"^workload\.trace\.time_scale: "):
        list(stream_trace(_trace(tmp_path), ReadOptions(format="generic"), 1e12, chunk_rows=4))


# -- the token budget -------------------------------------------------------------------------

def _engine(policy: str, **engine) -> dict:
    raw = small_scenario(engine={"policy": policy, **engine})
    if get_policy(policy).pools:
        raw["disaggregation"] = {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}
    return raw


def _deployments(s) -> None:
    """Build every engine of ``s`` as a run does (the replica, or each pool)."""
    if get_policy(s.engine.policy).pools:
        for where, _ in policy_engines(s.engine.policy):
            build_deployment(s, None, None, where)
    else:
        build_deployment(s)


@pytest.mark.parametrize("policy", policy_names())
def test_a_budget_below_max_num_seqs_is_refused_for_every_policy(policy):
    # vLLM: "max_num_batched_tokens (...) must be greater than or equal to max_num_seqs (...)"; a
    # max_num_seqs given (an unset one is never above the budget: EngineArgs._set_default_args)
    with pytest.raises(UserError, match=r"engine\.max_num_batched_tokens 1 must be >= engine\.max_num_seqs 256"):
        scenario_from_dict(_engine(policy, max_num_batched_tokens=1, max_num_seqs=256))


@pytest.mark.parametrize("policy", policy_names())
def test_a_budget_below_max_model_len_is_refused_without_chunked_prefill(policy):
    whole_prompts = not all(chunked for _, chunked in policy_engines(policy))
    raw = _engine(policy, max_num_batched_tokens=1000, max_num_seqs=8, max_model_len=2048)
    if whole_prompts:  # refused by the scenario check, max_model_len given
        with pytest.raises(UserError, match=r"engine\.max_num_batched_tokens 1000 must be >= engine\.max_model_len 2048"):
            scenario_from_dict(raw)
    else:
        _deployments(scenario_from_dict(raw))
    del raw["engine"]["max_model_len"]  # the model's context length (8192), known once it is built
    s = scenario_from_dict(raw)
    if whole_prompts:
        with pytest.raises(UserError, match=r"engine\.max_model_len \(unset: llama-3-8b's context length\) 8192"):
            _deployments(s)
    else:
        _deployments(s)


SHIPPED = sorted(p.name for p in (ROOT / "scenarios").glob("*.yaml") if p.name != "grid_example.yaml")


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_scenario_builds_as_shipped(name):
    _deployments(load_scenario(ROOT / "scenarios" / name))


@pytest.mark.parametrize("policy", policy_names())
@pytest.mark.parametrize("name", SHIPPED)
def test_an_unset_budget_is_legal_for_every_shipped_scenario_and_policy(name, policy):
    """The default of an unset budget passes the rule under every policy (a scenario's other
    keys may not apply to a policy: those refusals are not the budget's)."""
    from sim.files.yamlfile import read_yaml

    raw = read_yaml(ROOT / "scenarios" / name, "scenario file")
    raw.setdefault("engine", {}).pop("max_num_batched_tokens", None)
    raw["engine"]["policy"] = policy
    if get_policy(policy).pools:
        raw.setdefault("disaggregation", {"prefill": {"replicas": 1}, "decode": {"replicas": 1}})
    try:
        _deployments(scenario_from_dict(raw, name, base_dir=str(ROOT / "scenarios")))
    except UserError as err:
        assert "max_num_batched_tokens" not in str(err)


def test_an_unset_budget_without_chunked_prefill_takes_vllms_default():
    # llama-3.1-8b: 131,072 positions; 8192 would be refused, so vLLM's default applies:
    # min(max_num_seqs x max_model_len, max(max_model_len, 2048)) (SchedulerConfig.__post_init__)
    for policy in ("static", "continuous", "disaggregated"):
        raw = _engine(policy, max_num_seqs=8)  # no max_num_batched_tokens
        raw["model"] = "llama-3.1-8b"
        s = scenario_from_dict(raw)
        where = "disaggregation.prefill" if get_policy(policy).pools else "scenario"
        assert build_deployment(s, None, None, where).limits.max_num_batched_tokens == 131072


@pytest.mark.parametrize("policy", ["static", "disaggregated", "continuous"])
def test_no_prefill_step_exceeds_a_legal_budget(policy):
    # static ran a whole batch's prompts (6,458 tokens) in one step and the prefill pool 1,228
    # whatever the budget; 2048 holds every prompt (max_model_len 2048), not a batch of them
    raw = _engine(policy, max_num_batched_tokens=2048, max_model_len=2048, max_num_seqs=16)
    raw["workload"]["synthetic"].update(num_requests=60, request_rate=200,
                                        input_tokens={"dist": "uniform", "min": 300, "max": 1500},
                                        output_tokens={"dist": "fixed", "value": 20})
    r = run_scenario(scenario_from_dict(raw))
    prefill = r.steps["prefill_tokens"]
    assert prefill.max() <= 2048 and prefill.sum() > 60 * 300
    assert r.requests.height == 60 and (r.requests["status"] == "completed").all()


def test_a_static_batch_over_the_budget_is_prefilled_in_steps_then_decoded_together():
    raw = _engine("static", max_num_batched_tokens=2048, max_model_len=2048, max_num_seqs=8)
    raw["workload"]["synthetic"].update(num_requests=8, request_rate="inf",
                                        input_tokens={"dist": "fixed", "value": 1000},
                                        output_tokens={"dist": "fixed", "value": 5})
    raw["engine"]["enable_prefix_caching"] = False
    raw["engine"]["api_server"] = False  # all 8 reach the engine at once (no API server between)
    r = run_scenario(scenario_from_dict(raw))
    steps = r.steps
    prompt_steps = steps.filter(steps["prefill_tokens"] > 0)
    # four prompt steps of two 1000-token prompts, no decode among them, then one batch of 8 decodes
    assert prompt_steps["prefill_tokens"].to_list() == [2000] * 4
    assert (prompt_steps["decode_tokens"] == 0).all()
    decodes = steps.filter(steps["prefill_tokens"] == 0)
    assert set(decodes["num_seqs"].to_list()) == {8}


@pytest.mark.parametrize("cls", ["static", "prefill"])
def test_a_hand_built_scheduler_fails_a_prompt_over_its_budget_with_the_reason(cls):
    """The scenario check keeps every prompt within a legal budget; a scheduler built by hand
    (tests, library use) with a smaller one fails such a prompt with the reason instead of
    leaving it waiting forever (static) or running it over the budget (the prefill pool)."""
    from sim.core.kv import KVBlockManager
    from sim.core.request import Request
    from sim.policies import POLICIES, EngineLimits
    from sim.policies.disagg import PrefillScheduler

    limits = EngineLimits(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=10_000)
    sched = (POLICIES["static"] if cls == "static" else PrefillScheduler)(limits, KVBlockManager(100, 16, False))
    req = Request(request_id=0, arrival_s=0.0, prompt_tokens=65, output_tokens=1)
    assert not sched.add_request(req, 0.0)
    assert req.status == "failed" and "prompt 65 tokens > max_num_batched_tokens 64" in req.fail_reason
