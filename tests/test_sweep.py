"""Sweeps: grid files, the local process pool, resume, Ctrl-C, confidence intervals, reports."""

import json
import re
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
import yaml

from sim.errors import UserError
from sim.scenario import scenario_from_dict
from sim.sweep.executors import LocalExecutor, SerialExecutor, make_executor
from sim.sweep.grid import expand, grid_points, read_grid
from sim.sweep.runner import SweepInterrupted, row_path, run_sweep, seeds_from, tasks_for
from sim.sweep.stats import aggregate, bootstrap_interval, t_interval
from sim.metrics.summary import num_gpus
from sim.sweep.task import utilization
from tests.conftest import ROOT, small_scenario


def tiny(**synthetic) -> dict:
    raw = small_scenario()
    raw["workload"]["synthetic"].update({"num_requests": 120, **synthetic})
    return raw


def test_grid_mapping_is_a_cartesian_product_in_key_order():
    pts = grid_points({"engine.policy": ["chunked", "continuous"], "workload.synthetic.request_rate": [5, 10, 20]})
    assert len(pts) == 6
    assert pts[0] == {"engine.policy": "chunked", "workload.synthetic.request_rate": 5}
    assert pts[-1] == {"engine.policy": "continuous", "workload.synthetic.request_rate": 20}
    assert grid_points([{"cluster.replicas": 2}, {"engine.policy": "continuous"}]) == [
        {"cluster.replicas": 2}, {"engine.policy": "continuous"}]


@pytest.mark.parametrize("data, words", [
    ({"engine.policy": "chunked"}, "list of values"),
    ({"seed": [1, 2]}, "--seeds"),
    ([1, 2], "mapping"),
    ({}, "empty"),
])
def test_bad_grids_are_user_errors(data, words):
    with pytest.raises(UserError, match=words):
        grid_points(data)


def test_grid_points_are_validated_before_running(tmp_path):
    base = scenario_from_dict(tiny())
    with pytest.raises(UserError, match=r"point 1 \(engine.polcy=x\).*unknown key"):
        expand(base, [{"engine.policy": "continuous"}, {"engine.polcy": "x"}])
    with pytest.raises(UserError, match="same configuration as point 0"):
        expand(base, [{"cluster.replicas": 2}, {"cluster.replicas": 2}])
    with pytest.raises(UserError, match="grid file not found"):
        read_grid(tmp_path / "missing.yaml")


def test_local_sweep_two_points_two_seeds_then_resume(tmp_path):
    raw = tiny()
    raw["engine"]["max_num_batched_tokens"] = 4096  # >= max_model_len: continuous, as vLLM, needs it
    raw["engine"]["max_model_len"] = 4096
    base = scenario_from_dict(raw)
    points = expand(base, grid_points({"engine.policy": ["chunked", "continuous"]}))
    seeds = seeds_from(base.seed, 2)
    ex = LocalExecutor(2, ("h100-sxm",))
    seen = []
    try:
        res = run_sweep(points, seeds, tmp_path, ex, progress=lambda d, t: seen.append((d, t)))
    finally:
        ex.close()
    assert res.num_ran == 4 and seen[-1] == (2, 2)
    rows = pl.read_parquet(tmp_path / "sweep.parquet")
    assert rows.height == 4 and rows["error"].null_count() == 4
    assert rows["engine.policy"].to_list() == ["chunked", "chunked", "continuous", "continuous"]
    assert rows["seed"].to_list() == [1, 2, 1, 2]
    # common random numbers: seed k draws the same prompts whatever the policy
    by_seed = rows.group_by("seed").agg(pl.col("total_input_tokens").n_unique())
    assert by_seed["total_input_tokens"].to_list() == [1, 1]
    assert rows.filter(pl.col("seed") == 1)["total_input_tokens"][0] != rows.filter(pl.col("seed") == 2)[
        "total_input_tokens"][0]
    agg = pl.read_parquet(tmp_path / "aggregate.parquet")
    for m in ("p99_ttft_ms", "mean_tpot_ms", "request_throughput", "simsrv_utilization"):
        assert {f"{m}_mean", f"{m}_ci95_low", f"{m}_ci95_high"} <= set(agg.columns)
    for r in agg.iter_rows(named=True):
        assert r["num_seeds"] == 2 and not r["seeds_identical"]
        assert r["p99_ttft_ms_ci95_low"] <= r["p99_ttft_ms_mean"] <= r["p99_ttft_ms_ci95_high"]
        assert r["p99_ttft_ms_ci95_low"] < r["p99_ttft_ms_ci95_high"]

    with pytest.raises(UserError, match="--resume"):
        run_sweep(points, seeds, tmp_path, SerialExecutor())
    again = run_sweep(points, seeds, tmp_path, SerialExecutor(), resume=True)
    assert (again.num_ran, again.num_skipped) == (0, 4)
    row_path(tmp_path, tasks_for(points, seeds)[3]).unlink()
    once = run_sweep(points, seeds, tmp_path, SerialExecutor(), resume=True)
    assert (once.num_ran, once.num_skipped) == (1, 3)
    assert once.rows.drop("simsrv_wall_s", "simsrv_requests_per_wall_s").equals(
        rows.drop("simsrv_wall_s", "simsrv_requests_per_wall_s"))  # same seed, same figures


