"""Capacity search: SLO parsing, the bisection on a noisy objective, and the knee of a
deployment whose answer is known (one request at a time, constant service time: M/D/1)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
import yaml

from sim.errors import UserError
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from sim.sweep.capacity import TRACE_RATE, make_config, run_capacity
from sim.sweep.executors import SerialExecutor
from sim.sweep.grid import expand, grid_points
from sim.sweep.knee import KneeSearch, Probe, _crossing
from sim.sweep.slo import parse_slo
from sim.sweep.task import Task
from tests.conftest import ROOT, small_scenario


def test_parse_slo_both_spellings():
    terms = parse_slo("ttft_p99_ms=500, p99_tpot_ms=50,e2el_mean_ms=2000")
    assert [(t.key, t.metric, t.limit_ms) for t in terms] == [
        ("p99_ttft_ms", "ttft", 500.0), ("p99_tpot_ms", "tpot", 50.0), ("mean_e2el_ms", "e2el", 2000.0)]
    for bad in ("ttft_p99_ms=0", "ttft_p99_ms=500,p99_ttft_ms=400", "", "queue_p99_ms=5"):
        with pytest.raises(UserError):
            parse_slo(bad)


def _drive(search: KneeSearch, objective, m: int = 1) -> None:
    """Run a search against ``objective(rate, seed) -> figure`` (one SLO term, limit 1)."""
    while rates := search.next_rates(m):
        for r in rates:
            ratios = np.array([[objective(r, s)] for s in range(4)])
            search.add(Probe(r, ratios, np.full(4, min(1.0, r / 20))))


@pytest.mark.parametrize("start, m", [(1.0, 1), (300.0, 1), (3.0, 4)])
def test_search_brackets_the_knee_within_tolerance(start, m):
    terms = parse_slo("ttft_p99_ms=1")
    noise = np.array([-0.03, 0.01, 0.02, 0.0])
    s = KneeSearch(terms, start, 0.05)
    _drive(s, lambda r, seed: r / 17.3 * (1 + noise[seed]), m)  # mean crosses 1 at r = 17.3
    k = s.knee()
    lo, hi = k.bracket
    assert lo < 17.3 < hi and (hi - lo) <= 0.05 * lo
    assert k.rate_per_s == pytest.approx(17.3, rel=1e-9)  # linear objective: interpolation is exact
    assert k.ci95_low <= 17.3 <= k.ci95_high and k.ci95_low < k.ci95_high
    assert k.binding == "ttft_p99_ms" and k.censored is None and not k.seeds_identical
    assert k.utilization == pytest.approx(17.3 / 20)


def test_search_reports_censored_knees():
    terms = parse_slo("ttft_p99_ms=1")
    never = KneeSearch(terms, 5.0)
    _drive(never, lambda r, s: 2.0)  # the SLO fails even with almost no load
    k = never.knee()
    assert k.rate_per_s is None and k.censored == "below"
    always = KneeSearch(terms, 5.0)
    _drive(always, lambda r, s: 0.5)
    k = always.knee()
    assert k.censored == "above" and k.rate_per_s == pytest.approx(5.0 * 2**16)


def test_crossing_interpolates_between_pass_and_fail():
    rate, censored, p, f, frac = _crossing(np.array([1.0, 2.0, 4.0]), np.array([-0.5, -0.2, 0.4]))
    assert (p, f, censored) == (1, 2, None) and rate == pytest.approx(2 + 2 * (0.2 / 0.6))


MD1 = dict(engine={"policy": "continuous", "max_num_seqs": 1}, workload={"synthetic": {
    "num_requests": 1000, "request_rate": 10,
    "input_tokens": {"dist": "fixed", "value": 512}, "output_tokens": {"dist": "fixed", "value": 1}}})


def test_knee_of_a_one_at_a_time_server_matches_md1_and_a_brute_force_scan():
    """One request at a time, each a single 512-token prefill step of constant duration D: the
    replica is an M/D/1 queue, whose mean wait is rho D / (2 (1 - rho)) (Pollaczek-Khinchine).
    With the SLO mean TTFT <= 3 D the wait may be 2 D, so rho = 0.8 and the knee is 0.8 / D. The
    client's TTFT also holds the serving front end's fixed time F per request (sim/engine/frontend.py:
    HTTP and tokenisation in, the first token out), read from an idle run: the SLO is 3 D + F (the
    front end's own queue at the knee, utilisation ~0.2, adds well under 1% to the knee)."""
    base = scenario_from_dict(small_scenario(**MD1))
    idle = run_scenario(scenario_from_dict({**small_scenario(**MD1), "workload": {"synthetic": {
        **MD1["workload"]["synthetic"], "num_requests": 5, "request_rate": 0.1}}}))
    steps = idle.steps
    d_s = float(steps["duration_s"].mean())
    assert np.allclose(steps["duration_s"], d_s)  # constant service time
    f_s = float(np.mean(idle.request_column("ttft_frontend_s")))
    terms = parse_slo(f"ttft_mean_ms={(3 * d_s + f_s) * 1e3}")
    seeds = [1, 2, 3, 4]
    res = run_capacity(expand(base, [{}]), terms, seeds, SerialExecutor(("h100-sxm",)))
    rec = res.records()[0]
    knee = rec["knee_rate_per_s"]
    assert knee == pytest.approx(0.8 / d_s, rel=0.05)
    assert rec["knee_ci95_low"] <= knee <= rec["knee_ci95_high"]
    assert rec["bracket_high_per_s"] - rec["bracket_low_per_s"] <= 0.05 * rec["bracket_low_per_s"]
    assert rec["utilization_at_knee"] == pytest.approx(knee * d_s, abs=0.03)  # busy fraction = rho
    assert rec["binding_slo"] == "ttft_mean_ms" and rec["num_gpus"] == 1
    # brute force on the same seeds: the highest rate of a 1% grid whose seed-mean meets the SLO
    cfg = res.configs[0]
    grid = np.arange(0.70, 0.90, 0.01) / d_s
    ex = SerialExecutor()
    passing = []
    for r in grid:
        rows = [row for _, row in ex.map_unordered([Task("x", 0, s, cfg.raw_at(float(r), s), cfg.point.base_dir)
                                                    for s in seeds])]
        if np.mean([row["mean_ttft_ms"] for row in rows]) <= terms[0].limit_ms:
            passing.append(r)
        else:
            break
    assert passing and knee == pytest.approx(passing[-1], rel=0.05)


def test_trace_capacity_scales_the_target_rate(tmp_path):
    rng = np.random.default_rng(1)
    n = 60
    arrival = np.cumsum(rng.gamma(0.5, 0.4, n))
    pl.DataFrame({"request_id": np.arange(n), "arrival_s": arrival - arrival[0],
                  "input_tokens": rng.integers(200, 600, n), "output_tokens": rng.integers(20, 80, n)}
                 ).write_parquet(tmp_path / "t.parquet")
    base = scenario_from_dict(small_scenario(workload={"trace": {"path": str(tmp_path / "t.parquet"),
                                                                 "time_scale": 2.0}}))
    cfg = make_config(expand(base, [{}])[0])
    assert cfg.rate_key == TRACE_RATE and cfg.start_rate_per_s == pytest.approx((n - 1) / (arrival[-1] - arrival[0]) / 2)
    raw = cfg.raw_at(7.0, 0)
    assert raw["workload"]["trace"]["target_rate"] == 7.0 and "time_scale" not in raw["workload"]["trace"]
    res = run_capacity(expand(base, [{}]), parse_slo("ttft_p99_ms=300"), [0, 1], SerialExecutor())
    rec = res.records()[0]
    assert rec["seeds_identical"] and rec["knee_ci95_low"] == rec["knee_ci95_high"] == rec["knee_rate_per_s"]
    with pytest.raises(UserError, match="may not set workload.trace.target_rate"):
        make_config(expand(base, grid_points({"workload.trace.target_rate": [1, 2]}))[0])


def test_capacity_cli_table_json_and_chart(tmp_path):
    raw = small_scenario(**MD1)
    raw["hardware"]["price_per_gpu_hour"] = 2.0
    raw["workload"]["synthetic"]["num_requests"] = 150
    raw["cluster"] = {"replicas": 2}
    raw["engine"]["max_model_len"] = 1024  # continuous: the budget must hold it (sim/policies/budget.py)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "g.yaml").write_text(yaml.safe_dump([{"engine.max_num_batched_tokens": 1024},
                                                     {"engine.max_num_batched_tokens": 2048}]))
    p = subprocess.run([sys.executable, "-m", "sim", "capacity", tmp_path / "s.yaml", "--slo",
                        "ttft_p99_ms=150,ttft_mean_ms=60", "--policies", "continuous,chunked", "--grid",
                        tmp_path / "g.yaml", "--seeds", "2", "--workers", "2", "--out", tmp_path / "cap"],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 0, p.stderr
    assert "knee" in p.stdout and "requests per $" in p.stdout
    out = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    confs = out["configurations"]
    assert len(confs) == 4 and out["slo"] == {"ttft_p99_ms": 150.0, "ttft_mean_ms": 60.0}
    for c in confs:
        assert c["error"] is None and c["num_gpus"] == 2 and c["binding_slo"] in out["slo"]
        assert c["requests_per_s_per_gpu"] == pytest.approx(c["knee_rate_per_s"] / 2)
        assert c["requests_per_dollar"] == pytest.approx(c["knee_rate_per_s"] * 3600 / (2 * 2.0))
    assert pl.read_parquet(tmp_path / "cap" / "probes.parquet")["probe_rate_per_s"].n_unique() > 3
    html = (tmp_path / "cap" / "capacity.html").read_text()
    divs = re.findall(r'<div class="chart" id="chart\d+"></div>', html)
    assert len(divs) == 2  # one chart per SLO term, with the SLO line and the knees
    assert '"strokeDash"' in html and "policy=chunked" in html
