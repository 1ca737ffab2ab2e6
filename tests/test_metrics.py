"""Metric definitions (vLLM bench) and the exact weighted percentiles used for ITL."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.metrics.vllm_bench import RunLengthSamples, itl_samples, median, plain_stats, request_metrics, run_length_stats


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e3, allow_nan=False), st.integers(0, 30)), min_size=1, max_size=40))
def test_run_length_stats_of_points_equal_numpy_on_expanded_array(pairs):
    v = np.array([p[0] for p in pairs])
    w = np.array([p[1] for p in pairs])
    if w.sum() == 0:
        return
    expanded = np.repeat(v, w)
    keep = w > 0
    got = run_length_stats(RunLengthSamples.points(v[keep], w[keep]))
    for p in (50, 90, 99):
        assert got[f"p{p}"] == pytest.approx(np.percentile(expanded, p), rel=1e-9, abs=1e-9)
    assert got["median"] == pytest.approx(np.median(expanded), rel=1e-9, abs=1e-9)
    assert got["mean"] == pytest.approx(expanded.mean(), rel=1e-9, abs=1e-9)
    assert got["std"] == pytest.approx(expanded.std(), rel=1e-6, abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e12, 1e12, allow_nan=False), st.just(float("nan")), st.sampled_from([0.1, 0.3, 2.5])),
                min_size=0, max_size=60))
def test_plain_stats_are_numpys_bit_for_bit(values):
    """TTFT, TPOT and E2E summaries: numpy's median, percentiles (linear), mean and std of the
    values that are not NaN, exactly (result.json's figures do not move)."""
    v = np.array(values, dtype=np.float64)
    got = plain_stats(v)
    w = v[~np.isnan(v)]
    if len(w) == 0:
        assert all(np.isnan(x) for x in got.values()) and np.isnan(median(v))
        return
    want = {"mean": float(w.mean()), "median": float(np.median(w)), "std": float(w.std()),
            **{f"p{p}": float(np.percentile(w, p)) for p in (50, 90, 99)}}
    assert got == want
    assert np.isnan(median(v)) if np.isnan(v).any() else median(v) == float(np.median(v))


def test_tpot_only_for_multi_token_outputs():
    req = {"status": np.array(["completed", "completed", "failed"]), "arrival_s": np.array([0.0, 1.0, 2.0]),
           "first_token_s": np.array([0.5, 1.2, np.nan]), "finish_s": np.array([2.5, 1.2, 2.0]),
           "first_scheduled_s": np.array([0.1, 1.0, np.nan]), "output_tokens": np.array([5, 1, 10])}
    m = request_metrics(req)
    assert m["ttft_s"][0] == 0.5 and m["tpot_s"][0] == pytest.approx(0.5)  # (2.5 - 0.5) / 4
    assert np.isnan(m["tpot_s"][1]) and np.isnan(m["ttft_s"][2])
    assert m["queue_s"][0] == pytest.approx(0.1)


def test_itl_expands_fast_forwarded_runs_per_step():
    steps = {"num_steps": np.array([1, 4]), "decode_tokens": np.array([0, 12]),
             "first_step_duration_s": np.array([0.05, 0.010]), "last_step_duration_s": np.array([0.05, 0.013])}
    samples = itl_samples(steps, [0.2])
    # one piece for the 4-step row (0.010, 0.011, 0.012, 0.013; 3 sequences each) and the resume gap
    assert samples.num_samples == 13
    assert samples.sum_s() == pytest.approx(3 * (0.010 + 0.011 + 0.012 + 0.013) + 0.2)
    at = samples.values_at(range(13))
    assert [at[r] for r in range(13)] == pytest.approx([0.010] * 3 + [0.011] * 3 + [0.012] * 3 + [0.013] * 3 + [0.2])
