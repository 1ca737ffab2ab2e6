"""trtllm-bench's own max_batch_size / max_num_tokens / max_seq_len per dataset.

The TensorRT-LLM perf-overview rows (VC-14, VC-15, VC-24) ran ``trtllm-bench throughput`` with no
``--max_batch_size`` / ``--max_num_tokens``, so each row ran with the values trtllm-bench's
tuning heuristic derives from the model, the GPU and that row's ISL/OSL
(sim/spec/trtllm_bench.py). The cases used to assume one pair (2048, 8192) for every row.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sim.analysis.validate import load_case_files, validation_dir
from sim.errors import UserError
from sim.scenario import scenario_from_dict
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model
from sim.spec.trtllm_bench import (
    DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_NUM_TOKENS, GIB, checkpoint_element_count, finetune_setting,
    kv_cache_max_requests, trtllm_bench_settings,
)

from tests.conftest import small_scenario

# the cases measured with trtllm-bench throughput and no limit on its command line
CASES = ("VC-14", "VC-15", "VC-24")


def _row_inputs(scen: dict):
    e = scen["engine"]
    model = replace(get_model(scen["model"]), quantization=e.get("quantization"))
    syn = scen["workload"]["synthetic"]
    isl, osl = syn["input_tokens"], syn["output_tokens"]
    assert isl["dist"] == osl["dist"] == "fixed", "the perf-overview datasets have stdev 0"
    tp = scen.get("cluster", {}).get("tensor_parallel_size", 1)
    pp = scen.get("cluster", {}).get("pipeline_parallel_size", 1)
    return model, get_gpu(scen["hardware"]["gpu"]), tp, pp, e.get("kv_cache_dtype"), isl["value"], osl["value"]


def _rows():
    files = [validation_dir() / f"{c}.yaml" for c in CASES]
    return [r for r in load_case_files(files, "validation") if r.scenario and r.status == "ok"]


def test_every_trtllm_bench_row_runs_the_heuristics_limits():
    """Each simulated row of the three cases sets engine.max_num_seqs / max_num_batched_tokens /
    max_model_len to what trtllm-bench computes for its dataset; a row added without them, or
    with hand-picked ones, fails here."""
    rows = _rows()
    assert len(rows) >= 70
    for r in rows:
        e = r.scenario["engine"]
        assert e.get("profile") == "trt-llm" and e.get("policy") == "continuous", r.id
        model, gpu, tp, pp, kv, isl, osl = _row_inputs(r.scenario)
        # trtllm-bench's --kv_cache_free_gpu_mem_fraction feeds both its heuristic and the
        # runtime's KV cache: the row's gpu_memory_utilization is that flag
        fraction = e["gpu_memory_utilization"]
        want = trtllm_bench_settings(model, gpu, tp, pp, kv, isl, osl, max_isl=isl, max_seq_len=isl + osl,
                                     kv_fraction=fraction)
        got = (e.get("max_num_seqs"), e.get("max_num_batched_tokens"), e.get("max_model_len"))
        assert got == (want.max_batch_size, want.max_num_tokens, want.max_seq_len), r.id


def test_case_files_say_where_their_limits_come_from():
    for c in CASES:
        text = (validation_dir() / f"{c}.yaml").read_text()
        assert "sim/spec/trtllm_bench.py" in text and "max_batch_size 2048" not in text, c


def test_one_row_by_hand():
    """VC-14 H100 128/2048, the arithmetic of tuning.py calc_engine_setting written out:
    Llama-3.1-8B FP8 (8,030,261,248 elements at 1 byte), NVML total 81,559 MiB, fp8 KV of
    2 x 32 layers x 8 heads x 128 = 65,536 bytes per token."""
    free_gib = 81559 / 1024 - 8_030_261_248 / GIB
    requests = free_gib * 0.95 / (65536 / GIB * (128 + 2048))
    assert requests == pytest.approx(516.2, abs=0.1)
    # 516.2 -> 128 * ceil(516.2 / 128) = 640; tokens 516.2 * (1 + 128/2048) = 548 -> the 2048 floor
    s = trtllm_bench_settings(replace(get_model("llama-3.1-8b"), quantization="fp8"), get_gpu("h100-sxm"), 1, 1,
                              "fp8", 128, 2048, 128, 2176)
    assert (s.max_batch_size, s.max_num_tokens, s.max_seq_len) == (640, 2048, 2176)


@pytest.mark.parametrize("requests, isl, osl, pp, want", [
    (10.0, 128, 128, 1, (64, 2048)),           # batch floor 64, token floor 2048
    (200.0, 128, 128, 1, (224, 2048)),         # < 256: multiples of 32
    (516.2, 128, 2048, 1, (640, 2048)),        # < 1024: multiples of 128
    (1500.0, 1000, 1000, 1, (1536, 3072)),     # >= 1024: multiples of 256; tokens < 4096: of 256
    (3500.0, 500, 2000, 1, (3584, 4608)),      # tokens in [4096, 8192): multiples of 512
    (9000.0, 128, 128, 1, (4096, 8192)),       # batch cap 4096 before rounding
    (9000.0, 2048, 128, 1, (4096, 32768)),     # token cap 32768
    (9000.0, 128, 128, 2, (2048, 4096)),       # pp divides the capped batch
])
def test_finetune_setting_follows_tuning_py(requests, isl, osl, pp, want):
    assert finetune_setting(requests, isl, osl, pp) == want


def test_kv_requests_use_at_least_one_kv_head_per_tp_rank():
    """``adjusted_num_kv_heads = max(tp_size, num_key_value_heads)``: at TP16 an 8-KV-head model's
    cache per token doubles in the estimate."""
    a = kv_cache_max_requests(0, 1.0, 1.0, 80, 8, 128, 80.0, 8, 1, 1000, 1000, 0.95)
    b = kv_cache_max_requests(0, 1.0, 1.0, 80, 8, 128, 80.0, 16, 1, 1000, 1000, 0.95)
    assert b == pytest.approx(a)  # twice the GPUs, twice the bytes per token


def test_nvfp4_counts_safetensors_elements_not_weights():
    """get_param_count sums the checkpoint's stored elements: an NVFP4 linear weight is half a U8
    element plus 1/16 of an FP8 scale; FP8 and bf16 checkpoints store one element per weight."""
    m = get_model("llama-3.3-70b")
    fp4 = replace(m, quantization="modelopt_fp4")
    lin = fp4.quantized_params
    assert checkpoint_element_count(fp4) == m.num_params - lin + lin // 2 + lin // 16
    assert checkpoint_element_count(replace(m, quantization="fp8")) == m.num_params
    assert checkpoint_element_count(m) == m.num_params
    assert 40e9 < checkpoint_element_count(fp4) < 41e9


def test_untuned_quantization_keeps_build_config_defaults_and_the_prompt_floor():
    """build.py: a quant_algo outside TUNED_QUANTS keeps BuildConfig's 2048 / 8192; general.py then
    raises max_num_tokens to the longest prompt plus max_batch_size without chunked prefill."""
    m = replace(get_model("llama-3.1-8b"), quantization="awq")
    s = trtllm_bench_settings(m, get_gpu("h100-sxm"), 1, 1, None, 128, 128, 128, 256)
    assert (s.max_batch_size, s.max_num_tokens) == (DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_NUM_TOKENS)
    s = trtllm_bench_settings(m, get_gpu("h100-sxm"), 1, 1, None, 20000, 2000, 20000, 22000)
    assert s.max_num_tokens == 20000 + DEFAULT_MAX_BATCH_SIZE
    s = trtllm_bench_settings(m, get_gpu("h100-sxm"), 1, 1, None, 20000, 2000, 20000, 22000, chunked_prefill=True)
    assert s.max_num_tokens == DEFAULT_MAX_NUM_TOKENS


def test_every_row_holds_its_longest_prompt():
    """Without chunking each prompt must fit max_num_tokens; the heuristic guarantees it."""
    for r in _rows():
        e = r.scenario["engine"]
        isl = r.scenario["workload"]["synthetic"]["input_tokens"]["value"]
        assert e["max_num_batched_tokens"] >= isl + e["max_num_seqs"], r.id
        assert e["max_num_seqs"] >= 64, r.id  # the heuristic's floor


def _trt_scenario(profile: str) -> dict:
    over = small_scenario(engine={"policy": "continuous", "profile": profile, "max_num_batched_tokens": 2048,
                                  "max_num_seqs": 256, "max_model_len": 2176})
    over["workload"] = {"max_tokens": "output", "synthetic": {
        "num_requests": 8, "request_rate": 100, "input_tokens": {"dist": "fixed", "value": 128},
        "output_tokens": {"dist": "fixed", "value": 2048}}}
    return over


def test_trt_llm_accepts_max_seq_len_above_max_num_tokens_vllm_does_not():
    """trtllm-bench runs max_num_tokens 2048 with max_seq_len 2176 (the 128/2048 rows); vLLM
    refuses a budget below max_model_len without chunked prefill (SchedulerConfig._verify_args)."""
    from sim.run import run_scenario

    res = run_scenario(scenario_from_dict(_trt_scenario("trt-llm")))
    assert int((res.requests["status"] == "completed").sum()) == 8
    with pytest.raises(UserError, match="must be >= engine.max_model_len 2176"):
        scenario_from_dict(_trt_scenario("vllm-v1"))


def test_trt_llm_fails_a_prompt_above_max_num_tokens_with_its_reason():
    from sim.run import run_scenario

    over = _trt_scenario("trt-llm")
    over["engine"].update(max_model_len=4096)
    over["workload"]["synthetic"]["input_tokens"]["value"] = 3000
    over["workload"]["synthetic"]["output_tokens"]["value"] = 16
    res = run_scenario(scenario_from_dict(over))
    assert int((res.requests["status"] == "failed").sum()) == 8
    assert "max_num_batched_tokens 2048" in str(res.requests["fail_reason"][0])


def test_profile_file_key_is_checked(tmp_path: Path):
    from sim.cost.engine_profile import get_profile, load_profile_file, profile_entry

    d = profile_entry("trt-llm")
    assert d["budget_covers_max_model_len"] is False
    import yaml

    d["budget_covers_max_model_len"] = "no"
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(UserError, match="budget_covers_max_model_len"):
        load_profile_file(p)
    d["budget_covers_max_model_len"] = False
    p.write_text(yaml.safe_dump(d))
    assert get_profile(str(p)).budget_covers_max_model_len is False
