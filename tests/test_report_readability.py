"""Reports as a reader takes them in (issue 36, item 8): grid values in numeric order, SLO lines,
intervals only where there are seeds to make them, modelling notes that apply (as prose),
latencies in s when large, tables not cut to 80 columns in a file or pipe, and trace inspect's
bursts, timestamp grid and output-length histogram."""

from __future__ import annotations

import html as html_text
import io
import itertools
import json

import numpy as np
import polars as pl
import pytest

from sim.analysis import notes
from sim.cli.consoles import LazyConsole
from sim.policies.registry import policy_names
from sim.reporting import charts
from sim.reporting.sweep_page import sweep_page
from sim.workload.inspect import trace_stats
from tests.conftest import ROOT
from tests.inproc_cli import simsrv

FIGURES = ("p99_ttft_ms", "p99_tpot_ms", "p99_e2el_ms", "mean_ttft_ms", "request_throughput", "request_goodput",
           "simsrv_utilization", "request_rate")


def _agg(grid: dict[str, list], seeds: int = 2, ttft_ms=None) -> pl.DataFrame:
    """An aggregate frame as the sweep runner writes it: one row per point, in grid order."""
    keys = list(grid)
    combos = [dict(zip(keys, vals)) for vals in itertools.product(*grid.values())]
    rows = []
    for i, c in enumerate(combos):
        r = {"point_id": f"p{i}", "point": i, "label": ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in c.items()),
             **c, "num_seeds": seeds, "num_errors": 0, "seeds_identical": False}
        for m in FIGURES:
            v = float((ttft_ms or {}).get(i, 10.0 + i)) if m == "p99_ttft_ms" else 5.0 + i
            if m == "simsrv_utilization":
                v = 0.5
            if m == "request_rate":
                v = float(c.get("workload.synthetic.request_rate", 1.0))
            r[f"{m}_mean"], r[f"{m}_ci95_low"], r[f"{m}_ci95_high"] = v, v * 0.9, v * 1.1
        rows.append(r)
    return pl.DataFrame(rows)


def _layers(spec: dict) -> list[dict]:
    out = []
    for layer in spec.get("layer", [spec]):
        out += _layers(layer) if "layer" in layer else [layer]
    return out


def _marks(spec: dict) -> set[str]:
    return {(lay["mark"]["type"] if isinstance(lay["mark"], dict) else lay["mark"]) for lay in _layers(spec)}


def _chart(page, title_start: str) -> dict:
    return next(s for s in page.specs.values() if json.dumps(s.get("title", "")).strip('"').startswith(title_start))


def test_sweep_page_orders_numeric_grid_values_as_numbers():
    """max_num_batched_tokens 8192, 512, 2048 and replicas 1, 2, 10: the x axis, the legend and the
    table in numeric order (as text, "10" < "2" and "2048" < "512")."""
    agg = _agg({"engine.max_num_batched_tokens": [8192, 512, 2048], "cluster.replicas": [1, 2, 10]})
    page = sweep_page(agg, ["engine.max_num_batched_tokens", "cluster.replicas"], None, "t", [])
    spec = _chart(page, "p99 TTFT")
    enc = _layers(spec)[-1]["encoding"]
    assert enc["x"]["type"] == "ordinal" and enc["x"]["sort"] == [512, 2048, 8192]
    assert enc["x"]["title"] == "max_num_batched_tokens"
    assert enc["color"]["sort"] == ["replicas=1", "replicas=2", "replicas=10"]
    body = "".join(page.parts)
    table = body[body.index("<table>"):]
    rows = table.split("<tr>")[2:]                                  # after the header row
    first_two = [[c.split(">", 1)[1].split("</td>")[0] for c in r.split("<td")[1:3]] for r in rows]
    assert first_two == [[t, r] for t in ("512", "2048", "8192") for r in ("1", "2", "10")]


def test_sweep_page_with_a_rate_key_plots_the_rate_and_sorts_the_legend_numerically():
    agg = _agg({"workload.synthetic.request_rate": [5, 10], "engine.max_num_seqs": [128, 32, 64]})
    page = sweep_page(agg, ["workload.synthetic.request_rate", "engine.max_num_seqs"],
                      "workload.synthetic.request_rate", "t", [])
    enc = _layers(_chart(page, "p99 TTFT"))[-1]["encoding"]
    assert enc["x"]["type"] == "quantitative" and enc["x"]["title"] == "request rate (req/s)"
    assert enc["color"]["sort"] == ["max_num_seqs=32", "max_num_seqs=64", "max_num_seqs=128"]


