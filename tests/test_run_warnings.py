"""What a run says beyond its figures: saturation, failures by kind, null times, no silent
overwrite of a run directory, ``--version``."""

import json
import os
import subprocess
import sys

import polars as pl
import yaml

from sim.run import run_scenario
from sim.metrics.run_warnings import failure_kinds
from sim.scenario import scenario_from_dict
from sim.metrics.summary import summarize
from tests.conftest import ROOT, small_scenario


def simsrv(*args, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", "sim", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          env=None if env is None else {**os.environ, **env})


def _saturating(rate: float, max_model_len: int = 1200) -> dict:
    raw = small_scenario()
    raw["engine"]["max_model_len"] = max_model_len
    raw["workload"]["synthetic"].update(num_requests=400, request_rate=rate)
    return raw


def test_failure_reasons_are_grouped_by_kind():
    reasons = [f"prompt+output {n} tokens > max_model_len 8192" for n in range(9000, 14000)]
    reasons += ["needs 900 KV blocks for 14000 tokens; replica has 800"] * 3
    assert failure_kinds(reasons) == {"prompt+output 9000-13999 tokens > max_model_len 8192": 5000,
                                      "needs 900 KV blocks for 14000 tokens; replica has 800": 3}


def test_saturation_is_warned_and_a_stable_run_is_not():
    """Llama-3-8B on one H100 serves ~30 req/s of these requests: 200 req/s offered saturates it,
    20 req/s does not."""
    hot = summarize(run_scenario(scenario_from_dict(_saturating(200.0, 8192), "t")))
    cold = summarize(run_scenario(scenario_from_dict(_saturating(20.0, 8192), "t")))
    assert hot["failed"] == cold["failed"] == 0
    assert len(hot["simsrv_warnings"]) == 1 and hot["simsrv_warnings"][0].startswith("saturated: served ")
    # offered over the arrival window: the 400 Poisson arrivals' own rate, (n - 1) / span
    assert "of 204.87 req/s offered" in hot["simsrv_warnings"][0]
    assert cold["simsrv_warnings"] == []


def test_run_cli_warns_refuses_overwrite_and_writes_null_times(tmp_path):
    s = tmp_path / "s.yaml"
    raw = _saturating(200.0)
    # sent with max_tokens = each output length: those over the context are refused (vLLM's 400);
    # with none sent they would run to the context's end instead
    raw["workload"]["max_tokens"] = "output"
    s.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    p = simsrv("run", s, "--out", out)
    assert p.returncode == 0, p.stderr
    warnings = [line for line in p.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2 and "saturated" in warnings[0] and "(12%) failed" in warnings[1]
    failed_lines = [line for line in p.stdout.splitlines() if line.startswith("failed: ")]
    assert failed_lines == ["failed: 46 x prompt+max_tokens 1208-4017 tokens > max_model_len 1200"]
    result = json.loads((out / "result.json").read_text())
    assert result["simsrv_warnings"] == [w.removeprefix("warning: ") for w in warnings]
    assert result["simsrv_max_itl_ms"] >= result["p99.9_itl_ms"] >= result["p99_itl_ms"] > 0
    req = pl.read_parquet(out / "requests.parquet").filter(pl.col("status") == "failed")
    assert req.height == 46
    for col in ("ttft_s", "tpot_s", "e2el_s", "first_token_s", "first_scheduled_s", "queue_s"):
        assert req[col].null_count() == 46 and req[col].is_nan().sum() == 0, col
    before = (out / "result.json").read_bytes()
    again = simsrv("run", s, "--out", out, "--set", "seed=2")
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "--force" in again.stderr
    assert (out / "result.json").read_bytes() == before
    assert simsrv("run", s, "--out", out, "--set", "seed=2", "--force", "-q").returncode == 0
    assert (out / "result.json").read_bytes() != before


def test_version():
    p = simsrv("--version")
    assert p.returncode == 0 and p.stdout.startswith("simsrv ") and p.stdout.split()[1][0].isdigit()
    # which simulation core runs (sim/compiled_core.py): here the Python sources, as asked
    p = simsrv("--version", env={"SIMSRV_PURE_PYTHON": "1"})
    assert p.stdout.splitlines()[1] == "core: Python (SIMSRV_PURE_PYTHON is set)", p.stdout


def test_uncertainty_notes_name_the_extrapolated_share_above_ten_percent():
    from sim.metrics.run_warnings import uncertainty_notes

    assert uncertainty_notes({"simsrv_num_steps": 100, "simsrv_extrapolated_steps": 10}) == []
    notes = uncertainty_notes({"simsrv_num_steps": 100, "simsrv_extrapolated_steps": 11,
                               "simsrv_overhead_outside_batch_range": [600, 900]})
    assert notes[0].startswith("extrapolated: 11% of the engine steps (11 of 100)")
    assert notes[1].startswith("outside the profile's measured batch range: steps of 600-900 sequences")
    run = summarize(run_scenario(scenario_from_dict(_saturating(20.0, 8192), "t")))
    share = run["simsrv_extrapolated_steps"] / run["simsrv_num_steps"]
    assert run["simsrv_extrapolated_step_share"] == share
    assert bool(run["simsrv_uncertainty"]) == (share > 0.10)


def test_a_close_call_is_within_the_validated_error_either_side():
    from sim.metrics.run_warnings import VALIDATED_REQUEST_ERR, close_call

    assert VALIDATED_REQUEST_ERR == 0.10
    assert close_call(451.0, 500.0) and close_call(549.0, 500.0)
    assert not close_call(449.0, 500.0) and not close_call(551.0, 500.0) and not close_call(None, 500.0)


def test_diagnose_flags_a_candidate_decided_inside_the_models_error():
    from sim.analysis.diagnose_fixes import Candidate, judge
    from sim.sweep.slo import parse_slo
    import polars as pl

    terms = parse_slo("ttft_p99_ms=100,tpot_p99_ms=50")
    cand = Candidate("x", "y")
    from sim.core.ttft import TTFT_PARTS

    n = 50
    frame = pl.DataFrame({"status": ["completed"] * n, "ttft_s": [0.095] * n, "tpot_s": [0.02] * n,
                          "pool": [0] * n, "arrival_s": [float(i) for i in range(n)], "input_tokens": [100] * n,
                          **{p: [0.0] * n for p in TTFT_PARTS}})
    judge(cand, [frame], terms, None, 0)
    assert cand.meets == {"ttft_p99_ms": True, "tpot_p99_ms": True}
    assert "ttft_p99_ms within 10% of its limit" in cand.note and "tpot" not in cand.note
