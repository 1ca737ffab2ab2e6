"""Report pages as read: charts as wide as the page, series of different scales in their own
panels or as shares, labels that cannot overlap, text left / numbers right, and a trace page
with plain numbers, a prompt-length distribution and axes that start with the trace."""

import json
import re

import numpy as np
import polars as pl

from sim.reporting.compare_page import build_compare_page
from sim.reporting.html import PAGE_CHART_WIDTH, Page
from sim.reporting.rundata import RunData
from sim.reporting.trace_page import write_trace_html
from sim.workload.inspect import trace_stats
from tests.conftest import ROOT


def _specs(html: str) -> dict:
    return json.loads(re.search(r"const specs = (\{.*?\});\n", html, re.S).group(1).replace("<\\/", "</"))


def _run(label: str, scale: float, rng) -> RunData:
    n, k = 500, 2000
    ttft = rng.lognormal(-2, 0.5, n) * scale
    req = pl.DataFrame({"status": ["completed"] * n, "ttft_s": ttft, "tpot_s": rng.lognormal(-4, 0.2, n),
                        "input_tokens": rng.integers(1, 4000, n),
                        **{p: ttft / 6 for p in ("ttft_wait_batch_s", "ttft_wait_kv_s", "ttft_prefill_s",
                                                 "ttft_interference_s", "ttft_overhead_s", "ttft_preempt_s")}})
    steps = pl.DataFrame({"replica": np.zeros(k, np.int64), "start_s": np.sort(rng.uniform(0, 100, k)),
                          "duration_s": np.full(k, 0.05), "num_steps": np.ones(k, np.int64),
                          "num_seqs": rng.integers(1, 64, k),
                          "prefill_tokens": (rng.integers(0, 512, k) * scale).astype(np.int64),
                          "decode_tokens": rng.integers(0, 64, k), "kv_blocks_used": rng.integers(0, 900, k),
                          "num_waiting": (rng.integers(0, 5, k) * scale).astype(np.int64)})
    summary = {"simsrv_policy": "chunked", "num_prompts": n, "simsrv_num_gpus": 1, "completed": n,
               "p99_ttft_ms": float(np.percentile(ttft, 99)) * 1e3, "model_id": "m", "simsrv_gpu": "g"}
    return RunData(label, ROOT, summary, req, steps, {"name": label, "engine": {"policy": label}})


def test_compare_page_charts_use_the_page_width_and_separate_different_scales():
    rng = np.random.default_rng(0)
    html = build_compare_page([_run("fast", 1.0, rng), _run("static", 100.0, rng)], "t").render()
    specs = _specs(html)
    for cid, spec in specs.items():
        inner = spec.get("spec", spec)
        assert inner.get("width") == "container" or inner.get("width", 0) >= PAGE_CHART_WIDTH - 200, cid
        assert spec["config"]["axis"]["labelOverlap"] is True and spec["config"]["axis"]["labelSeparation"] > 0
    # queue depth 100x apart: one panel per run, each with its own y scale
    queue = next(s for s in specs.values() if "Queue depth" in json.dumps(s.get("title", "")))
    assert "facet" in queue and queue["resolve"]["scale"]["y"] == "independent"
    # TTFT 100x apart: the decomposition shows shares, each run's mean TTFT in its label
    dec = next(s for s in specs.values() if "decomposition" in json.dumps(s.get("title", "")))
    assert dec["encoding"]["x"]["stack"] == "normalize" and "row" in dec["encoding"]
    labels = {r["label"] for r in next(iter(dec["datasets"].values()))}
    assert any(lab.startswith("static (") and lab.endswith((" ms)", " s)")) for lab in labels)


def test_text_columns_left_numbers_right():
    page = Page("t")
    page.table(["key", "a", "b"], [["engine.policy", "static", "chunked"], ["cluster.replicas", "1", "2"]])
    page.table(["metric", "a"], [["TTFT p99 (ms)", "1,234"], ["hit rate", "12.5%"], ["x", "-"]])
    html = "".join(page.parts)
    assert "<td>static</td>" in html and "<td>engine.policy</td>" in html       # text: left (default)
    assert '<td class="num">1,234</td>' in html and '<th class="num">a</th>' in html
    assert '<td class="num">12.5%</td>' in html


def test_trace_page_plain_numbers_prompt_lengths_and_axis_from_the_first_request(tmp_path):
    stats = trace_stats(ROOT / "traces/samples/mooncake_synthetic_first500.jsonl")
    out = tmp_path / "t.html"
    write_trace_html(stats, out)
    html = out.read_text()
    table = html[html.index("<table>"):html.index("</table>")]
    assert not re.search(r"\de[+-]\d", table)              # no scientific notation
    assert "prompt tokens, p99" in table and "61,593.3" in table
    specs = list(_specs(html).values())
    rate, lengths, outputs = specs
    assert "output-length distribution" in outputs["title"]
    assert rate["encoding"]["x"]["scale"]["domain"] == [0, stats["span_s"] / 60]
    assert rate["encoding"]["x"]["scale"]["nice"] is False
    assert "prompt-length distribution" in lengths["title"]
    bins = lengths["data"]["values"]
    assert sum(b["count"] for b in bins) == stats["num_requests"] == 500