def test_one_seed_draws_no_band_and_says_intervals_need_two_seeds():
    from sim.reporting.sweep_page import NO_INTERVAL_NOTE

    grid = {"workload.synthetic.request_rate": [5, 10, 20]}
    one = sweep_page(_agg(grid, seeds=1), list(grid), "workload.synthetic.request_rate", "t", [])
    html = "".join(one.parts)
    assert html_text.escape(NO_INTERVAL_NOTE) in html and "--seeds &gt;= 2" in html
    for spec in one.specs.values():
        assert not _marks(spec) & {"area", "errorbar"}
    assert "[" not in html[html.index("<table>"):]  # no interval in the table either
    two = sweep_page(_agg(grid, seeds=2), list(grid), "workload.synthetic.request_rate", "t", [])
    assert html_text.escape(NO_INTERVAL_NOTE) not in "".join(two.parts)
    assert "area" in _marks(_chart(two, "p99 TTFT"))


def test_slo_limits_are_labelled_lines_on_the_matching_latency_charts():
    grid = {"workload.synthetic.request_rate": [5, 10]}
    page = sweep_page(_agg(grid), list(grid), "workload.synthetic.request_rate", "t", [],
                      slo={"ttft_ms": 500.0, "tpot_ms": None, "e2el_ms": None})
    ttft = _layers(_chart(page, "p99 TTFT"))
    rules = [lay for lay in ttft if lay["mark"]["type"] == "rule"]
    texts = [lay for lay in ttft if lay["mark"]["type"] == "text"]
    assert len(rules) == 1 and len(texts) == 1
    dumped = json.dumps(_chart(page, "p99 TTFT"))  # the rule's value and label travel in its datasets
    assert '"limit": 500.0' in dumped and "SLO ttft <= 500 ms" in dumped
    assert not [lay for lay in _layers(_chart(page, "p99 TPOT")) if lay["mark"]["type"] == "rule"]


def test_latencies_from_10000_ms_are_shown_in_seconds():
    from sim.reporting.units import fmt_latency_ci_ms, fmt_latency_ms, latency_unit

    assert fmt_latency_ms(4_292_988.0) == "4,292.99 s"
    assert fmt_latency_ms(9_999.0) == "9,999.0 ms" and fmt_latency_ms(10_000.0) == "10.00 s"
    assert fmt_latency_ci_ms(12_184.2, 11_887.4, 12_481.1) == "12.18 s [11.89, 12.48]"
    assert latency_unit([5.0, None, float("nan")]) == ("ms", 1.0)
    grid = {"workload.synthetic.request_rate": [5, 10]}
    page = sweep_page(_agg(grid, ttft_ms={0: 50.0, 1: 4_292_988.0}), list(grid), "workload.synthetic.request_rate",
                      "t", [])
    html = "".join(page.parts)
    assert "4,292.99 s [3,863.69, 4,722.29]" in html and "4,292,988" not in html
    spec = _chart(page, "p99 TTFT")
    assert spec["title"] == "p99 TTFT (s)" and "(s, log scale)" in json.dumps(spec)
    values = next(iter(spec["datasets"].values()))
    assert max(v["p99_ttft_ms_mean"] for v in values) == pytest.approx(4_292.988)
    frame, unit = charts.in_latency_unit(pl.DataFrame({"value": [12.0, 40_000.0]}))
    assert unit == "s" and frame["value"].to_list() == [0.012, 40.0]


def test_faceted_panels_name_their_unit_once_in_the_title():
    """Panels 70 px high: a y title per panel ran into the next one's."""
    rng = np.random.default_rng(0)
    frame = pl.DataFrame({"time_s": np.tile(np.arange(10.0), 3), "run": np.repeat(["a", "b", "c"], 10),
                          "waiting": np.concatenate([rng.uniform(0, 1, 10), rng.uniform(0, 100, 10),
                                                     rng.uniform(0, 1000, 10)])})
    spec = charts.time_chart(frame, "waiting", "Queue depth", "requests").to_dict()
    assert "facet" in spec and spec["spec"]["encoding"]["y"]["title"] is None
    assert "requests" in spec["title"]


