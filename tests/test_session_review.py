"""Review of the session's change 39bd249..14901bb: the fixes it needed, each pinned here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.cost.engine_profile import profile_entry
from sim.errors import UserError
from sim.scenario import load_scenario

from tests.conftest import small_scenario


def _scenario_beside_profile(tmp_path: Path, covers: bool, name: str = "trt.yaml") -> Path:
    """A scenario file and a profile file (``trt-llm``'s keys, its ``budget_covers_max_model_len``
    set to ``covers``) in one directory, the scenario naming the profile by its relative name;
    the budget (2048) below max_model_len (2176) without chunked prefill."""
    d = tmp_path / "scen"
    d.mkdir(parents=True)
    prof = profile_entry("trt-llm")
    prof["budget_covers_max_model_len"] = covers
    (d / name).write_text(yaml.safe_dump(prof))
    over = small_scenario(engine={"policy": "continuous", "profile": name, "max_num_batched_tokens": 2048,
                                  "max_num_seqs": 256, "max_model_len": 2176})
    over["workload"] = {"max_tokens": "output", "synthetic": {
        "num_requests": 4, "request_rate": 100, "input_tokens": {"dist": "fixed", "value": 128},
        "output_tokens": {"dist": "fixed", "value": 16}}}
    path = d / "scenario.yaml"
    path.write_text(yaml.safe_dump(over))
    return path


@pytest.mark.parametrize("where", ["beside", "elsewhere"])
def test_a_relative_profile_files_budget_rule_holds_from_any_directory(tmp_path, monkeypatch, where):
    """The scenario check of the budget against max_model_len reads the profile file's
    ``budget_covers_max_model_len`` where the scenario finds the file (its own directory), not
    only from the current directory: the same scenario is accepted whatever directory it is run
    from, and a file keeping vLLM's rule is refused from any."""
    path = _scenario_beside_profile(tmp_path, covers=False)
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(path.parent if where == "beside" else other)
    s = load_scenario(path)
    assert Path(s.engine.profile).is_absolute()

    refused = _scenario_beside_profile(tmp_path / "vllm-rule", covers=True, name="vllm_rule.yaml")
    with pytest.raises(UserError, match="must be >= engine.max_model_len 2176"):
        load_scenario(refused)


def _colocated_whole_prompt_policies() -> tuple[str, ...]:
    from sim.policies.budget import policy_engines
    from sim.policies.registry import policy_names

    return tuple(n for n in policy_names() if policy_engines(n) == (("engine", False),))


@pytest.mark.parametrize("policy", _colocated_whole_prompt_policies())
def test_a_prompt_over_the_budget_fails_with_its_reason_under_every_whole_prompt_policy(policy):
    """``trt-llm`` lets the budget sit below max_model_len; every colocated policy that prefills
    whole prompts then fails a longer prompt with its reason (nothing left waiting forever)."""
    from sim.run import run_scenario
    from sim.scenario import scenario_from_dict

    assert {"static", "continuous"} <= set(_colocated_whole_prompt_policies())
    over = small_scenario(engine={"policy": policy, "profile": "trt-llm", "max_num_batched_tokens": 2048,
                                  "max_num_seqs": 64, "max_model_len": 4096})
    over["workload"] = {"max_tokens": "output", "synthetic": {
        "num_requests": 4, "request_rate": 100, "input_tokens": {"dist": "fixed", "value": 3000},
        "output_tokens": {"dist": "fixed", "value": 16}}}
    res = run_scenario(scenario_from_dict(over))
    status = res.requests["status"]
    assert int((status == "failed").sum()) == 4
    assert all("max_num_batched_tokens 2048" in str(r) for r in res.requests["fail_reason"])


def test_a_relative_profile_files_release_holds_from_any_directory(tmp_path, monkeypatch):
    """The GPU's default budget follows the profile file's ``vllm_release`` (0.34: 16,384 on a
    B200, 0.11: 8,192) where the scenario finds the file, from any current directory: the limits
    check and the defaults read the same resolved file."""
    d = tmp_path / "scen"
    d.mkdir()
    (d / "v034.yaml").write_text(yaml.safe_dump(profile_entry("vllm-v1-0.34")))
    over = small_scenario(engine={"policy": "chunked", "profile": "v034.yaml"})
    over["hardware"] = {"gpu": "b200"}
    path = d / "scenario.yaml"
    path.write_text(yaml.safe_dump(over))
    other = tmp_path / "elsewhere"
    other.mkdir()
    for cwd in (d, other):
        monkeypatch.chdir(cwd)
        assert load_scenario(path).engine.max_num_batched_tokens == 16384, cwd
