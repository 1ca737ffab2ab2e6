"""Every trace reader on a small sample in traces/samples (real rows where the trace is public)."""

import numpy as np
import pytest

from sim.workload.readers import ReadOptions
from sim.workload.trace import TraceWarning, detect_format, read_trace

SAMPLES = {
    "azure_code_2023_first500.csv": "azure",
    "azure_2024_schema_example.csv": "azure",
    "mooncake_synthetic_first500.jsonl": "mooncake",
    "bailian_schema_example.jsonl": "bailian",
    "burstgpt_schema_example.csv": "burstgpt",
    "vidur_splitwise_conv_first500.csv": "vidur",
    "vllm_bench_schema_example.json": "vllm_bench",
    "aiperf_schema_example.jsonl": "aiperf",
}


@pytest.fixture
def samples(root):
    return root / "traces" / "samples"


@pytest.mark.parametrize("name, fmt", SAMPLES.items())
def test_format_detected(samples, name, fmt):
    assert detect_format(samples / name) == fmt


def test_azure_2023_real_rows(samples):
    w = read_trace(samples / "azure_code_2023_first500.csv")
    # totals of the first 500 rows of AzureLLMInferenceTrace_code.csv
    assert (len(w), w.input_tokens.sum(), w.output_tokens.sum()) == (500, 1_081_658, 12_040)
    # 18:17:03.9799600 -> 18:20:56.7810470
    assert w.arrival_s[-1] == pytest.approx(232.801087, abs=1e-6)


def test_azure_2024_time_zone(samples):
    w = read_trace(samples / "azure_2024_schema_example.csv")
    assert len(w) == 40 and w.arrival_s[0] == 0 and np.all(np.diff(w.arrival_s) >= 0)


def test_vidur_real_rows_equal_azure_offsets(samples):
    w = read_trace(samples / "vidur_splitwise_conv_first500.csv")
    assert (len(w), w.input_tokens.sum(), w.output_tokens.sum()) == (500, 467_684, 132_536)
    assert w.arrival_s[-1] == pytest.approx(129.012474)


