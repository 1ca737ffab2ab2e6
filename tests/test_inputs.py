"""Bad input of every kind ends in one ``error:`` line and exit status 2 (issue 13): scenario
files, ``--set`` values, numeric ranges, trace values; outputs are whole or absent; Ctrl-C is 130."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from sim.errors import UserError
from sim.scenario import load_scenario, scenario_from_dict
from tests.conftest import ROOT, small_scenario
from tests.inproc_cli import simsrv

BATCHING = ROOT / "scenarios" / "batching.yaml"
SAMPLES = ROOT / "traces" / "samples"
SMALL = ["--set", "workload.synthetic.num_requests=5"]


def _one_error(o, *needles: str) -> str:
    assert o.code == 2 and o.clean, (o.code, o.stderr[-2000:])
    line = next(line for line in o.lines if line.startswith("error:"))
    for n in needles:
        assert n in line, line
    return line


def _scenario_file(tmp_path: Path, data: bytes, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


# ---- scenario files and --set ------------------------------------------------------------

@pytest.mark.parametrize("data, needle", [
    (b"# caf\xe9\nname: x\n", "not UTF-8"),
    (BATCHING.read_text().encode("utf-16"), "UTF-16"),
    (bytes(range(256)) * 4, "binary"),
    (b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested"),
    ("".join(" " * i + "a:\n" for i in range(3000)).encode(), "nested"),
], ids=["latin1", "utf16", "binary", "flow_nesting_5000", "block_nesting_3000"])
def test_unreadable_scenario_file_is_one_line(tmp_path, data, needle):
    p = _scenario_file(tmp_path, data)
    _one_error(simsrv("run", p, "-q", "--out", tmp_path / "o"), str(p), needle)


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    """YAML keeps a repeated key's last value: a second ``engine:`` block would silently drop
    the first one's settings (the fuzzers' dup_key_engine case ran with max_num_seqs 256, not
    64). A key that overrides one merged in with ``<<`` is YAML's merge, and is kept."""
    text = BATCHING.read_text()
    assert text.count("\nengine:\n") == 1
    p = _scenario_file(tmp_path, (text + "engine:\n  policy: chunked\n").encode())
    line = text.count("\n") + 1
    first = text.split("\n").index("engine:") + 1
    _one_error(simsrv("run", p, "-q", "--out", tmp_path / "o"), str(p), f"line {line}:",
               f"key 'engine' given twice, at lines {first} and {line}")
    _one_error(simsrv("run", BATCHING, *SMALL, "--set", "engine={max_num_seqs: 3, max_num_seqs: 4}", "-q",
                      "--out", tmp_path / "o"), "--set engine", "key 'max_num_seqs' given twice")
    from sim.files.yamlfile import parse_yaml_text

    merged = parse_yaml_text("d: &d {a: 1, b: 2}\ne:\n  <<: *d\n  a: 3\n", "x")
    assert merged == {"d": {"a": 1, "b": 2}, "e": {"a": 3, "b": 2}}


def test_a_bad_flag_is_named_as_the_command_lines_not_the_files(tmp_path):
    """A value given by --policy, --chunk or --set is named with the file (the key lies in or
    under what the flag set); a bad value in the file itself is the file's alone."""
    out = ["-q", "--out", tmp_path / "o"]
    _one_error(simsrv("run", BATCHING, "--policy", "bogus", *out),
               "with 'engine.policy=bogus' from the command line: engine.policy:")
    _one_error(simsrv("run", BATCHING, "--chunk", "0", *out),
               "'engine.max_num_batched_tokens=0' from the command line")
    _one_error(simsrv("run", BATCHING, "--set", "engine.policy.x=1", *out), "'engine.policy.x=1' from the command line")
    _one_error(simsrv("run", BATCHING, "--set", "=5", *out), "--set '=5': expected dotted.key=value")
    bad = _scenario_file(tmp_path, BATCHING.read_text().replace("max_num_seqs: 64", "max_num_seqs: 0").encode())
    line = _one_error(simsrv("run", bad, "--set", "seed=3", *out), f"{bad}: engine.max_num_seqs:")
    assert "command line" not in line


