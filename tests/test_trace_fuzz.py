"""Corrupted traces of every format give one clear error naming the file (and line), never a traceback."""

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.errors import UserError
from sim.workload.readers import ReadOptions
from sim.workload.trace import read_trace

SMALL = ["azure_2024_schema_example.csv", "bailian_schema_example.jsonl", "burstgpt_schema_example.csv",
         "vllm_bench_schema_example.json", "aiperf_schema_example.jsonl", "generic_ms_example.csv"]
GENERIC = dict(format="generic", time_unit="ms", arrival_column="sent_ms", input_column="prompt_len",
               output_column="completion_len")


def _opts(name: str) -> ReadOptions:
    return ReadOptions(**GENERIC) if name.startswith("generic") else ReadOptions()


def _read_clean(path, name):
    """Either a workload or a UserError naming the file; anything else fails the test."""
    try:
        read_trace(path, opts=_opts(name))
    except UserError as e:
        assert str(path) in str(e) and "\n" not in str(e)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", SMALL)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_corruption_is_a_clean_error(root, tmp_path, name, data):
    text = (root / "traces" / "samples" / name).read_text()
    pos = data.draw(st.integers(0, len(text) - 1))
    kind = data.draw(st.sampled_from(["replace", "delete", "insert", "truncate"]))
    junk = data.draw(st.text(alphabet='0123456789-.,:{}[]"aeNnIf \n', min_size=1, max_size=6))
    if kind == "replace":
        text = text[:pos] + junk + text[pos + len(junk):]
    elif kind == "delete":
        text = text[:pos] + text[pos + len(junk):]
    elif kind == "insert":
        text = text[:pos] + junk + text[pos:]
    else:
        text = text[:pos]
    p = tmp_path / name
    p.write_text(text)
    _read_clean(p, name)


@pytest.mark.parametrize("name, body, where, what", [
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47,-3,5\n",
     "line 3", "ContextTokens is '-3'"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\nyesterday,3,5\n",
     "line 3", "TIMESTAMP is 'yesterday'"),
    ("b.csv", "Timestamp,Model,Request tokens,Response tokens\n1,ChatGPT,10,5\n2,ChatGPT,ten,5\n",
     "line 3", "Request tokens is 'ten'"),
    ("b.csv", "Timestamp,Model,Request tokens\n1,ChatGPT,10\n", "", "unknown trace format"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n{"timestamp": -5, "input_length": 10, '
     '"output_length": 5}\n', "line 2", "timestamp is -5"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n\n{"timestamp": 1, "input_length": 10}\n',
     "line 3", "output_length is missing"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n{"timestamp": 1, "input_length": 1.5, '
     '"output_length": 5}\n', "line 2", "input_length is 1.5"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n{"timestamp": 1, "input_len',
     "line 2", "not valid JSON"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n{"timestamp": NaN, "input_length": 3, '
     '"output_length": 5}\n', "line 2", "timestamp"),
    # an empty line is skipped (as in JSON Lines), and counted in the line of a bad value after it
    ("v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n\n2,x,2\n", "line 4", "num_prefill_tokens is 'x'"),
    ("e.csv", "", "", "empty"),
    ("e.jsonl", "\n\n", "", "empty"),
    ("x.json", '{"input_lens": [1, 2], "output_lens": [1, 1], "start_times": [0, "soon"]}', "", "start_times[1]"),
    ("x.json", '{"input_lens": [1], "output_lens": [1]', "line 1", "not valid JSON"),
])
def test_malformed_input_names_file_and_line(tmp_path, name, body, where, what):
    p = tmp_path / name
    p.write_text(body)
    with pytest.raises(UserError) as e:
        read_trace(p)
    msg = str(e.value)
    assert msg.startswith(str(p)) and where in msg and what in msg


@pytest.mark.parametrize("fmt, sample, expect", [
    ("mooncake", "azure_code_2023_first500.csv", "expects JSON Lines"),
    ("azure", "mooncake_synthetic_first500.jsonl", "expects a CSV header"),
    ("vidur", "azure_code_2023_first500.csv", "missing column"),
    ("vllm_bench", "azure_code_2023_first500.csv", "expects a JSON object"),
    ("aiperf", "mooncake_synthetic_first500.jsonl", "field"),
])
def test_wrong_format_forced(root, fmt, sample, expect):
    p = root / "traces" / "samples" / sample
    with pytest.raises(UserError) as e:
        read_trace(p, opts=ReadOptions(format=fmt))
    assert str(p) in str(e.value) and (expect in str(e.value) or "is missing" in str(e.value))


def test_cli_prints_one_line_and_exits_2(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n{"timestamp": 1, "input_length": "x", '
                 '"output_length": 5}\n')
    for args in (["trace", "inspect", str(p)], ["trace", "convert", str(p), "-o", str(tmp_path / "o.parquet")]):
        r = subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True, text=True)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().count("\n") == 0 and "line 2" in r.stderr and "Traceback" not in r.stderr
