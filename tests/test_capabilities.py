"""Capabilities, not names: what a policy supports is declared on its PolicySpec, and the
scenario's checks, run, compare, diagnose and capacity ask the spec. A test policy registered
with other capabilities is validated and handled by them, and no module outside
sim/policies/ compares policy names."""

import re
from pathlib import Path

import pytest

from sim.analysis.compare import policy_scenarios
from sim.cli.run_cmd import overrides
from sim.errors import UserError
from sim.policies import registry
from sim.policies.chunked import ChunkedScheduler
from sim.policies.continuous import ContinuousScheduler
from sim.policies.static import StaticScheduler
from sim.scenario import scenario_from_dict
from sim.sweep.cheapest import searched_policies
from tests.conftest import small_scenario

SIM = Path(__file__).resolve().parent.parent / "sim"


@pytest.fixture
def register():
    """Register test specs for one test; removed after it."""
    added = []

    def add(name, scheduler, **caps):
        spec = registry.register(registry.PolicySpec(name, "a test policy", scheduler, (), order=caps.pop("order", 50),
                                                     **caps))
        added.append(name)
        return spec

    yield add
    for name in added:
        del registry._REGISTRY[name]


def _load(policy, **engine):
    return scenario_from_dict(small_scenario(engine={"policy": policy, **engine}))


def test_multi_step_follows_the_spec_and_the_error_lists_the_takers(register):
    register("multi_chunk", ChunkedScheduler, chunked_prefill=True, multi_step=True)
    register("whole", ContinuousScheduler)  # continuous's scheduler without its capabilities
    assert _load("multi_chunk", num_scheduler_steps=4).engine.num_scheduler_steps == 4
    with pytest.raises(UserError, match="needs engine.policy: continuous and multi_chunk and preemption_mode"):
        _load("whole", num_scheduler_steps=4)


def test_capacity_scheduler_policy_follows_the_spec(register):
    register("no_evict_static", StaticScheduler, iteration_level=False,
             capacity_scheduler_policies=("max_utilization", "guaranteed_no_evict"))
    s = _load("no_evict_static", capacity_scheduler_policy="guaranteed_no_evict")
    assert s.engine.capacity_scheduler_policy == "guaranteed_no_evict"
    register("evicting", ContinuousScheduler)
    with pytest.raises(UserError, match="applies to policies continuous, chunked and no_evict_static, not evicting"):
        _load("evicting", capacity_scheduler_policy="guaranteed_no_evict")


def test_admission_modes_follow_the_spec(register):
    register("sglang_static", StaticScheduler, admission_modes=("vllm", "sglang"))
    assert _load("sglang_static", admission="sglang").engine.admission == "sglang"
    register("vllm_only", ContinuousScheduler)
    with pytest.raises(UserError, match="sglang applies to policies continuous, chunked and sglang_static"):
        _load("vllm_only", admission="sglang")
    register("sglang_only", ContinuousScheduler, admission_modes=("sglang",))
    with pytest.raises(UserError, match="engine.admission: vllm does not apply to policy sglang_only"):
        _load("sglang_only")


def test_separate_prefill_steps_follow_the_spec(register):
    register("split_static", StaticScheduler, separate_prefill_steps=True)
    assert _load("split_static", separate_prefill_steps=True).engine.separate_prefill_steps
    register("joined", ContinuousScheduler)
    with pytest.raises(UserError, match="applies to policy continuous and split_static .whole prompts., not joined"):
        _load("joined", separate_prefill_steps=True)


def test_pipeline_parallel_follows_the_spec(register):
    register("one_stage", ContinuousScheduler, pipeline_parallel=False)
    raw = small_scenario(engine={"policy": "one_stage"})
    raw["cluster"] = {"pipeline_parallel_size": 2}
    with pytest.raises(UserError, match="pipeline_parallel_size applies to colocated replicas"):
        scenario_from_dict(raw)
    raw["engine"]["policy"] = "continuous"
    assert scenario_from_dict(raw).cluster.pipeline_parallel_size == 2


def test_data_parallel_follows_the_spec(register):
    register("no_dp", ContinuousScheduler, data_parallel=False)
    raw = small_scenario(engine={"policy": "no_dp"})
    raw["cluster"] = {"data_parallel_size": 2, "enable_expert_parallel": True}
    with pytest.raises(UserError, match="data_parallel_size > 1 applies to colocated replicas of one pipeline stage"):
        scenario_from_dict(raw)


def test_chunk_option_selects_the_policy_whose_budget_is_its_chunk(register, tmp_path):
    assert overrides(None, 512, []) == ["engine.policy=chunked", "engine.max_num_batched_tokens=512"]
    register("early_chunks", ChunkedScheduler, chunked_prefill=True, order=-1)
    assert registry.chunk_policy() == "early_chunks"
    assert overrides(None, 512, [])[0] == "engine.policy=early_chunks"
    with pytest.raises(UserError, match="--chunk 512 means --policy early_chunks, but --policy chunked was given"):
        overrides("chunked", 512, [])
    # compare applies --chunk to every policy whose budget is its chunk size, and to no other
    path = tmp_path / "s.yaml"
    import yaml

    path.write_text(yaml.safe_dump(small_scenario(engine={"max_model_len": 2048, "max_num_batched_tokens": 2048})))
    runs = policy_scenarios(path, ["early_chunks", "chunked", "continuous"], 1024, [])
    assert [s.engine.max_num_batched_tokens for s in runs[:2]] == [1024, 1024]
    assert runs[2].engine.max_num_batched_tokens == 2048


def test_capacity_searches_the_colocated_iteration_level_policies(register):
    assert searched_policies() == ["chunked", "continuous"]
    register("batch_at_once", StaticScheduler, iteration_level=False)
    register("chunky", ChunkedScheduler, chunked_prefill=True)
    register("pooled", None, pools=True)
    assert searched_policies() == ["chunked", "chunky", "continuous"]


def test_diagnose_proposes_chunked_prefill_from_the_spec(register):
    from sim.analysis.diagnose_fixes import whole_trace_candidates
    from sim.workload import build_workload

    register("whole_prompts", ContinuousScheduler)
    register("own_chunks", ChunkedScheduler, chunked_prefill=True)
    for policy, proposed in (("whole_prompts", True), ("own_chunks", False), ("static", True), ("chunked", False)):
        s = _load(policy)
        names = [c.name for c, _ in whole_trace_candidates(s, build_workload(s), False)]
        assert ("chunked prefill" in names) == proposed, policy


NAME_COMPARISON = re.compile(r"""\bpolicy\s*(==|!=|in\s*\(|not\s+in\s*\()|["'](static|continuous|chunked|disaggregated)["']""")


def test_no_policy_name_comparisons_outside_the_policy_modules():
    """Only sim/policies/ names policies; elsewhere a name is a default value (``policy: str =
    "continuous"``, ``.get("policy", "continuous")``), never a condition."""
    hits = []
    for path in sorted(SIM.rglob("*.py")):
        if path.parent.name == "policies":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if NAME_COMPARISON.search(code) and not re.search(r"""policy: str = "|get\("policy", \"""", code):
                if re.search(r"policy\s*(==|!=)\s*(chunked|base\.engine\.policy)\b", code):
                    continue  # compares with a name read from the registry or the scenario
                hits.append(f"{path.relative_to(SIM.parent)}:{n}: {line.strip()}")
    assert hits == []
