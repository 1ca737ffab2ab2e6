"""Attention backends (issue 10 section 3): engine.attention_backend selects the attention
kernels' cost rules; TensorRT-LLM's pre-XQA masked MHA re-reads an 8-bit GQA KV head per query
head; TensorRT-LLM sizes its KV cache from the memory free after the weights."""

from __future__ import annotations

import pytest

from sim.core.batch import Batch
from sim.cost.attention_backend import backend_names, get_backend
from sim.cost.calibration import load_calibration
from sim.cost.engine_profile import get_profile, profile_names
from sim.cost.roofline import RooflineCostModel
from sim.cost.runs import RUN_REL_TOL
from sim.engine.deployment import build_deployment
from sim.errors import UserError
from sim.spec.hardware import get_gpu
from sim.spec.memory import plan_memory
from sim.spec.models import get_model
from sim.scenario import scenario_from_dict
from tests.conftest import small_scenario


def _cm(backend: str, kv_bytes: int, model: str = "llama-2-70b", gpu: str = "h200", tp: int = 2,
        calibrated: bool = True) -> RooflineCostModel:
    g = get_gpu(gpu)
    return RooflineCostModel(get_model(model), g, tp, kv_bytes, engine=get_profile("trt-llm", {"attention_backend": backend}),
                             calibration=load_calibration(g.key) if calibrated else None)


def _attn_s(cm, n: int = 256, ctx: int = 2000) -> float:
    return cm.step_time(Batch(num_decode_seqs=n, decode_context_tokens=n * ctx, num_logits=n)).ops_s["attn_decode"]


def test_every_profile_names_a_known_backend():
    for name in profile_names():
        get_backend(get_profile(name).attention_backend)
    assert {"flash-attn", "flashinfer", "xformers", "trtllm", "trtllm-mmha"} <= set(backend_names())


@pytest.mark.parametrize("calibrated", [True, False])
def test_mmha_reads_an_8bit_gqa_cache_once_per_query_head(calibrated):
    """Llama-2-70B at TP2: 32 query heads on 4 KV heads per GPU. With an fp8 cache the masked
    MHA kernel streams each KV head 8 times: at a long context, where the read is bandwidth
    bound, decode attention costs about 8x XQA's. (A 16-bit cache's re-reads come from L2:
    tests/test_engine_generations.py.)"""
    xqa, mmha = _cm("trtllm", 1, calibrated=calibrated), _cm("trtllm-mmha", 1, calibrated=calibrated)
    assert mmha.decode_kv_reads == 8 and xqa.decode_kv_reads == 1
    assert 6.0 < _attn_s(mmha) / _attn_s(xqa) < 9.0
    # MHA (Llama-2-7B): a group of one head, nothing re-read
    assert _cm("trtllm-mmha", 1, model="llama-2-7b", tp=1).decode_kv_reads == 1


def test_mmha_runs_still_fast_forward_exactly():
    """The re-read factor scales bytes and the table lookup alike: a 1,500-step run costs
    what its steps cost one at a time."""
    cm = _cm("trtllm-mmha", 1)
    n, c0 = 64, 64 * 130
    total = cm.step_time(Batch(num_decode_seqs=n, decode_context_tokens=c0, num_logits=n, num_steps=1500)).total_s
    one = sum(cm.run_cost(Batch(num_decode_seqs=n, decode_context_tokens=c0 + i * n, num_logits=n)).first_s
              for i in range(1500))
    assert total == pytest.approx(one, rel=RUN_REL_TOL)


def test_scenario_key_selects_the_backend_and_unknown_names_fail():
    dep = build_deployment(scenario_from_dict(small_scenario(engine={"profile": "trt-llm", "attention_backend": "trtllm-mmha"})))
    assert dep.cost.engine.attention_backend == "trtllm-mmha"
    assert build_deployment(scenario_from_dict(small_scenario(engine={"profile": "sglang"}))).cost.engine.attention_backend == "flashinfer"
    with pytest.raises(UserError, match="engine.attention_backend: Input should be 'flash-attn'"):
        scenario_from_dict(small_scenario(engine={"attention_backend": "fa9"}))
    with pytest.raises(UserError, match="engine.attention_backend: unknown attention backend 'fa9'"):
        get_profile("trt-llm", {"attention_backend": "fa9"})  # engine.overhead's key, checked by the profile


def test_trtllm_sizes_kv_from_free_memory():
    """vLLM: 0.9 x total - weights - reserve; TensorRT-LLM: 0.9 x (total - weights - reserve)."""
    m, g = get_model("llama-3-8b"), get_gpu("h100-sxm")
    tot = plan_memory(m, g, 1, 16, 0.9, 8192, 256)
    free = plan_memory(m, g, 1, 16, 0.9, 8192, 256, kv_memory_basis="free")
    block = tot.kv_block_bytes_per_gpu
    left = g.cuda_total_bytes - tot.weight_bytes_per_gpu - tot.activation_reserve_bytes
    assert free.num_kv_blocks == int(0.9 * left // block)
    assert tot.num_kv_blocks == int((0.9 * g.cuda_total_bytes - tot.weight_bytes_per_gpu - tot.activation_reserve_bytes) // block)
    assert free.num_kv_blocks > tot.num_kv_blocks
    assert free.usable_bytes == pytest.approx(free.weight_bytes_per_gpu + 0.9 * left + free.activation_reserve_bytes)
    dep = build_deployment(scenario_from_dict(small_scenario(engine={"profile": "trt-llm"})))
    assert dep.cost.engine.kv_memory_basis == "free" and get_profile("vllm-v1").kv_memory_basis == "total"


def test_free_basis_error_names_its_numbers():
    with pytest.raises(UserError) as e:
        plan_memory(get_model("llama-3-70b"), get_gpu("h100-sxm"), 1, 16, 0.9, 8192, 256, kv_memory_basis="free")
    assert "less weights 131.4 GiB" in str(e.value) and "times 0.9" in str(e.value)
