"""Fuzzing as tests (issue 13): scenario mutations and trace corruptions through the CLI,
in-process. Every outcome is a success or exactly one ``error:`` line with exit status 2, never
a traceback; ``trace inspect`` and ``run`` accept and refuse the same trace files.

The corruption classes are those of the black-box fuzz scripts the issue was found with (keys
deleted or set to text, negative, zero, 1e18, NaN, inf, null, a list; unknown keys; values of
one trace row out of range or of the wrong type; truncated, binary, re-encoded and reshaped
files). Seeded (``derandomize``) and small, so the whole class stays fixed and the test fast.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from tests.inproc_cli import simsrv

# SIMSRV_FUZZ_EXAMPLES=500 for a longer hunt; the default keeps the suite fast
FUZZ = settings(derandomize=True, database=None, deadline=None,
                max_examples=int(os.environ.get("SIMSRV_FUZZ_EXAMPLES", "25")),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

BAD_VALUES = ["abc", -1, 0, 10**18, math.nan, math.inf, -math.inf, None, [1, 2], 1.5, {"x": 1}]
SCENARIOS = ["batching", "disaggregated", "interference", "long_context", "prefix_cache", "trace_bailian",
             "trace_generic"]
N_REQUESTS = 6  # keeps each mutated run to a fraction of a second


def _scenario(name: str) -> dict:
    d = yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text())
    trace = d["workload"].get("trace")
    if trace is not None:
        trace["path"] = str((ROOT / "scenarios" / trace["path"]).resolve())
    return d


def _paths(node, prefix=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))


def _cap(d: dict) -> dict:
    """At most N_REQUESTS requests, whatever the mutation left (a bad value stays bad)."""
    w = d.get("workload")
    if isinstance(w, dict) and isinstance(w.get("synthetic"), dict):
        syn = w["synthetic"]
        n = syn.get("num_requests", 1000)
        if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 10**9:
            syn["num_requests"] = min(n, N_REQUESTS)
        elif "num_requests" not in syn:
            syn["num_requests"] = N_REQUESTS
        pg = syn.get("prefix_groups")
        if isinstance(pg, dict):
            pg.update({"num_groups": 2, "prompts_per_group": 3})
            syn.pop("num_requests", None)
    return d


@st.composite
def scenario_mutants(draw):
    name = draw(st.sampled_from(SCENARIOS))
    d = _scenario(name)
    _cap(d)
    paths = list(_paths(d))
    kind = draw(st.sampled_from(["set", "set", "set", "delete", "unknown_key"]))
    path = draw(st.sampled_from(paths))
    parent = d
    for p in path[:-1]:
        parent = parent[p]
    if kind == "delete":
        del parent[path[-1]]
    elif kind == "unknown_key":
        (parent[path[-1]] if isinstance(parent[path[-1]], dict) else parent)["bogus_key"] = 1
    else:
        parent[path[-1]] = draw(st.sampled_from(BAD_VALUES))
    return name, path, kind, _cap(d)


@FUZZ
@given(case=scenario_mutants())
def test_scenario_mutation_is_success_or_one_error_line(tmp_path, case):
    name, path, kind, d = case
    p = tmp_path / "mutant.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    o = simsrv("run", p, "-q", "--force", "--out", tmp_path / "out")
    assert o.clean, (name, path, kind, o.code, o.stderr[-3000:])


@FUZZ
@given(key=st.sampled_from(["seed", "name", "engine.max_num_seqs", "workload.synthetic.request_rate",
                            "engine.block_size", "cluster.replicas", "engine"]),
       raw=st.sampled_from(["-1", "[1,", "{a: 1", "!!python/object/apply:os.getcwd []", "!!binary AAAA", "1e18",
                            "10000000000000000000", ".nan", "-.inf", "&a [*a]", "'unterminated", "~", "",
                            "[" * 200 + "]" * 200]))
def test_set_override_is_success_or_one_error_line(tmp_path, key, raw):
    o = simsrv("run", ROOT / "scenarios" / "batching.yaml", "--set", f"workload.synthetic.num_requests={N_REQUESTS}",
               "--set", f"{key}={raw}", "-q", "--out", tmp_path / "out")
    assert o.clean, (key, raw, o.code, o.stderr[-3000:])


# ---- traces -------------------------------------------------------------------------------

S = ROOT / "traces" / "samples"
GENERIC = ["--format", "generic", "--time-unit", "ms", "--arrival-column", "sent_ms", "--input-column", "prompt_len",
           "--output-column", "completion_len"]
# name -> (sample file, scenario, (time, input, output) keys, extra ``trace inspect`` options)
TRACES = {
    "azure": (S / "azure_2024_schema_example.csv", "trace_azure_2024", ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), []),
    "burstgpt": (S / "burstgpt_schema_example.csv", "trace_burstgpt", ("Timestamp", "Request tokens", "Response tokens"),
                 ["--model", "ChatGPT"]),
    "generic": (S / "generic_ms_example.csv", "trace_generic", ("sent_ms", "prompt_len", "completion_len"), GENERIC),
    "bailian": (S / "bailian_schema_example.jsonl", "trace_bailian", ("timestamp", "input_length", "output_length"), []),
    "vllm_bench": (S / "vllm_bench_schema_example.json", "trace_vllm_bench", ("start_times", "input_lens", "output_lens"),
                   []),
}
CSV_BAD = ["abc", "-5", "nan", "inf", "0", "12.5", "1000000000000000000", "10000000000000000000",
           "9223372036854775808", "", "1e400", " 7 "]
JSON_BAD = ["abc", -5, math.nan, math.inf, 0, 12.5, 10**18, 10**19, 2**63, None, [1], True, {"v": 1}]
STRUCTURE = ["truncate", "header_only", "empty", "binary", "gzip", "bom", "crlf", "latin1", "blank_line",
             "reversed", "duplicated", "zero_outputs", "drop_input_key", "extra_field", "spaces"]


def _corrupt(fmt: str, data) -> bytes:
    path, _scen, keys, _extra = TRACES[fmt]
    raw = path.read_bytes()
    text = raw.decode()
    kind = data.draw(st.sampled_from(["value", "value", "structure"]))
    if kind == "value":
        key = data.draw(st.sampled_from(keys))
        if path.suffix == ".csv":
            lines = text.splitlines()
            col = lines[0].split(",").index(key)
            row = data.draw(st.integers(1, len(lines) - 1))
            fields = lines[row].split(",")
            fields[col] = data.draw(st.sampled_from(CSV_BAD))
            lines[row] = ",".join(fields)
            return ("\n".join(lines) + "\n").encode()
        bad = data.draw(st.sampled_from(JSON_BAD))
        if path.suffix == ".json":
            doc = json.loads(text)
            doc[key][data.draw(st.integers(0, len(doc[key]) - 1))] = bad
            return json.dumps(doc).encode()
        rows = [json.loads(x) for x in text.splitlines() if x.strip()]
        rows[data.draw(st.integers(0, len(rows) - 1))][key] = bad
        return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
    how = data.draw(st.sampled_from(STRUCTURE))
    if how == "truncate":
        return raw[: data.draw(st.integers(1, len(raw) - 1))]
    if how == "empty":
        return b""
    if how == "binary":
        return bytes((i * 97 + 13) % 256 for i in range(3000))
    if how == "gzip":
        return gzip.compress(raw, mtime=0)
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "crlf":
        return text.replace("\n", "\r\n").encode()
    if how == "latin1":
        return raw.replace(b"\n", b"\n\xe9", 1)
    if path.suffix == ".json":
        doc = json.loads(text)
        cols = ["start_times", "input_lens", "output_lens", "ttfts", "itls", "latencies", "errors"]
        if how in ("header_only", "reversed", "duplicated"):
            for c in cols:
                doc[c] = [] if how == "header_only" else doc[c][::-1] if how == "reversed" else doc[c] + doc[c][:3]
        elif how == "zero_outputs":
            doc["output_lens"] = [0] * len(doc["output_lens"])
        elif how == "drop_input_key":
            del doc["input_lens"]
        elif how == "extra_field":
            doc["errors"] = data.draw(st.sampled_from([5, "x", [None], [1] * len(doc["errors"])]))
        return json.dumps(doc).encode()
    lines = text.splitlines()
    head, body = (lines[0], lines[1:]) if path.suffix == ".csv" else ("", lines)
    out_keys = keys[2]
    if how == "header_only":
        body = []
    elif how == "blank_line":
        body = body[:3] + [""] + body[3:]
    elif how == "reversed":
        body = body[::-1]
    elif how == "duplicated":
        body = body[:4] + [body[3]] * 3 + body[4:]
    elif path.suffix == ".csv":
        names = head.split(",")
        if how == "zero_outputs":
            j = names.index(out_keys)
            body = [",".join("0" if k == j else f for k, f in enumerate(r.split(","))) for r in body]
        elif how == "drop_input_key":
            j = names.index(keys[1])
            head = ",".join(n for k, n in enumerate(names) if k != j)
            body = [",".join(f for k, f in enumerate(r.split(",")) if k != j) for r in body]
        elif how == "extra_field":
            body = body[:2] + [body[2] + ",1,2"] + body[3:]
        elif how == "spaces":
            head, body = head.replace(",", ", "), [r.replace(",", ", ") for r in body]
    else:
        rows = [json.loads(x) for x in body]
        for r in rows:
            if how == "zero_outputs":
                r[out_keys] = 0
            elif how == "drop_input_key":
                r.pop(keys[1], None)
        if how == "extra_field":
            rows[2]["chat_id"] = data.draw(st.sampled_from(["abc", 2**64, 1.5, None]))
        body = [json.dumps(r) for r in rows]
    return ((head + "\n" if head else "") + "\n".join(body) + "\n").encode()


@FUZZ
@given(fmt=st.sampled_from(sorted(TRACES)), data=st.data())
def test_trace_corruption_inspect_and_run_agree_and_are_clean(tmp_path, fmt, data):
    path, scen, _keys, extra = TRACES[fmt]
    bad = tmp_path / f"corrupt{path.suffix}"
    bad.write_bytes(_corrupt(fmt, data))
    d = _scenario(scen)
    d["workload"]["trace"]["path"] = str(bad)
    sp = tmp_path / "scenario.yaml"
    sp.write_text(yaml.safe_dump(d))
    inspect = simsrv("trace", "inspect", bad, *extra)
    run = simsrv("run", sp, "-q", "--force", "--out", tmp_path / "out")
    assert inspect.clean, (fmt, inspect.code, inspect.stderr[-3000:])
    assert run.clean, (fmt, run.code, run.stderr[-3000:])
    assert (inspect.code == 0) == (run.code == 0), (fmt, inspect.stderr[-800:], run.stderr[-800:])
    for o in (inspect, run):
        assert all(len(line) < 1500 for line in o.lines)
