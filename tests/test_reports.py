"""Reports as users see them: simsrv compare / report / diagnose, and the HTML in headless Chromium."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from sim.reporting.compare_page import build_compare_page
from sim.reporting.rundata import RunData
from sim.workload import RequestArrays
from sim.workload.trace import write_normalized
from tests.conftest import ROOT, small_scenario

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def simsrv(*args):
    return subprocess.run([sys.executable, "-m", "sim", *map(str, args)], cwd=ROOT, capture_output=True, text=True)


def num_chart_divs(html: str) -> int:
    return len(re.findall(r'<div class="chart" id="chart\d+">', html))


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    s = d / "s.yaml"
    # a budget that holds max_model_len (8192), as the policies without chunked prefill need; chunked: 512
    s.write_text(yaml.safe_dump(small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 8192},
                                               slo={"ttft_ms": 500, "tpot_ms": 50})))
    p = simsrv("compare", s, "--policies", "static,continuous,chunked,disaggregated", "--chunk", "512", "--out", d / "out")
    assert p.returncode == 0, p.stderr
    return d / "out"


def test_compare_writes_runs_and_one_report(compare_dir):
    html = (compare_dir / "report.html").read_text()
    for policy in ("static", "continuous", "chunked", "disaggregated"):
        assert json.loads((compare_dir / policy / "result.json").read_text())["simsrv_policy"] == policy
        assert f"<th>{policy}" in html
    assert num_chart_divs(html) == 7  # 2 CDFs, 4 over time, 1 TTFT decomposition
    assert re.search(r'class="[^"]*\bbest\b', html) and "Modelling notes that apply" in html
    assert "cdn.jsdelivr" not in html and "https://" not in html.split("<script")[0]


def test_report_from_run_dirs(compare_dir, tmp_path):
    out = tmp_path / "r.html"
    p = simsrv("report", compare_dir / "continuous", compare_dir / "chunked", "-o", out)
    assert p.returncode == 0, p.stderr
    assert num_chart_divs(out.read_text()) == 7


def test_report_of_a_non_run_exits_2(tmp_path):
    p = simsrv("report", tmp_path, "-o", tmp_path / "r.html")
    assert p.returncode == 2 and "not a simsrv run directory" in p.stderr and "Traceback" not in p.stderr


def test_report_stays_small_with_100k_requests(tmp_path):
    """Charts plot quantiles and time bins, never one mark per request: 100k requests and 300k
    steps per run still make a report under 5 MB."""
    rng = np.random.default_rng(0)
    n, k = 100_000, 300_000
    runs = []
    for label in ("a", "b"):
        ttft = rng.lognormal(-2, 1, n)
        req = pl.DataFrame({"status": ["completed"] * n, "ttft_s": ttft, "tpot_s": rng.lognormal(-4, 0.3, n),
                            "input_tokens": rng.integers(1, 4000, n),
                            **{p: ttft / 6 for p in ("ttft_wait_batch_s", "ttft_wait_kv_s", "ttft_prefill_s",
                                                     "ttft_interference_s", "ttft_overhead_s", "ttft_preempt_s")}})
        steps = pl.DataFrame({"replica": np.zeros(k, np.int64), "start_s": np.sort(rng.uniform(0, 3600, k)),
                              "duration_s": np.full(k, 0.012), "num_steps": np.ones(k, np.int64),
                              "num_seqs": rng.integers(1, 256, k), "prefill_tokens": rng.integers(0, 512, k),
                              "decode_tokens": rng.integers(0, 256, k), "kv_blocks_used": rng.integers(0, 9000, k),
                              "num_waiting": rng.integers(0, 50, k)})
        runs.append(RunData(label, tmp_path, {"simsrv_policy": "chunked", "num_prompts": n, "p99_ttft_ms": 1.0},
                            req, steps, {"name": label}))
    out = tmp_path / "big.html"
    build_compare_page(runs, "big").write(out)
    assert out.stat().st_size < 5 * 2**20


def _bursty_trace(path: Path) -> None:
    """Steady Poisson traffic (0.4 req/s) plus a burst of 25 requests within 0.5 s every 200 s;
    prompts lognormal around 2,200 tokens, outputs around 200."""
    rng = np.random.default_rng(0)
    base = np.cumsum(rng.exponential(1 / 0.4, 1200))
    bursts = np.concatenate([t0 + rng.uniform(0, 0.5, 25) for t0 in np.arange(100.0, base[-1], 200.0)])
    arr = np.sort(np.concatenate([base, bursts]))
    arr -= arr[0]
    n = len(arr)
    inp = np.clip(np.rint(rng.lognormal(np.log(2200) - 0.045, 0.3, n)), 16, 7000).astype(np.int64)
    out = np.clip(np.rint(rng.lognormal(np.log(200) - 0.08, 0.4, n)), 2, 1000).astype(np.int64)
    write_normalized(RequestArrays(arr, inp, out), path)


@pytest.fixture(scope="module")
def bursty(tmp_path_factory):
    d = tmp_path_factory.mktemp("diag")
    _bursty_trace(d / "bursty.parquet")
    (d / "deploy.yaml").write_text(yaml.safe_dump({
        "name": "bursty", "model": "llama-3-70b", "hardware": {"gpu": "h100-sxm"},
        "cluster": {"tensor_parallel_size": 4}, "engine": {"policy": "continuous"},
        "workload": {"synthetic": {"num_requests": 1}}}))
    return d


def test_diagnose_bursty_trace_is_queueing(bursty):
    """Llama-3-70B on 4 x H100: a ~2,200-token prompt prefills in ~170 ms and decode steps take
    ~21 ms, so the median request sees TTFT ~180 ms and TPOT ~22 ms; but a burst of 25 prompts
    in half a second needs 25 x ~170 ms = 4 s of prefill, so the last of a burst waits seconds:
    p99 TTFT > 2 s with prompt lengths explaining only a p99/p50 of ~2. The cure is capacity
    (or chunked prefill), not shorter prompts."""
    from sim.analysis.diagnose import diagnose

    d = diagnose(bursty / "bursty.parquet", bursty / "deploy.yaml")
    s = d.summary
    assert 140 < s["median_ttft_ms"] < 220 and 18 < s["median_tpot_ms"] < 26 and s["p99_ttft_ms"] > 2000
    assert d.cause == "queueing"
    assert d.ttft_ratio > 3 * d.prompt_ratio
    assert any("queueing signature" in x for x in d.sentences)
    order = [c.name for c in d.candidates]
    # ranked as a planner would (issue 36): one more replica's far larger gain above chunked prefill's
    assert order[0] == "add capacity" and order.index("add capacity") < order.index("long-prompt pool +1")
    assert order.index("add capacity") < order.index("chunked prefill")
    pools = [c for c in d.candidates if c.name.startswith("long-prompt pool")]
    # every candidate simulates every request, and the long-prompt pools count their GPUs (TP 4 each)
    assert {c.num_requests for c in d.candidates} == {s["num_prompts"]}
    assert sorted(c.gpus_added for c in pools) == [4, 8, 12] and {c.gpus - c.gpus_added for c in pools} == {4}
    assert "llama-3-70b" in d.sentences[0] and "4 GPUs" in d.sentences[0]
    assert d.floor["floor_ms"] < d.floor["tpot_ms"]


def test_diagnose_cli_with_measured_ttft(tmp_path):
    """A vLLM bench detailed JSON carries measured TTFTs: the report compares them per request."""
    out = tmp_path / "d"
    p = simsrv("diagnose", "traces/samples/vllm_bench_schema_example.json", "--out", out)
    assert p.returncode == 0, p.stderr
    html = (out / "report.html").read_text()
    assert "Simulated vs measured" in html and "ttft_median_abs_pct_error" in html
    assert (out / "run" / "requests.parquet").is_file()
    assert num_chart_divs(html) == 3


def _chromium_check(html_path: Path, tmp_path: Path) -> None:
    html = html_path.read_text()
    expected = num_chart_divs(html)
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
           "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / 'chrome'}",
           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=15000", "--dump-dom", html_path.as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    assert p.stdout.count('class="marks"') == expected > 0  # every chart rendered as an SVG


def test_trace_inspect_page_is_offline(tmp_path):
    out = tmp_path / "inspect.html"
    p = simsrv("trace", "inspect", "traces/azure_conv.parquet", "--html", out)
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    assert num_chart_divs(html) == 3 and "<script src=" not in html  # rate per minute, prompt and output lengths


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (Debian package chromium; .ci/run installs it)")
def test_reports_render_in_headless_chromium(compare_dir, bursty, tmp_path):
    _chromium_check(compare_dir / "report.html", tmp_path)
    inspect = tmp_path / "inspect.html"
    assert simsrv("trace", "inspect", "traces/azure_conv.parquet", "--html", inspect).returncode == 0
    _chromium_check(inspect, tmp_path)
    out = tmp_path / "diag"
    p = simsrv("diagnose", bursty / "bursty.parquet", "--scenario", bursty / "deploy.yaml", "--out", out)
    assert p.returncode == 0, p.stderr
    _chromium_check(out / "report.html", tmp_path)