@pytest.mark.parametrize("override, key", [
    ("engine.max_num_seqs=true", "engine.max_num_seqs"),
    ("slo.ttft_ms=yes", "slo.ttft_ms"),
    ("seed=false", "seed"),
    ("workload.synthetic.rate_profile={segments: [[10.0, on]]}", "workload.synthetic.rate_profile.segments.0.1"),
])
def test_a_boolean_for_a_number_is_refused(tmp_path, override, key):
    """pydantic takes True as 1 for a number (``max_num_seqs: true`` ran one sequence at a
    time: found by ../shared/fuzz); a boolean where a boolean belongs still runs."""
    line = _one_error(simsrv("run", BATCHING, *SMALL, "--set", override, "-q", "--out", tmp_path / "o"),
                      "from the command line", f": {key}: ", "is expected, not a boolean")
    assert "batching.yaml" in line
    o = simsrv("run", BATCHING, *SMALL, "--set", "engine.enable_prefix_caching=true", "-q", "--out", tmp_path / "p")
    assert o.code == 0, o.stderr[-2000:]


@pytest.mark.parametrize("override, needle", [
    ("seed=-1", "seed"),
    ("seed=123456789012345678901234567890", "seed"),
    ("name=!!python/object/apply:os.system ['true']", "--set name"),
    ("engine.max_num_seqs=[1,", "--set engine.max_num_seqs"),
    ("slo.ttft_ms=inf", "slo.ttft_ms"),
    ("workload.synthetic.input_tokens.mean=inf", "input_tokens.mean"),
    ("workload.synthetic.input_tokens.sigma=.inf", "input_tokens.sigma"),
    ("workload.synthetic.input_tokens.sigma=1000", "input_tokens.sigma"),
    ("workload.synthetic.request_rate=nan", "request_rate"),
    ("workload.synthetic.num_requests=1000000000000000000", "num_requests"),
    ("cluster.replicas=1000000000000000000", "cluster.replicas"),
    ("workload.synthetic.input_tokens.max=10000000000000000000", "input_tokens.max"),
    ("engine.block_size=17", "power of two"),
    ("engine.gpu_memory_utilization=nan", "gpu_memory_utilization"),
])
def test_bad_override_is_one_line(tmp_path, override, needle):
    _one_error(simsrv("run", BATCHING, *SMALL, "--set", override, "-q", "--out", tmp_path / "o"), needle)
    assert not (tmp_path / "o").exists()


def test_latency_inf_is_refused_before_any_output(tmp_path):
    o = simsrv("run", ROOT / "scenarios" / "disaggregated.yaml", *SMALL,
               "--set", "disaggregation.kv_transfer.latency_ms=inf", "-q", "--out", tmp_path / "o")
    _one_error(o, "latency_ms")
    assert not (tmp_path / "o").exists()


def test_request_rate_inf_still_means_all_at_once():
    s = scenario_from_dict(small_scenario(workload={"synthetic": {"num_requests": 3, "request_rate": math.inf}}))
    assert math.isinf(s.workload.synthetic.request_rate)


def test_every_float_key_refuses_nan_and_inf():
    for section, key in (("engine", "step_overhead_ms"), ("slo", "tpot_ms"), ("hardware", "price_per_gpu_hour")):
        for bad in (math.nan, math.inf):
            with pytest.raises(UserError, match=key):
                scenario_from_dict(small_scenario(**{section: {key: bad}}))


# ---- lengths vLLM would refuse -----------------------------------------------------------

