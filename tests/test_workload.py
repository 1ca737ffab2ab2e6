"""Synthetic workloads and trace reading."""

import numpy as np
import pytest

from sim.errors import UserError
from sim.scenario import Synthetic
from sim.workload.synthetic import synthetic_workload
from sim.workload.trace import read_trace


def test_lognormal_mean_and_poisson_rate():
    spec = Synthetic(num_requests=50_000, request_rate=10,
                     input_tokens={"dist": "lognormal", "mean": 900, "sigma": 0.8},
                     output_tokens={"dist": "fixed", "value": 7})
    w = synthetic_workload(spec, seed=3)
    assert w.input_tokens.mean() == pytest.approx(900, rel=0.02)
    assert (w.output_tokens == 7).all()
    gaps = np.diff(w.arrival_s)
    assert gaps.mean() == pytest.approx(0.1, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)  # exponential gaps: CV 1


def test_burstiness_is_gamma_shape():
    spec = Synthetic(num_requests=50_000, request_rate=10, burstiness=0.25)
    gaps = np.diff(synthetic_workload(spec, seed=1).arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.05)  # CV = 1/sqrt(shape)


def test_same_seed_same_workload():
    spec = Synthetic(num_requests=100)
    a, b = synthetic_workload(spec, 5), synthetic_workload(spec, 5)
    assert (a.arrival_s == b.arrival_s).all() and (a.input_tokens == b.input_tokens).all()


def test_shipped_azure_trace(root):
    w = read_trace(root / "traces" / "azure_conv.parquet")
    assert len(w) == 19_366
    assert w.arrival_s[0] == 0 and w.arrival_s[-1] == pytest.approx(3501.72, abs=0.01)
    # token totals of the source CSV (AzureLLMInferenceTrace_conv.csv), unchanged by conversion
    assert (w.input_tokens.sum(), w.output_tokens.sum()) == (22_361_870, 4_088_665)


def test_azure_csv_reader(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,109\n")
    w = read_trace(p)
    assert w.arrival_s.tolist() == pytest.approx([0.0, 4.314579])
    assert w.output_tokens.tolist() == [44, 109]


@pytest.mark.parametrize("body, message", [
    ("arrival_s,input_tokens,output_tokens\n0,10,5\n1,abc,5\n", "line 3: column input_tokens is 'abc'"),
    ("arrival_s,input_tokens,output_tokens\n0,10,5\n-1,10,5\n", "line 3: column arrival_s is '-1'"),
    ("arrival_s,input_tokens,output_tokens\n0,10,5\ninf,10,5\n", "line 3: column arrival_s is 'inf'"),
    ("arrival_s,input_tokens,output_tokens\n0,10,0\n", "line 2: column output_tokens is '0'"),
    ("arrival_s,input_tokens\n0,10\n", "unknown trace format"),
    ("", "empty"),
    ("arrival_s,input_tokens,output_tokens\n", "no rows"),
])
def test_bad_rows_name_file_and_line(tmp_path, body, message):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(UserError) as e:
        read_trace(p)
    assert str(p) in str(e.value) and message in str(e.value)


def test_short_csv_row_names_its_line(tmp_path):
    p = tmp_path / "short.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1,20\n2,30,4\n")
    with pytest.raises(UserError, match=r"short.csv: line 3: 2 fields, the header has 3"):
        read_trace(p)
