"""A profile file carries everything its catalogue entry does: the vLLM release whose rules apply
(a file written from ``vllm-v1-0.34`` runs 0.34's rules), each value checked; and the compare
table's noise interval of a latency leaves a benchmark's warm-up out, as the figure does."""
import numpy as np
import polars as pl
import pytest
import yaml

from sim.cost.engine_profile import get_profile, profile_entry
from sim.errors import UserError
from sim.policies.budget import profile_release
from sim.reporting.metrics_table import Row, _interval


def _write(tmp_path, entry, name="p.yaml"):
    f = tmp_path / name
    f.write_text(yaml.safe_dump(entry))
    return str(f)


@pytest.mark.parametrize("name", ["vllm-v1", "vllm-v1-0.34", "trt-llm", "sglang"])
def test_a_file_written_from_a_catalogue_entry_runs_as_the_entry(tmp_path, name):
    path = _write(tmp_path, profile_entry(name))
    from_file, from_cat = get_profile(path).describe(), get_profile(name).describe()
    from_file.pop("name"), from_cat.pop("name")
    assert from_file == from_cat
    assert profile_release(path) == profile_release(name)


def test_vllm_034_file_keeps_its_release(tmp_path):
    path = _write(tmp_path, profile_entry("vllm-v1-0.34"))
    assert get_profile(path).vllm_release == "0.34" and profile_release(path) == "0.34"


@pytest.mark.parametrize("key,value", [("vllm_release", "0.2"), ("vllm_release", 12),
                                       ("frontend_overlap", 3), ("custom_allreduce", "yes")])
def test_bad_values_are_refused_naming_the_key(tmp_path, key, value):
    path = _write(tmp_path, {**profile_entry("vllm-v1"), key: value})
    with pytest.raises(UserError, match=f"key {key}"):
        get_profile(path)


def test_latency_interval_leaves_the_warmup_out():
    """45 warm-up requests of 100 s TTFT and 55 measured ones near 1 s: the median's interval is
    the measured requests' (around 1 s), not stretched to the warm-up's 100 s."""
    rng = np.random.default_rng(0)
    ttft = np.concatenate([np.full(45, 100.0), 1.0 + 0.01 * rng.standard_normal(55)])
    requests = pl.DataFrame({"request_id": np.arange(100), "ttft_s": ttft})
    row = Row("TTFT p50 (ms)", "median_ttft_ms", "min", sample=("ttft_s", 0.5), latency=True)
    lo, hi = _interval(row, {"simsrv_warmup_requests": 45}, requests, 1000.0)
    assert 950 < lo <= 1000 <= hi < 1050
    assert _interval(row, {"simsrv_warmup_requests": 0}, requests, 1000.0)[1] == 100_000.0  # all rows


def test_fp8_gemm_can_be_switched_under_engine_overhead(tmp_path):
    """engine.overhead.fp8_gemm picks the fp8 GEMM kernel of any profile; a bad name is one line."""
    from sim.engine.deployment import engine_profile
    from sim.scenario import load_scenario

    f = tmp_path / "s.yaml"
    f.write_text("model: llama-3.1-8b\nhardware: {gpu: h100-sxm}\nengine: {profile: trt-llm}\n"
                 "workload: {synthetic: {num_requests: 1}}\n")
    assert engine_profile(load_scenario(f).engine).fp8_gemm == "cublaslt"
    assert engine_profile(load_scenario(f, ["engine.overhead.fp8_gemm=cutlass"]).engine).fp8_gemm == "cutlass"
    with pytest.raises(UserError, match="fp8_gemm"):
        load_scenario(f, ["engine.overhead.fp8_gemm=cublas"])