def test_max_model_len_above_context_needs_the_explicit_key():
    from sim.engine.deployment import build_deployment

    over = small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 512, "max_model_len": 100_000})
    with pytest.raises(UserError, match="allow_long_max_model_len"):
        build_deployment(scenario_from_dict(over))
    over["engine"]["allow_long_max_model_len"] = True
    assert build_deployment(scenario_from_dict(over)).limits.max_model_len == 100_000


def test_continuous_refuses_a_budget_below_max_model_len_as_vllm(tmp_path):
    from sim.engine.deployment import build_deployment
    from sim.run import run_scenario

    # vLLM refuses it at start-up without chunked prefill (every policy: tests/test_derived_bounds.py)
    over = small_scenario(engine={"policy": "continuous", "max_num_batched_tokens": 2048})
    over["workload"]["synthetic"].update(num_requests=4, input_tokens={"dist": "fixed", "value": 3000})
    with pytest.raises(UserError, match="max_num_batched_tokens 2048 must be >= engine.max_model_len"):
        run_scenario(scenario_from_dict(over))
    # unset: vLLM's default without chunked prefill, max(max_model_len, 2048)
    s = scenario_from_dict(small_scenario(engine={"policy": "continuous"}, model="qwen2.5-7b"))
    d = build_deployment(s)
    assert d.limits.max_num_batched_tokens == d.limits.max_model_len == d.model.max_position_embeddings


# ---- output directories, writes, Ctrl-C -------------------------------------------------

@pytest.mark.parametrize("name", ["../../x", "/etc/evil", "a/../../b", "..", "", "we ird\n\x00name"])
def test_scenario_name_is_a_safe_directory_name(name):
    from sim.scenario import safe_dir_name

    safe = safe_dir_name(name)
    assert safe and "/" not in safe and "\\" not in safe and not safe.startswith(".")
    assert Path("reports/runs", safe).resolve().parent == Path("reports/runs").resolve()


def test_run_without_out_stays_under_reports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    o = simsrv("run", BATCHING, *SMALL, "--set", "name=../../escaped", "-q")
    assert o.code == 0, o.stderr
    assert not (tmp_path.parent / "escaped-continuous").exists()
    assert [p.name for p in (tmp_path / "reports" / "runs").iterdir()] == [".._.._escaped-continuous".lstrip(".")]


def test_full_disk_leaves_no_truncated_parquet(tmp_path, monkeypatch):
    import errno

    import pyarrow.parquet as pq

    real = pq.ParquetWriter.write_table

    def written_then_enospc(self, table, *a, **k):  # a row group written, then the disk is full
        real(self, table, *a, **k)  # (what Arrow raises then: no file name)
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", written_then_enospc)
    out = tmp_path / "o"
    _one_error(simsrv("run", BATCHING, *SMALL, "-q", "--out", out), f"{out / 'requests.parquet'}: No space left on device")
    assert not list(out.glob("*.parquet")) and not list(out.glob(".*tmp*")) and not (out / "result.json").exists()


def test_ctrl_c_in_run_exits_130_with_one_line(tmp_path, monkeypatch):
    import sim.run

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.run, "run_scenario", interrupted)
    o = simsrv("run", BATCHING, *SMALL, "-q", "--out", tmp_path / "o")
    assert o.code == 130 and len(o.lines) == 1 and "interrupted" in o.lines[0], (o.code, o.stderr)


def test_ctrl_c_in_compare_exits_130_with_one_line(tmp_path, monkeypatch):
    import sim.analysis.compare

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.analysis.compare, "run_compare", interrupted)
    o = simsrv("compare", BATCHING, *SMALL, "--out", tmp_path / "o")
    assert o.code == 130 and len(o.lines) == 1 and "interrupted" in o.lines[0], (o.code, o.stderr)


# ---- traces: out-of-range values, both commands agree -------------------------------------

def _azure(tmp_path: Path, row3: str, header: str = "TIMESTAMP,ContextTokens,GeneratedTokens") -> Path:
    lines = (SAMPLES / "azure_2024_schema_example.csv").read_text().splitlines()[1:]
    lines[2] = row3
    p = tmp_path / "t.csv"
    p.write_text(header + "\n" + "\n".join(lines) + "\n")
    return p


