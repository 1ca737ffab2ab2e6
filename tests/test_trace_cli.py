"""``simsrv trace inspect|convert``, rescaling that keeps burstiness, and the shipped trace scenarios."""

import json
import subprocess
import sys

import numpy as np
import pytest

from sim.workload.trace import read_trace


def _sim(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "sim", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_inspect_json_figures(root, tmp_path):
    p = root / "traces" / "samples" / "mooncake_synthetic_first500.jsonl"
    r = _sim("trace", "inspect", p, "--json", "--html", tmp_path / "t.html")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["num_requests"] == 500 and s["span_s"] == pytest.approx(139.272)
    assert s["prefix_block_reuse_ratio"] == pytest.approx(1 - 11_749 / 12_833)
    assert s["mean_rate_per_s"] == pytest.approx(499 / 139.272)
    # full minutes over 60 s, the last (partial) minute over the 19.272 s it covers
    rates = s["rate_per_minute"]
    assert len(rates) == 3 and sum(rates[:2]) * 60 + rates[2] * (139.272 - 120) == pytest.approx(500)
    assert "vegaEmbed" in (tmp_path / "t.html").read_text()


def test_convert_target_rate_keeps_burstiness(root, tmp_path):
    src = root / "traces" / "samples" / "azure_code_2023_first500.csv"
    out = tmp_path / "o.parquet"
    r = _sim("trace", "convert", src, "-o", out, "--target-rate", 20, "--start", 10, "--duration", 200)
    assert r.returncode == 0, r.stderr
    a = read_trace(src)
    a = a.take((a.arrival_s >= 10) & (a.arrival_s < 210))
    b = read_trace(out)
    ga, gb = np.diff(a.arrival_s), np.diff(b.arrival_s)
    assert len(b) == len(a) and b.mean_rate_per_s == pytest.approx(20)
    assert np.allclose(gb, ga * (gb.sum() / ga.sum()))  # every gap scaled by one factor
    assert gb.std() / gb.mean() == pytest.approx(ga.std() / ga.mean())
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(out).schema_arrow.metadata
    assert meta[b"source_format"] == b"azure" and meta[b"time_unit"] == b"s"


def test_convert_sample_is_seeded(root, tmp_path):
    src = root / "traces" / "samples" / "vidur_splitwise_conv_first500.csv"
    outs = []
    for i in range(2):
        out = tmp_path / f"s{i}.parquet"
        assert _sim("trace", "convert", src, "-o", out, "--sample", 50, "--seed", 3).returncode == 0
        outs.append(read_trace(out))
    assert len(outs[0]) == 50 and np.array_equal(outs[0].input_tokens, outs[1].input_tokens)


@pytest.mark.parametrize("name", ["trace_mooncake", "trace_burstgpt", "trace_generic", "trace_vllm_bench"])
def test_trace_scenarios_run(root, tmp_path, name):
    r = _sim("run", root / "scenarios" / f"{name}.yaml", "-q", "--out", tmp_path / name, cwd=root)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / name / "result.json").read_text())["completed"] > 0
