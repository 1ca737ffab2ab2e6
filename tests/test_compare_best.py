"""compare: a run that fails requests the others serve is never "best" on a latency row (its
latencies cover only the requests it could serve); the completed and failed counts open the
table; compare.json holds every run's figures and the page's bests, by the same rule."""

import json
import re

import numpy as np
import polars as pl
import yaml

from sim.reporting.html import Page
from sim.reporting.metrics_table import ROWS, best_by_metric, best_cells, metrics_table
from sim.reporting.rundata import RunData
from tests.conftest import ROOT, small_scenario
from tests.inproc_cli import simsrv

LATENCY = [i for i, r in enumerate(ROWS) if r.latency]


def _run(label, ttft_s, failed, gpus=1):
    ttft_s = np.asarray(ttft_s)
    req = pl.DataFrame({"status": ["completed"] * len(ttft_s), "ttft_s": ttft_s})
    s = {"simsrv_num_gpus": gpus, "completed": len(ttft_s), "failed": failed}
    for p in (50, 90, 99):
        s[f"p{p}_ttft_ms"] = float(np.percentile(ttft_s, p)) * 1e3
    return RunData(label, ROOT, s, req, pl.DataFrame(), {})


def _marked(best, column):
    return {ROWS[i].metric for i, j in best if j == column}


def test_a_run_with_failures_is_never_best_on_a_latency_row():
    rng = np.random.default_rng(0)
    fails = _run("fails", rng.lognormal(-2, 0.3, 2000), failed=1500)  # 10x faster: it dropped the hard ones
    slow = _run("slow", rng.lognormal(0, 0.3, 3500), failed=0)
    slower = _run("slower", rng.lognormal(1, 0.3, 3500), failed=0)
    best = best_cells([fails, slow, slower])
    assert not {i for i, j in best if j == 1} & set(LATENCY)
    # among the runs with the fewest failures (none), the faster is still best
    assert {"p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms"} <= _marked(best, 2)
    assert "failed" not in _marked(best, 1)
    # two runs, one failing: no latency best at all (one run left to rank)
    assert not {i for i, _ in best_cells([fails, slow])} & set(LATENCY)
    # equal failures: ranked as before
    twin = _run("twin", rng.lognormal(0, 0.3, 2000), failed=1500)
    assert "p99_ttft_ms" in _marked(best_cells([fails, twin]), 1)


def test_fewest_failures_are_taken_within_a_gpu_group():
    rng = np.random.default_rng(1)
    one_a = _run("1a", rng.lognormal(-2, 0.3, 2000), failed=40)
    one_b = _run("1b", rng.lognormal(0, 0.3, 2000), failed=40)
    two = _run("2", rng.lognormal(1, 0.3, 2000), failed=0, gpus=2)  # another group: not compared
    assert "p99_ttft_ms" in _marked(best_cells([one_a, one_b, two]), 1)


def test_completed_and_failed_open_the_table():
    assert [r.key for r in ROWS[:2]] == ["completed", "failed"]
    page = Page("t")
    metrics_table(page, [_run("a", np.ones(10), 0), _run("b", np.ones(10), 3)])
    html = "".join(page.parts)
    first = re.findall(r"<tr><td>([^<]*)</td>", html)
    assert first[:2] == ["completed", "failed"]
    assert "never best on latency" in html


def _page_bests(html: str, labels: list[str]) -> dict:
    table = html[html.index("<table>"):html.index("</table>")]
    page_best = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]:
        cells = re.findall(r"<td([^>]*)>([^<]*)</td>", row)
        marked = [j for j, (attrs, _) in enumerate(cells) if "best" in attrs]
        if len(marked) == 1:
            metric = next(r.metric for r in ROWS if r.label == cells[0][1])
            page_best[metric] = labels[marked[0] - 1]
    return page_best


def test_compare_json_holds_every_run_and_the_pages_bests(tmp_path):
    raw = small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 8192, "max_num_seqs": 64})
    raw["workload"]["synthetic"]["request_rate"] = 40
    s = tmp_path / "s.yaml"
    s.write_text(yaml.safe_dump(raw))
    out = simsrv("compare", s, "--policies", "static,continuous,chunked", "--out", tmp_path / "c")
    assert out.code == 0, out.stderr
    doc = json.loads((tmp_path / "c/compare.json").read_text())
    assert list(doc) == ["runs", "best"]
    runs = {r["policy"]: r for r in doc["runs"]}
    assert list(runs) == ["static", "continuous", "chunked"]
    for policy, r in runs.items():
        result = json.loads((tmp_path / "c" / policy / "result.json").read_text())
        assert list(r)[:4] == ["policy", "gpus", "completed", "failed"]
        assert {k: v for k, v in r.items() if k not in ("policy", "gpus")} == result
        assert r["gpus"] == result["simsrv_num_gpus"] == 1
    # the same bests as the page highlights
    assert doc["best"] and _page_bests((tmp_path / "c/report.html").read_text(),
                                       ["static", "continuous", "chunked"]) == doc["best"]


def test_a_run_that_fails_requests_is_not_best_in_compare_json(tmp_path):
    """continuous with max_model_len 1,024 fails the longer prompts (their requests exceed it) and
    so has the lowest TTFT over what it served; it must not be best on a latency row."""
    from sim.analysis.compare import compare_json
    from sim.reporting.compare_page import build_compare_page
    from sim.reporting.rundata import load_run

    raw = small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 1024, "max_num_seqs": 64})
    raw["workload"]["synthetic"]["request_rate"] = 40
    s = tmp_path / "s.yaml"
    s.write_text(yaml.safe_dump(raw))
    sets = {"continuous": ["--policy", "continuous", "--set", "engine.max_model_len=1024"], "chunked": []}
    for policy, extra in sets.items():
        out = simsrv("run", s, *extra, "--out", tmp_path / policy, "-q")
        assert out.code == 0, out.stderr
    runs = [load_run(tmp_path / p, p) for p in sets]
    doc = compare_json(runs, list(sets))
    byp = {r["policy"]: r for r in doc["runs"]}
    assert byp["continuous"]["failed"] > 0 == byp["chunked"]["failed"]
    assert byp["continuous"]["p99_ttft_ms"] < byp["chunked"]["p99_ttft_ms"]
    latency = {r.metric for r in ROWS if r.latency}
    assert not [k for k, p in doc["best"].items() if k in latency and p == "continuous"]
    page = build_compare_page(runs, "t")
    assert _page_bests("".join(page.parts), list(sets)) == doc["best"]


def test_best_by_metric_leaves_out_a_row_with_one_best_per_gpu_count():
    rng = np.random.default_rng(2)
    runs = [_run("a1", rng.lognormal(-1, 0.3, 2000), 0), _run("b1", rng.lognormal(0, 0.3, 2000), 0),
            _run("a2", rng.lognormal(-1, 0.3, 2000), 0, gpus=2), _run("b2", rng.lognormal(0, 0.3, 2000), 0, gpus=2)]
    best = best_cells(runs)
    row = next(i for i, r in enumerate(ROWS) if r.metric == "p99_ttft_ms")
    assert (row, 1) in best and (row, 3) in best
    assert "p99_ttft_ms" not in best_by_metric(runs, ["a1", "b1", "a2", "b2"])