def _run_trace(tmp_path: Path, trace: Path, scenario: str = "trace_azure_2024"):
    d = yaml.safe_load((ROOT / "scenarios" / f"{scenario}.yaml").read_text())
    d["workload"]["trace"]["path"] = str(trace)
    sp = tmp_path / "scenario.yaml"
    sp.write_text(yaml.safe_dump(d))
    return simsrv("run", sp, "-q", "--force", "--out", tmp_path / "o")


@pytest.mark.parametrize("row3, column", [
    ("2024-05-10 00:00:00.9+00:00,9223372036854775808,10", "ContextTokens"),     # 2^63 wrapped to negative
    ("2024-05-10 00:00:00.9+00:00,10000000000000000000,10", "ContextTokens"),
    ("2024-05-10 00:00:00.9+00:00,100,1e30", "GeneratedTokens"),
])
def test_token_count_out_of_range_names_the_line_in_inspect_and_run(tmp_path, row3, column):
    p = _azure(tmp_path, row3)
    for o in (simsrv("trace", "inspect", p), _run_trace(tmp_path, p)):
        _one_error(o, f"{p}: line 4", column)


def test_timestamp_1e18_seconds_is_refused_by_inspect_and_run(tmp_path):
    rows = (SAMPLES / "vidur_splitwise_conv_first500.csv").read_text().splitlines()
    head = rows[0].split(",")
    f = rows[3].split(",")
    f[head.index("arrived_at")] = "1000000000000000000"
    rows[3] = ",".join(f)
    p = tmp_path / "v.csv"
    p.write_text("\n".join(rows) + "\n")
    for o in (simsrv("trace", "inspect", p), _run_trace(tmp_path, p, "trace_vidur")):
        _one_error(o, f"{p}: line 4", "arrived_at")


def test_trace_spanning_decades_is_refused_by_inspect_and_run(tmp_path):
    p = tmp_path / "g.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n0,10,10\n5000000000,10,10\n")
    for o in (simsrv("trace", "inspect", p), _run_trace(tmp_path, p)):
        _one_error(o, str(p), "span")


def test_all_failed_rows_inspect_says_what_run_says(tmp_path):
    rows = (SAMPLES / "burstgpt_schema_example.csv").read_text().splitlines()
    p = tmp_path / "b.csv"
    p.write_text("\n".join([rows[0]] + [",".join(r.split(",")[:3] + ["0"] + r.split(",")[4:]) for r in rows[1:]]))
    a, b = simsrv("trace", "inspect", p, "--model", "ChatGPT"), _run_trace(tmp_path, p, "trace_burstgpt")
    # one line that says why: the rows left out are counted in it, not in warnings before it
    assert _one_error(a, "no requests left", "32 failed requests") == _one_error(b, "no requests left")
    assert len(a.lines) == len(b.lines) == 1


def test_bailian_chat_id_as_string_is_one_line(tmp_path):
    rows = [json.loads(x) for x in (SAMPLES / "bailian_schema_example.jsonl").read_text().splitlines()]
    rows[3]["chat_id"] = "abc"
    p = tmp_path / "b.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for o in (simsrv("trace", "inspect", p), _run_trace(tmp_path, p, "trace_bailian")):
        _one_error(o, f"{p}: line 4", "chat_id")


def test_vllm_bench_errors_not_a_list_is_one_line(tmp_path):
    doc = json.loads((SAMPLES / "vllm_bench_schema_example.json").read_text())
    doc["errors"] = 5
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(doc))
    for o in (simsrv("trace", "inspect", p), _run_trace(tmp_path, p, "trace_vllm_bench")):
        _one_error(o, str(p), "errors")


