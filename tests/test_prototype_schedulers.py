"""The 2023 research prototypes' cases (VC-19 DeepSpeed-FastGen, VC-22 and VC-23 Sarathi-Serve) run
the prototypes as their own code does, where simsrv has a key for it (issue 37, 2023 engines):

- both runtimes run every step eager (sarathi-serve ModelRunner.run calls the model directly;
  DeepSpeed inference v2's InferenceEngineV2.put captures no CUDA graph) and all-reduce through
  torch.distributed, NCCL at every size (sarathi-serve tensor_parallel/mappings.py ``_reduce``;
  DeepSpeed inference v2's ``dist.all_reduce``), never vLLM's graphs or custom all-reduce, which the
  stand-in profile ``vllm-v0`` has;
- sarathi-serve's Orca scheduler checks no token count (orca_scheduler.py; OrcaSchedulerConfig's
  budget is max_num_seqs x max_model_len), so it batches whole prompts past any fixed budget;
- DeepSpeedExamples' MII benchmark server sets max_ragged_sequence_count to max_ragged_batch_size.
"""

from __future__ import annotations

import copy

import pytest

from sim.analysis.validate import load_rows, validation_dir
from sim.engine.deployment import engine_profile
from sim.run import run_scenario
from sim.scenario import scenario_from_dict

PROTOTYPE_CASES = ("VC-19", "VC-22", "VC-23")


def _scenario(scen: dict, where: str):
    return scenario_from_dict(copy.deepcopy(scen), f"test {where}", base_dir=str(validation_dir()))


def _rows(case: str):
    return [r for r in load_rows() if r.case == case and r.scenario is not None]


@pytest.mark.parametrize("case", PROTOTYPE_CASES)
def test_prototype_rows_run_eager_steps_and_nccl_all_reduce(case):
    rows = _rows(case)
    assert rows, case
    for r in rows:
        p = engine_profile(_scenario(r.scenario, r.id).engine)
        assert not p.cuda_graph_decode, r.id
        assert not p.custom_allreduce, r.id


def test_sarathi_orca_batches_whole_prompts_past_any_token_budget():
    """Three 4,000-token prompts arriving together: sarathi-serve's Orca scheduler admits all three
    into one iteration (12,000 prompt tokens: it checks max_num_seqs and KV only), where a fixed
    8,192-token budget would admit two."""
    rows = {r.id: r for r in load_rows() if r.case == "VC-22"}
    orca = [r for r in rows.values() if r.id.endswith("/orca") and r.scenario is not None]
    assert orca
    for r in orca:
        scen = copy.deepcopy(r.scenario)
        scen["workload"] = {"max_tokens": "output", "synthetic": {
            "num_requests": 3, "request_rate": float("inf"),
            "input_tokens": {"dist": "fixed", "value": 4000}, "output_tokens": {"dist": "fixed", "value": 2}}}
        res = run_scenario(_scenario(scen, r.id))
        assert int(res.steps["prefill_tokens"][0]) == 12000, r.id


def test_fastgen_row_takes_the_benchmark_servers_sequence_limit():
    """DeepSpeedExamples benchmarks/inference/mii/server.py: DSStateManagerConfig(max_ragged_batch_size=b,
    max_ragged_sequence_count=b), b = 768 by default."""
    for r in _rows("VC-19"):
        e = _scenario(r.scenario, r.id).engine
        if e.policy == "chunked":
            assert e.max_num_batched_tokens == 768, r.id
            assert e.max_num_seqs == e.max_num_batched_tokens, r.id
