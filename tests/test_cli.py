"""The command line as a user runs it: the main job, explain, and bad input (exit 2, one line)."""

import json
import os
import subprocess
import sys

import polars as pl
import pytest
import yaml

from tests.conftest import ROOT, small_scenario

VLLM_KEYS = {
    "date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "duration", "completed",
    "failed", "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput",
} | {f"{s}_{m}_ms" for s in ("mean", "median", "std", "p50", "p90", "p99") for m in ("ttft", "tpot", "itl", "e2el")}


def simsrv(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "sim", *map(str, args)], cwd=cwd, capture_output=True, text=True)


def test_main_job_on_shipped_scenario(tmp_path):
    out = tmp_path / "run"
    p = simsrv("run", "scenarios/chat.yaml", "--policy", "chunked", "--chunk", "512", "--out", out)
    assert p.returncode == 0, p.stderr
    for word in ("TTFT", "TPOT", "ITL", "E2E", "p99", "preemptions", "req/s"):
        assert word in p.stdout
    result = json.loads((out / "result.json").read_text())
    assert VLLM_KEYS <= set(result)
    assert result["backend"] == "simsrv" and result["simsrv_policy"] == "chunked"
    assert result["completed"] + result["failed"] == result["num_prompts"] == 19_366
    # the one prompt of 14,050 tokens exceeds Llama-3-8B's 8,192-token context
    assert result["failed"] == 1 and "max_model_len 8192" in next(iter(result["simsrv_failed_reasons"]))
    req = pl.read_parquet(out / "requests.parquet")
    assert {"request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "input_tokens",
            "output_tokens", "ttft_s", "tpot_s", "e2el_s", "queue_s", "num_preemptions", "replica",
            "status"} <= set(req.columns)
    steps = pl.read_parquet(out / "steps.parquet")
    assert {"replica", "start_s", "duration_s", "num_seqs", "prefill_tokens", "decode_tokens",
            "kv_blocks_used", "num_waiting"} <= set(steps.columns)
    assert steps["prefill_tokens"].max() <= 512
    resolved = yaml.safe_load((out / "scenario.resolved.yaml").read_text())
    assert resolved["engine"]["policy"] == "chunked" and resolved["engine"]["max_num_batched_tokens"] == 512


def test_same_seed_gives_identical_requests_parquet(tmp_path):
    s = tmp_path / "s.yaml"
    s.write_text(yaml.safe_dump(small_scenario()))
    for d in ("a", "b"):
        assert simsrv("run", s, "--out", tmp_path / d, "-q").returncode == 0
    for f in ("requests.parquet", "steps.parquet", "scenario.resolved.yaml"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


def test_explain_json_keys():
    p = simsrv("explain", "scenarios/chat.yaml", "--json", "--context", "4096", "--batch", "8")
    assert p.returncode == 0, p.stderr
    keys = list(json.loads(p.stdout))
    assert keys[:10] == [
        "params", "weight_bytes_per_gpu", "kv_bytes_per_token", "kv_capacity_tokens", "max_seqs_at_context",
        "ridge_flops_per_byte", "prefill_intensity_flops_per_byte", "decode_intensity_flops_per_byte",
        "decode_step_floor_ms", "prefill_floor_ms"]
    from sim.analysis.explain import EXPLAIN_KEYS

    assert tuple(keys) == EXPLAIN_KEYS  # issue 11's figures follow (README "explain")


def _one_error_line(p, *needles):
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_unknown_key_exits_2(tmp_path):
    s = tmp_path / "s.yaml"
    s.write_text(yaml.safe_dump(small_scenario(engine={"polcy": "chunked"})))
    _one_error_line(simsrv("run", s), str(s), "unknown key 'engine.polcy'", "valid keys here: policy")


def test_malformed_trace_row_exits_2(tmp_path):
    t = tmp_path / "trace.csv"
    t.write_text("arrival_s,input_tokens,output_tokens\n0.0,100,10\n0.5,12x,10\n")
    s = tmp_path / "s.yaml"
    s.write_text(yaml.safe_dump(small_scenario(workload={"trace": {"path": str(t)}})))
    _one_error_line(simsrv("run", s), str(t), "line 3", "input_tokens")


def test_model_that_does_not_fit_exits_2():
    _one_error_line(simsrv("run", "scenarios/chat.yaml", "--set", "model=llama-3-70b"),
                    "llama-3-70b does not fit on h100-sxm", "weights 131.4 GiB")


def test_missing_scenario_and_bad_set_exit_2(tmp_path):
    _one_error_line(simsrv("run", tmp_path / "nope.yaml"), "nope.yaml", "not found")
    _one_error_line(simsrv("run", "scenarios/chat.yaml", "--set", "engine.max_num_seqs"), "dotted.key=value")
    _one_error_line(simsrv("run", "scenarios/chat.yaml", "--policy", "continuous", "--chunk", "512"), "--chunk")


def test_verbose_shows_traceback():
    p = simsrv("--verbose", "run", "scenarios/chat.yaml", "--set", "model=nope")
    assert p.returncode != 0 and "Traceback" in p.stderr


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked", "disaggregated"])
def test_every_policy_runs_from_the_cli(tmp_path, policy):
    s = tmp_path / "s.yaml"
    s.write_text(yaml.safe_dump(small_scenario()))
    # without chunked prefill (all but chunked) the budget must hold max_model_len (8192), as in vLLM
    budget = ["--set", "engine.max_num_batched_tokens=8192"] if policy != "chunked" else []
    p = simsrv("run", s, "--policy", policy, *budget, "--out", tmp_path / "run")
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["simsrv_policy"] == policy and result["completed"] == 200
    if policy == "disaggregated":
        assert result["simsrv_kv_transfers"] > 0 and result["simsrv_mean_kv_transfer_ms"] > 0


def test_usage_errors_and_unwritable_outputs_exit_2(tmp_path):
    _one_error_line(simsrv("run", "scenarios/chat.yaml", "--bogus"), "No such option: --bogus")
    _one_error_line(simsrv("bogus"), "No such command")
    _one_error_line(simsrv("run", "scenarios/chat.yaml", "--chunk", "abc"), "--chunk")
    _one_error_line(simsrv("run"), "Missing argument")
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    s = tmp_path / "s.yaml"
    s.write_text(yaml.safe_dump(small_scenario()))
    _one_error_line(simsrv("run", s, "--out", blocker / "sub"), str(blocker))


def test_tensor_parallel_must_divide_heads():
    _one_error_line(simsrv("run", "scenarios/chat.yaml", "--set", "cluster.tensor_parallel_size=3"),
                    "cluster.tensor_parallel_size: 3 does not divide", "32 attention heads")


def test_resolved_scenario_reruns_from_another_directory(tmp_path):
    out = tmp_path / "a"
    assert simsrv("run", "scenarios/chat.yaml", "--set", "workload.trace.sample=300", "-q", "--out", out).returncode == 0
    # PYTHONPATH: this checkout's sim, not whichever one is installed, runs from the other directory
    p = subprocess.run([sys.executable, "-m", "sim", "run", str(out / "scenario.resolved.yaml"), "-q", "--out",
                        str(tmp_path / "b")], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    assert (out / "requests.parquet").read_bytes() == (tmp_path / "b" / "requests.parquet").read_bytes()
