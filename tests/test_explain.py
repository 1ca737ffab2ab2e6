"""``simsrv explain`` figures that users check by hand (issue 2)."""

import pytest

from sim.engine.deployment import build_deployment
from sim.analysis.explain import EXPLAIN_KEYS, explain
from sim.scenario import scenario_from_dict
from tests.conftest import small_scenario


def _dep(model, gpu, tp, **engine):
    return build_deployment(scenario_from_dict(small_scenario(
        model=model, hardware={"gpu": gpu}, cluster={"tensor_parallel_size": tp, "replicas": 1},
        engine={"policy": "continuous", **engine})))


def test_llama3_70b_kv_and_decode_floor_on_4xh100():
    e = explain(_dep("llama-3-70b", "h100-sxm", 4), context_tokens=8192, batch=1)
    assert tuple(e) == EXPLAIN_KEYS
    assert e["kv_bytes_per_token"] == 327_680
    assert e["kv_bytes_per_token"] * 8192 / 2**30 == pytest.approx(2.5)
    # ~35 GB of weights per GPU at 3.35 TB/s (+ one sequence's KV shard): about 10 ms
    assert e["weight_bytes_per_gpu"] / 1e9 == pytest.approx(35.3, abs=0.2)
    assert 10.0 < e["decode_step_floor_ms"] < 11.0


def test_intensities_sit_either_side_of_the_ridge():
    e = explain(_dep("llama-3-8b", "h100-sxm", 1), context_tokens=2048, batch=1)
    assert e["prefill_intensity_flops_per_byte"] > e["ridge_flops_per_byte"] > e["decode_intensity_flops_per_byte"]
    assert e["decode_intensity_flops_per_byte"] == pytest.approx(1.0, rel=0.2)  # ~1 FLOP/byte at batch 1
    assert e["max_seqs_at_context"] == e["kv_capacity_tokens"] // 2048
