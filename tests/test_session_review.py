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