def test_notes_left_out_where_their_condition_does_not_hold():
    plain = notes.RunFacts()
    texts = [n for _m, n in notes.notes_for(["continuous"], [plain])]
    assert not any("pipeline" in n for n in texts)            # no pipeline parallelism
    assert not any("3 s grid" in n for n in texts)            # no trace on a timestamp grid
    assert not any("SGLang evicts" in n or "true caches" in n for n in texts)  # one replica, round robin
    assert any("CUDA context" in n for n in texts)            # unconditional notes stay
    grid = notes.run_facts({"model": "llama-3-8b", "workload": {"trace": {"path": "t.csv"}},
                      "cluster": {"pipeline_parallel_size": 2}}, np.repeat(np.arange(0.0, 30.0, 3.0), 5))
    assert grid.timestamp_grid and grid.pipeline_parallel == 2
    texts = [n for _m, n in notes.notes_for(["continuous"], [grid])]
    assert any("3 s grid" in n for n in texts) and any("pipeline" in n for n in texts)
    spread = notes.run_facts({"model": "llama-3-8b", "workload": {"trace": {"path": "t.csv"}}},
                       np.sort(np.random.default_rng(0).uniform(0, 30, 50)))
    assert not spread.timestamp_grid
    assert notes.unmatched_conditions() == []                       # every condition still names a note


def test_notes_shown_to_users_hold_no_code_or_file_references():
    everything = notes.RunFacts(replicas=4, router="cache_aware", pipeline_parallel=2, sliding_window=True,
                          multi_step=True, swap=True, no_evict=True, quantized=True, moe=True, mha=True,
                          trt_llm_kernels=True, partial_prefills=True, timestamp_grid=True)
    shown = notes.notes_for(list(policy_names()), [everything])
    assert len(shown) > 20
    for module, text in shown:
        assert notes.is_code_free(text), (module, text)
        assert text.count("(") == text.count(")"), (module, text)
    assert not any("del self" in n or "kernels_profile/" in n or "``" in n for _m, n in shown)
    assert notes.readable("GEMM 0.85 (875/989 TFLOP/s, kernels_profile/hardware.md); more") == "GEMM 0.85 (875/989 TFLOP/s); more"
    assert notes.readable("once per run (``RunCost.lm_head_extrapolated``), not per step") == "once per run, not per step"


def test_tables_to_a_file_or_pipe_are_laid_out_wider_than_80_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    from rich.table import Table

    buf = io.StringIO()
    console = LazyConsole(file=buf)
    t = Table()
    for c in ("point", "p99 TTFT", "p99 TPOT", "req/s", "errors"):
        t.add_column(c)
    label = "max_num_batched_tokens=2048, replicas=10"
    t.add_row(label, "2,431.7 ms [1,240.2, 3,623.2]", "11.8 ms [11.7, 12.0]", "9.2 [0.0, 21.3]", "0")
    console.print(t)
    console.print("x " * 100, markup=False)
    out = buf.getvalue()
    assert console.width > 80 and label in out and "…" not in out
    assert len(out.splitlines()[1]) > 80 and ("x " * 100).strip() in out   # the text line is not wrapped either
    monkeypatch.setenv("COLUMNS", "100")
    assert LazyConsole(file=io.StringIO()).width == 100     # the user's COLUMNS still decides