class _InterruptAfter:
    """An executor whose user presses Ctrl-C after ``n`` finished runs."""

    workers = 1

    def __init__(self, n):
        self.n = n

    def map_unordered(self, tasks):
        inner = SerialExecutor().map_unordered(tasks)
        for i, item in enumerate(inner):
            if i == self.n:
                raise KeyboardInterrupt
            yield item


def test_ctrl_c_leaves_finished_runs_on_disk(tmp_path):
    base = scenario_from_dict(tiny(num_requests=40))
    points = expand(base, grid_points({"cluster.replicas": [1, 2]}))
    with pytest.raises(SweepInterrupted, match="2 of 4 runs"):
        run_sweep(points, [0, 1], tmp_path, _InterruptAfter(2))
    assert len(list((tmp_path / "runs").rglob("seed-*.json"))) == 2
    assert not list((tmp_path / "runs").rglob("*.tmp*"))
    res = run_sweep(points, [0, 1], tmp_path, SerialExecutor(), resume=True)
    assert (res.num_ran, res.num_skipped) == (2, 2)


def test_bootstrap_and_t_intervals():
    rng = np.random.default_rng(3)
    x = rng.lognormal(5, 0.5, size=8)
    lo, hi = bootstrap_interval(x)
    assert lo < x.mean() < hi and x.min() <= lo and hi <= x.max()
    tlo, thi = t_interval(x)
    assert tlo < x.mean() < thi
    from scipy import stats

    assert (tlo, thi) == pytest.approx(stats.t.interval(0.95, 7, loc=x.mean(), scale=stats.sem(x)))
    assert bootstrap_interval(np.array([4.0, 4.0, 4.0])) == (4.0, 4.0)  # identical seeds: width 0
    assert t_interval(np.array([7.0])) == (7.0, 7.0)


def test_trace_replay_seeds_are_identical_and_said_so(tmp_path):
    rng = np.random.default_rng(0)
    n = 80
    pl.DataFrame({"request_id": np.arange(n), "arrival_s": np.cumsum(rng.exponential(0.1, n)) - 0.0,
                  "input_tokens": rng.integers(100, 800, n), "output_tokens": rng.integers(10, 100, n)}
                 ).with_columns(pl.col("arrival_s") - pl.col("arrival_s").min()).write_parquet(tmp_path / "t.parquet")
    raw = small_scenario(workload={"trace": {"path": str(tmp_path / "t.parquet")}})
    points = expand(scenario_from_dict(raw), grid_points({"workload.trace.time_scale": [1.0, 0.5]}))
    res = run_sweep(points, [0, 1], tmp_path / "out", SerialExecutor())
    assert res.aggregate["seeds_identical"].to_list() == [True, True]
    assert (res.aggregate["p99_ttft_ms_ci95_high"] == res.aggregate["p99_ttft_ms_ci95_low"]).all()
    rates = res.aggregate["request_rate_mean"].to_list()
    assert rates[1] == pytest.approx(2 * rates[0])  # time_scale 0.5 doubles the rate


def test_utilization_and_gpu_count():
    # two replicas, 3 s of steps in a 4 s run
    assert utilization(np.array([1.0, 2.0]), np.array([0.0, 2.0]), 2) == pytest.approx(3 / 8)
    assert utilization(np.zeros(0), np.zeros(0), 1) == 0.0
    s = scenario_from_dict(small_scenario(cluster={"replicas": 3, "tensor_parallel_size": 2}))
    assert num_gpus(s) == 6
    d = scenario_from_dict(small_scenario(engine={"policy": "disaggregated"}, disaggregation={
        "prefill": {"replicas": 2, "tensor_parallel_size": 2}, "decode": {"replicas": 1, "tensor_parallel_size": 4}}))
    assert num_gpus(d) == 8


def test_aggregate_counts_errors_apart():
    rows = pl.DataFrame({"point_id": ["a", "a", "b"], "label": ["a", "a", "b"], "seed": [0, 1, 0],
                         "p99_ttft_ms": [10.0, 12.0, None], "error": [None, None, "does not fit"]})
    agg = aggregate(rows, ["point_id", "label"])
    assert agg["num_seeds"].to_list() == [2, 0] and agg["num_errors"].to_list() == [0, 1]
    assert agg["p99_ttft_ms_mean"].to_list() == [11.0, None]