def test_mooncake_real_rows_hash_ids(samples):
    w = read_trace(samples / "mooncake_synthetic_first500.jsonl")
    assert (len(w), w.input_tokens.sum(), w.output_tokens.sum()) == (500, 6_403_130, 97_659)
    assert w.arrival_s[-1] == pytest.approx(139.272)  # timestamps are milliseconds
    assert w.hash_block_size == 512
    assert sum(len(h) for h in w.hash_ids) == 12_833
    assert all(len(h) == -(-n // 512) for h, n in zip(w.hash_ids, w.input_tokens))


def test_mooncake_block_size_override_is_checked(samples):
    with pytest.raises(Exception) as e:
        read_trace(samples / "mooncake_synthetic_first500.jsonl", opts=ReadOptions(hash_block_size=16384))
    assert "line 1" in str(e.value) and "--hash-block-size" in str(e.value)


def test_bailian_sessions_and_reuse(samples):
    w = read_trace(samples / "bailian_schema_example.jsonl")
    assert w.hash_block_size == 16 and len(w) == 30
    # a later turn starts with the earlier turn's full blocks
    later = [i for i in range(len(w)) if (w.session_id == w.session_id[i]).sum() > 1]
    assert later
    first, second = [i for i in range(len(w)) if w.session_id[i] == w.session_id[later[0]]][:2]
    k = w.input_tokens[first] // 16
    assert np.array_equal(w.hash_ids[second][:k], w.hash_ids[first][:k])


def test_burstgpt_filter_and_failed(samples):
    p = samples / "burstgpt_schema_example.csv"
    with pytest.warns(TraceWarning, match="2 failed requests"):
        w = read_trace(p)
    assert len(w) == 38
    with pytest.warns(TraceWarning, match="replayed with 1 output token"):
        kept = read_trace(p, opts=ReadOptions(keep_failed=True))
    assert len(kept) == 40 and (kept.output_tokens >= 1).all()
    with pytest.warns(TraceWarning, match="other than 'GPT-4'"):
        gpt4 = read_trace(p, opts=ReadOptions(model_filter="GPT-4"))
    assert 0 < len(gpt4) < 38


def test_vllm_bench_measured_columns(samples):
    with pytest.warns(TraceWarning, match="1 failed"):
        w = read_trace(samples / "vllm_bench_schema_example.json")
    assert len(w) == 11
    m = w.measured
    assert set(m) == {"measured_ttft_s", "measured_e2el_s", "measured_itl_s"}
    # latency = ttft + sum of ITLs, request by request, as vLLM bench measures them
    assert np.allclose(m["measured_e2el_s"], m["measured_ttft_s"] + [x.sum() for x in m["measured_itl_s"]], atol=1e-4)
    assert all(len(x) == o - 1 for x, o in zip(m["measured_itl_s"], w.output_tokens))


def test_aiperf_ns_and_ms(samples):
    with pytest.warns(TraceWarning, match="1 failed"):
        w = read_trace(samples / "aiperf_schema_example.jsonl")
    assert len(w) == 11
    assert 2.5 < w.arrival_s[-1] < 3.0  # 12 requests 0.25 s apart, in ns
    assert (w.measured["measured_ttft_s"] < 0.07).all() and (w.measured["measured_ttft_s"] > 0.02).all()


def test_generic_columns_and_unit(samples):
    opts = ReadOptions(format="generic", time_unit="ms", arrival_column="sent_ms", input_column="prompt_len",
                       output_column="completion_len")
    w = read_trace(samples / "generic_ms_example.csv", opts=opts)
    raw = np.loadtxt(samples / "generic_ms_example.csv", delimiter=",", skiprows=1, usecols=(1, 2))
    assert np.allclose(w.arrival_s, (raw[:, 0] - raw[0, 0]) / 1000)
    assert (w.input_tokens == raw[:, 1]).all()


def test_normalized_roundtrip_keeps_optional_columns(samples, tmp_path):
    from sim.workload.normalized import write_normalized

    with pytest.warns(TraceWarning):
        w = read_trace(samples / "vllm_bench_schema_example.json")
    m = read_trace(samples / "mooncake_synthetic_first500.jsonl")
    for src in (w, m):
        out = tmp_path / "n.parquet"
        write_normalized(src, out)
        back = read_trace(out)
        assert np.array_equal(back.input_tokens, src.input_tokens)
        assert np.allclose(back.arrival_s, src.arrival_s)
        if src.hash_ids is not None:
            assert back.hash_block_size == 512 and all(np.array_equal(a, b) for a, b in zip(back.hash_ids, src.hash_ids))
        if src.measured is not None:
            assert np.allclose(back.measured["measured_ttft_s"], src.measured["measured_ttft_s"])
            assert all(np.allclose(a, b) for a, b in zip(back.measured["measured_itl_s"], src.measured["measured_itl_s"]))


def test_out_of_order_rows_sorted_with_count(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n5,2,2\n3,3,3\n4,4,4\n9,5,5\n")
    with pytest.warns(TraceWarning, match="3 rows were out of time order"):
        w = read_trace(p)
    assert w.arrival_s.tolist() == [0, 3, 4, 5, 9] and w.input_tokens.tolist() == [1, 3, 4, 2, 5]


def test_spread_grid_is_seeded_and_stays_in_bucket(tmp_path):
    p = tmp_path / "g.jsonl"
    p.write_text("".join(f'{{"timestamp": {3000 * (i // 4)}, "input_length": 10, "output_length": 2}}\n'
                         for i in range(40)))
    a = read_trace(p, opts=ReadOptions(spread_grid_s=3.0, seed=1))
    b = read_trace(p, opts=ReadOptions(spread_grid_s=3.0, seed=1))
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert len(np.unique(a.arrival_s)) == 40  # no two at the same instant any more
    raw = read_trace(p)
    assert len(np.unique(raw.arrival_s)) == 10
    assert a.arrival_s[-1] < 30.0
