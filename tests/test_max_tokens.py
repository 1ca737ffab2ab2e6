"""``max_tokens`` apart from the output length (issue 37 item 2): the workload key, the trace
columns, and requests that stop at their max_tokens (finish reason length), counted."""

from __future__ import annotations

import numpy as np
import pytest

from sim.errors import UserError
from sim.metrics.summary import summarize
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from sim.workload.build import build_workload
from sim.workload.readers import ReadOptions
from sim.workload.trace import read_trace


def _raw(**workload) -> dict:
    return {"name": "mt", "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
            "engine": {"policy": "chunked", "max_model_len": 2048},
            "workload": {"synthetic": {"num_requests": 40, "request_rate": 20.0,
                                       "input_tokens": {"dist": "uniform", "min": 50, "max": 400},
                                       "output_tokens": {"dist": "uniform", "min": 1, "max": 300}},
                         **workload}}


def test_default_sends_none_and_output_mode_sends_each_output_length():
    none = build_workload(scenario_from_dict(_raw()))
    assert none.max_tokens is None  # none sent: the engine's default (its context left)
    out = build_workload(scenario_from_dict(_raw(max_tokens="output")))
    assert np.array_equal(out.max_tokens, out.output_tokens)
    fixed = build_workload(scenario_from_dict(_raw(max_tokens=128)))
    assert (fixed.max_tokens == 128).all()
    assert "max_tokens" not in scenario_from_dict(_raw()).resolved()["workload"]  # null: left out, as every null
    assert scenario_from_dict(_raw(max_tokens="output")).resolved()["workload"]["max_tokens"] == "output"


def test_a_fixed_max_tokens_stops_longer_outputs_and_counts_them():
    s = scenario_from_dict(_raw(max_tokens=128))
    drawn = build_workload(s).output_tokens
    result = run_scenario(s)
    summary = summarize(result)
    req = result.requests.sort("request_id")
    longer = drawn > 128
    assert longer.any() and summary["simsrv_truncated_requests"] == int(longer.sum())
    assert summary["failed"] == 0
    assert np.array_equal(req["output_tokens"].to_numpy(), np.minimum(drawn, 128))
    stopped = req.filter(req["fail_reason"] == "length")
    assert len(stopped) == int(longer.sum()) and (stopped["status"] == "completed").all()
    assert summary["total_output_tokens"] == int(np.minimum(drawn, 128).sum())


def test_none_sent_runs_to_the_context_end_instead_of_failing():
    # prompts of 1,900-2,000 tokens under max_model_len 2,048 with up to 300 output tokens: vLLM
    # serves each to the context's end (finish reason length) when no max_tokens is sent, and
    # refuses it (400) when one is sent that does not fit
    raw = _raw()
    raw["workload"]["synthetic"]["input_tokens"] = {"dist": "uniform", "min": 1900, "max": 2000}
    none = summarize(run_scenario(scenario_from_dict(raw)))
    assert none["failed"] == 0 and none["simsrv_truncated_requests"] > 0
    raw["workload"]["max_tokens"] = "output"
    sent = summarize(run_scenario(scenario_from_dict(raw)))
    assert sent["failed"] == none["simsrv_truncated_requests"]
    assert any("prompt+max_tokens" in k for k in sent["simsrv_failed_reasons"])


@pytest.mark.parametrize("value", [0, -3, "outputs", 2.5, True])
def test_bad_max_tokens_is_one_line_naming_the_key(value):
    with pytest.raises(UserError, match="workload.max_tokens"):
        scenario_from_dict(_raw(max_tokens=value))


def test_normalized_trace_max_tokens_column_round_trips(tmp_path):
    from sim.workload.normalized import write_normalized

    csv = tmp_path / "t.csv"
    csv.write_text("arrival_s,input_tokens,output_tokens,max_tokens\n0,100,50,64\n0.5,200,80,64\n1.0,10,5,256\n")
    w = read_trace(csv)
    assert w.max_tokens.tolist() == [64, 64, 256] and w.output_tokens.tolist() == [50, 80, 5]
    out = tmp_path / "n.parquet"
    write_normalized(w, out)
    assert read_trace(out).max_tokens.tolist() == [64, 64, 256]
    plain = tmp_path / "p.csv"
    plain.write_text("arrival_s,input_tokens,output_tokens\n0,100,50\n")
    assert read_trace(plain).max_tokens is None


def test_generic_trace_max_tokens_column_and_a_bad_value_named(tmp_path):
    f = tmp_path / "g.csv"
    f.write_text("t,p,o,cap\n0,100,50,40\n1,20,30,100\n")
    opts = ReadOptions(format="generic", arrival_column="t", input_column="p", output_column="o",
                       max_tokens_column="cap")
    assert read_trace(f, opts=opts).max_tokens.tolist() == [40, 100]
    f.write_text("t,p,o,cap\n0,100,50,40\n1,20,30,0\n")
    with pytest.raises(UserError, match=r"line 3.*cap"):
        read_trace(f, opts=opts)


def test_a_trace_column_reaches_the_scheduler(tmp_path):
    # the trace's max_tokens stops the answers: 2 of 3 outputs are longer than theirs
    csv = tmp_path / "t.csv"
    csv.write_text("arrival_s,input_tokens,output_tokens,max_tokens\n0,100,50,10\n0.5,200,80,64\n1.0,10,5,256\n")
    raw = {"name": "tr", "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
           "workload": {"trace": {"path": str(csv)}}}
    result = run_scenario(scenario_from_dict(raw))
    assert result.requests.sort("request_id")["output_tokens"].to_list() == [10, 64, 5]
    assert summarize(result)["simsrv_truncated_requests"] == 2
    raw["workload"]["max_tokens"] = "output"  # the key, when given, is what the clients send
    assert summarize(run_scenario(scenario_from_dict(raw)))["simsrv_truncated_requests"] == 0


def test_trace_convert_keeps_a_generic_max_tokens_column(tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    f = tmp_path / "g.csv"
    f.write_text("t,p,o,cap\n0,100,50,40\n1,20,30,100\n")
    out = tmp_path / "n.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "sim", "trace", "convert", str(f), "-o", str(out), "--format", "generic",
                        "--arrival-column", "t", "--input-column", "p", "--output-column", "o",
                        "--max-tokens-column", "cap"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert read_trace(out).max_tokens.tolist() == [40, 100]