def test_executor_choice_errors():
    with pytest.raises(UserError, match="local or ray"):
        make_executor("dask", None, None)
    with pytest.raises(UserError, match="--address is for --executor ray"):
        make_executor("local", 2, "auto")
    with pytest.raises(UserError, match="--workers"):
        make_executor("local", 0, None)


def simsrv(*args):
    return subprocess.run([sys.executable, "-m", "sim", *map(str, args)], cwd=ROOT, capture_output=True, text=True)


def _charts(html: str) -> tuple[int, int]:
    divs = len(re.findall(r'<div class="chart" id="chart\d+"></div>', html))
    specs = json.loads(re.search(r"const specs = (\{.*?\});\n", html, re.S).group(1).replace("<\\/", "</"))
    return divs, len(specs)


def test_sweep_cli_writes_tables_and_report(tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(tiny(num_requests=60)))
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({"workload.synthetic.request_rate": [5, 15],
                                                     "engine.policy": ["chunked", "continuous"]}))
    p = simsrv("sweep", tmp_path / "s.yaml", "--grid", tmp_path / "g.yaml", "--seeds", "2", "--workers", "2",
               "--out", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    assert "4 points x 2 seeds" in p.stdout
    assert pl.read_parquet(tmp_path / "out" / "sweep.parquet").height == 8
    html = (tmp_path / "out" / "report.html").read_text()
    divs, specs = _charts(html)
    assert divs == specs == 6  # p99 TTFT, TPOT, E2E, mean TTFT, throughput, utilisation
    assert "policy=chunked" in html and "request rate (req/s)" in html
    p = simsrv("sweep", tmp_path / "s.yaml", "--grid", tmp_path / "g.yaml", "--out", tmp_path / "out")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--resume" in p.stderr


def test_shipped_grid_example_is_valid():
    from sim.scenario import load_scenario

    base = load_scenario(ROOT / "scenarios" / "batching.yaml")
    points = expand(base, read_grid(ROOT / "scenarios" / "grid_example.yaml"))
    assert len(points) >= 4


@pytest.mark.parametrize("args, words", [
    (["--slo", "ttft_p99=500"], "METRIC_STAT_ms"),
    (["--slo", "ttft_p99_ms=fast"], "number"),
])
def test_capacity_cli_bad_input_is_one_line(args, words):
    p = simsrv("capacity", "scenarios/batching.yaml", *args)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and words in p.stderr


def test_ray_executor_runs_a_sweep(tmp_path):
    pytest.importorskip("ray")
    from sim.sweep.executors import RayExecutor

    base = scenario_from_dict(tiny(num_requests=40))
    points = expand(base, grid_points({"engine.policy": ["chunked", "continuous"]}))
    ex = RayExecutor(None, ("h100-sxm",))
    res = run_sweep(points, [0, 1], tmp_path, ex)
    local = run_sweep(points, [0, 1], tmp_path / "local", SerialExecutor())
    cols = ["point_id", "seed", "p99_ttft_ms", "total_input_tokens"]
    assert res.rows.select(cols).equals(local.rows.select(cols))


def test_ray_task_keeps_its_cost_models_for_the_next_task(monkeypatch):
    """A Ray worker runs ``run_task_sharing``: its second task of the same cost inputs reuses
    the first's cost model, and both rows equal ``run_task``'s on fresh cost models."""
    import sim.engine.deployment as deployment
    from sim.sweep.task import Task, run_task, run_task_sharing

    monkeypatch.setattr(deployment, "_shared", None)  # this test's process: sharing off again afterwards
    tasks = [Task("p", 0, seed, {**tiny(num_requests=40), "seed": seed}, str(ROOT)) for seed in (0, 1)]
    fresh = [run_task(t) for t in tasks]
    assert deployment._shared is None
    built = []
    real_cost_model = deployment.RooflineCostModel
    monkeypatch.setattr(deployment, "RooflineCostModel", lambda *a, **k: built.append(1) or real_cost_model(*a, **k))
    shared = [run_task_sharing(t) for t in tasks]
    assert len(built) == 1 and len(deployment._shared) == 1
    wall = ("simsrv_wall_s", "simsrv_requests_per_wall_s")  # the host's clock
    assert [{k: v for k, v in r.items() if k not in wall} for r in shared] == \
        [{k: v for k, v in r.items() if k not in wall} for r in fresh]
    assert fresh[0]["p99_ttft_ms"] != fresh[1]["p99_ttft_ms"]


def test_intervals_stay_within_what_a_run_can_give():
    """Two seeds far apart give a t interval wider than the mean: it is cut at 0 (and at 1 for
    utilisation and KV use), never a negative throughput."""
    from sim.sweep.stats import interval

    lo, hi = interval("request_throughput", np.array([0.1, 5.0]))
    assert lo == 0.0 and hi > 5.0
    lo, hi = interval("simsrv_utilization", np.array([0.6, 1.0]))
    assert hi == 1.0 and 0.0 <= lo < 0.6
