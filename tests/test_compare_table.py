"""compare: every policy validated before any run; best only among equal GPU counts or per GPU,
and only outside the noise; the rows a user needs to see what a policy costs."""

import subprocess
import sys

import numpy as np
import polars as pl
import yaml

from sim.reporting.html import Page
from sim.reporting.metrics_table import ROWS, best_cells, metrics_table, quantile_interval
from sim.reporting.rundata import RunData
from tests.conftest import ROOT, small_scenario


def simsrv(*args):
    return subprocess.run([sys.executable, "-m", "sim", *map(str, args)], cwd=ROOT, capture_output=True, text=True)


def _row(label: str) -> int:
    return next(i for i, r in enumerate(ROWS) if r.label == label)


def _run(label, gpus, ttft_s, **summary):
    req = pl.DataFrame({"status": ["completed"] * len(ttft_s), "ttft_s": ttft_s})
    s = {"simsrv_num_gpus": gpus, "completed": len(ttft_s), "p99_ttft_ms": float(np.percentile(ttft_s, 99)) * 1e3,
         **summary}
    return RunData(label, ROOT, s, req, pl.DataFrame(), {})


def test_best_only_among_equal_gpus_or_per_gpu():
    rng = np.random.default_rng(0)
    one = _run("one GPU", 1, rng.lognormal(0, 0.5, 4000), request_throughput=10.0, output_throughput=1000.0)
    two = _run("two GPUs", 2, rng.lognormal(-1, 0.5, 4000), request_throughput=16.0, output_throughput=1600.0)
    best = best_cells([one, two])
    # two GPUs are faster and serve more, but not "best" against one GPU...
    assert (_row("TTFT p99 (ms)"), 2) not in best and (_row("requests / s"), 2) not in best
    # ...per GPU the one-GPU run serves more
    assert (_row("requests / s per GPU"), 1) in best and (_row("output tokens / s per GPU"), 1) in best
    assert (_row("requests / s per GPU"), 2) not in best


def test_differences_below_noise_are_not_highlighted():
    rng = np.random.default_rng(1)
    base = rng.lognormal(0, 0.5, 2000)
    a = _run("a", 1, base, request_throughput=10.0)
    b = _run("b", 1, base * 1.01, request_throughput=10.05)   # 1% slower, 0.5% more req/s: noise
    c = _run("c", 1, base * 2.0, request_throughput=14.0)     # 2x slower, 40% more req/s: real
    assert best_cells([a, b]) == set()
    best = best_cells([a, c])
    assert (_row("TTFT p99 (ms)"), 1) in best and (_row("requests / s"), 2) in best
    lo, hi = quantile_interval(base, 0.99)
    assert lo < np.percentile(base, 99) < hi and hi / lo < 1.5


def test_table_has_cost_cache_and_stall_rows_and_states_the_noise_rule():
    page = Page("t")
    metrics_table(page, [_run("a", 1, np.ones(10)), _run("b", 2, np.ones(10))])
    html = "".join(page.parts)
    for label in ("goodput per GPU", "output tokens / s per GPU", "prefix-cache hit rate", "ITL p99.9 (ms)",
                  "ITL max (ms)"):
        assert f"<td>{label}" in html, label
    assert "only when it is outside the noise" in html and "different numbers of GPUs" in html


def test_compare_validates_every_policy_before_running_any(tmp_path):
    s = tmp_path / "s.yaml"
    s.write_text(yaml.safe_dump(small_scenario()))
    p = simsrv("compare", s, "--chunk", "0", "--out", tmp_path / "a")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "policy chunked" in p.stderr
    assert not (tmp_path / "a").exists()
    raw = small_scenario(model="llama-3-70b", cluster={"tensor_parallel_size": 4},
                         engine={"policy": "chunked", "max_num_batched_tokens": 8192},  # legal for every policy
                         disaggregation={"prefill": {"tensor_parallel_size": 1}})  # pools default to TP 4
    s.write_text(yaml.safe_dump(raw))
    p = simsrv("compare", s, "--out", tmp_path / "b")
    assert p.returncode == 2 and "policy disaggregated: disaggregation.prefill" in p.stderr
    assert not (tmp_path / "b").exists()


def test_compare_prints_a_policy_that_completes_nothing(tmp_path):
    """Prompts and outputs over max_model_len: every request fails under both policies, and
    their lines say so instead of crashing on the missing latencies (continuous no longer fails
    prompts over its budget: vLLM refuses such a budget at start-up, sim/policies/budget.py)."""
    raw = small_scenario(engine={"max_num_batched_tokens": 1000, "max_model_len": 1000},
                         workload={"synthetic": {"num_requests": 6, "request_rate": 5,
                                                 "input_tokens": {"dist": "fixed", "value": 1000},
                                                 "output_tokens": {"dist": "fixed", "value": 10}}})
    s = tmp_path / "s.yaml"
    s.write_text(yaml.safe_dump(raw))
    p = simsrv("compare", s, "--policies", "continuous,chunked", "--out", tmp_path / "c")
    assert p.returncode == 0, p.stderr
    assert "TTFT p50 - / p99 - ms" in p.stdout and "6 failed" in p.stdout


def test_compare_default_leaves_out_a_disaggregated_form_the_layout_lacks():
    """With no --policies, a data-parallel deployment (no disaggregated form, no disaggregation
    section) compares the colocated policies and names why disaggregated was left out; a
    scenario that configures disaggregation badly still fails (the test above)."""
    from sim.analysis.compare import usable_policies

    dp = ROOT / "scenarios" / "deepseek_v3_dp8_ep.yaml"
    usable, skipped = usable_policies(dp, None, ["engine.max_num_batched_tokens=8192"])
    assert usable == ["static", "continuous", "chunked"]
    assert len(skipped) == 1 and skipped[0].startswith("policy disaggregated: ") and "data_parallel_size" in skipped[0]
    # as shipped, its chunked budget (4096) is below max_model_len (8192): the policies without
    # chunked prefill are left out too, each with vLLM's refusal
    usable, skipped = usable_policies(dp, None, [])
    assert usable == ["chunked"] and [s.split(":")[0] for s in skipped] == [
        "policy static", "policy continuous", "policy disaggregated"]
    assert "must be >= engine.max_model_len 8192" in skipped[0] and "data_parallel_size" in skipped[2]
    usable, skipped = usable_policies(ROOT / "scenarios" / "chat.yaml", None, [])
    assert "disaggregated" in usable and skipped == []