def test_vllm_bench_all_failed_is_one_line(tmp_path):
    doc = json.loads((SAMPLES / "vllm_bench_schema_example.json").read_text())
    doc["output_lens"] = [0] * len(doc["output_lens"])
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(doc))
    for o in (simsrv("trace", "inspect", p), _run_trace(tmp_path, p, "trace_vllm_bench")):
        _one_error(o, "no requests left")


def test_csv_header_and_values_with_spaces_are_accepted(tmp_path):
    from sim.workload.trace import read_trace

    src = SAMPLES / "azure_2024_schema_example.csv"
    lines = src.read_text().splitlines()
    p = tmp_path / "spaced.csv"
    p.write_text("\n".join(line.replace(",", ", ") for line in lines) + "\n")
    a, b = read_trace(src), read_trace(p)
    assert (a.input_tokens == b.input_tokens).all() and (a.arrival_s == b.arrival_s).all()
    assert simsrv("trace", "inspect", p).code == 0


@pytest.mark.parametrize("content", [bytes(range(256)) * 60, b"x" * 20000 + b"\n",
                                     b"root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin\n"],
                         ids=["binary", "long_line", "system_file"])
def test_errors_never_echo_a_non_trace_file(tmp_path, content):
    p = tmp_path / "notatrace.txt"
    p.write_bytes(content)
    line = _one_error(simsrv("trace", "inspect", p), str(p))
    assert len(line) < 900 and "root:x:0" not in line and "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" not in line


def test_error_lines_show_the_text_verbatim_not_as_emoji(tmp_path):
    # rich turns ":x:" or ":smile:" into emoji unless told not to; a key or value must read as typed
    o = simsrv("run", BATCHING, *SMALL, "--set", "hardware.gpu=h:x:100", "-q", "--out", tmp_path / "o")
    _one_error(o, "'h:x:100'")


# ---- shipped scenarios --------------------------------------------------------------------

def test_a_copied_scenario_still_finds_the_shipped_trace(tmp_path, monkeypatch):
    from sim.workload import build_workload

    copy_ = tmp_path / "mine" / "chat.yaml"
    copy_.parent.mkdir()
    copy_.write_text((ROOT / "scenarios" / "chat.yaml").read_text())
    for cwd in (ROOT, tmp_path):
        monkeypatch.chdir(cwd)
        assert len(build_workload(load_scenario(copy_, ["workload.trace.sample=10"]))) == 10


def test_shipped_scenarios_load_their_files_from_any_directory(tmp_path, monkeypatch):
    from sim.workload import build_workload

    monkeypatch.chdir(tmp_path)
    for f in sorted((ROOT / "scenarios").glob("*.yaml")):
        if f.name == "grid_example.yaml":
            continue
        s = load_scenario(f)
        if s.workload.trace is not None:
            assert len(build_workload(s)) > 0, f.name


# ---- sizes bounded before anything is allocated -------------------------------------------

@pytest.mark.parametrize("synthetic, needle", [
    ({"prefix_groups": {"num_groups": 100_000_000, "prompts_per_group": 100_000_000}}, "prefix_groups"),
    ({"num_requests": 1000, "shared_prefix_tokens": 900_000_000}, "shared_prefix_tokens"),
])
def test_workloads_too_large_for_memory_are_refused_up_front(synthetic, needle):
    from sim.workload import build_workload

    over = small_scenario()
    over["workload"]["synthetic"].update(synthetic)
    if "prefix_groups" in synthetic:
        del over["workload"]["synthetic"]["num_requests"]
    with pytest.raises(UserError, match=needle):
        build_workload(scenario_from_dict(over))


def test_multi_turn_with_huge_turn_counts_draws_only_what_is_kept():
    from sim.workload import build_workload

    over = small_scenario()
    over["workload"]["synthetic"].update(num_requests=5, multi_turn={"turns": {"dist": "fixed", "value": 10**9}})
    assert len(build_workload(scenario_from_dict(over))) == 5