def test_sweep_table_on_stdout_keeps_whole_labels(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    grid = tmp_path / "grid.yaml"
    grid.write_text("engine.max_num_batched_tokens: [512, 2048]\ncluster.replicas: [1, 10]\n")
    import sim.cli.sweep as sweep_cli

    monkeypatch.setattr(sweep_cli, "out_console", LazyConsole())   # built afresh, on this test's stdout
    p = simsrv("sweep", ROOT / "scenarios/batching.yaml", "--grid", grid, "--seeds", "1", "--workers", "1",
               "--set", "workload.synthetic.num_requests=40", "--out", tmp_path / "sw")
    assert p.code == 0, p.stderr
    assert "max_num_batched_tokens=2048, replicas=10" in p.stdout and "…" not in p.stdout
    assert "one seed (intervals need --seeds >= 2)" in p.stdout


def _grid_trace(path, n: int = 700, per_step: int = 7, step_s: int = 3):
    rng = np.random.default_rng(1)
    lines = ["arrival_s,input_tokens,output_tokens"]
    lines += [f"{step_s * (i // per_step)}.0,{rng.integers(10, 3000)},{rng.integers(1, 900)}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_trace_inspect_reports_bursts_the_timestamp_grid_and_output_lengths(tmp_path):
    from sim.workload.readers import ReadOptions

    stats = trace_stats(_grid_trace(tmp_path / "grid.csv"), ReadOptions(format="generic"))
    assert stats["timestamp_grid_s"] == 3.0 and stats["zero_gap_fraction"] == pytest.approx(600 / 699)
    assert stats["peak_1s_rate_per_s"] == 7.0                    # a grid step's 7 requests in one second
    assert stats["peak_1s_over_mean"] == pytest.approx(7.0 / stats["mean_rate_per_s"])
    assert stats["peak_10s_rate_per_s"] == pytest.approx(2.8)    # 4 steps (0, 3, 6, 9 s) of 7
    assert sum(b["count"] for b in stats["output_tokens_histogram"]) == 700
    poisson = trace_stats(ROOT / "traces/samples/azure_code_2023_first500.csv")
    assert poisson["timestamp_grid_s"] is None and poisson["zero_gap_fraction"] == 0.0
    assert poisson["peak_1s_over_mean"] > 1.0


def test_trace_inspect_prints_and_draws_the_new_figures(tmp_path):
    html = tmp_path / "t.html"
    p = simsrv("trace", "inspect", _grid_trace(tmp_path / "grid.csv"), "--format", "generic", "--html", html)
    assert p.code == 0, p.stderr
    assert "timestamp grid: arrivals are rounded to a 3 s grid" in p.stdout
    assert "bursts: busiest 1 s 7 req/s" in p.stdout
    assert "output tokens (power-of-two bins), requests:" in p.stdout
    page = html.read_text()
    assert "output-length distribution" in page and "Timestamp grid: arrivals are rounded" in page
    assert "busiest 10 s / mean rate" in page


def test_capacity_page_legend_in_grid_order_and_a_log_rate_axis_when_probes_span_100x():
    from sim.reporting.capacity_page import capacity_page, capacity_table

    def record(label, knee, low, high, censored=None):
        return {"label": label, "error": None, "warning": None, "knee_rate_per_s": knee, "censored": censored,
                "knee_ci95_low": knee, "knee_ci95_high": knee, "bracket_low_per_s": low, "bracket_high_per_s": high,
                "binding_slo": "ttft_p99_ms", "utilization_at_knee": 0.9, "num_gpus": 1,
                "requests_per_s_per_gpu": knee, "requests_per_dollar": None, "seeds_identical": False}

    records = [record("replicas=1", 20.0, 19.0, 21.0), record("replicas=2", 70.0, 68.0, 72.0),
               record("replicas=10", 40_000.0, 40_000.0, None, censored="above")]
    probes = [{"config": i, "label": r["label"], "slo": "ttft_p99_ms", "rate_per_s": rate, "limit_ms": 500.0,
               "value_ms": v, "ci95_low_ms": 0.0, "ci95_high_ms": v * 1.2}
              for i, r in enumerate(records) for rate, v in ((10.0, 40.0), (r["bracket_low_per_s"], 450.0))]
    page = capacity_page(records, probes, "t", [])
    spec = next(iter(page.specs.values()))
    dumped = json.dumps(spec)
    assert dumped.count('"sort": ["replicas=1", "replicas=2", "replicas=10"]') >= 2   # curves and knee rules
    xs = [lay["encoding"]["x"] for lay in _layers(spec) if lay["encoding"].get("x", {}).get("field") == "rate_per_s"]
    assert xs and all(x["scale"]["type"] == "log" for x in xs) and "request rate (req/s, log scale)" in dumped
    assert capacity_table(records)[1][2][2] == ">= 40,000.00"                   # no "40,000.00 - -"
