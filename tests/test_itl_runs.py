"""ITL statistics from run-length pieces (issue 14): exactly the percentiles the per-step
expansion gave, at a cost that does not grow with the steps in a fast-forwarded row."""

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.metrics import vllm_bench as metrics
from sim.metrics.vllm_bench import RunLengthSamples, itl_samples, run_length_stats


def _expanded_reference(steps, resume_gaps_s, adjust):
    """The former implementation: every step expanded, (value, count) pairs sorted, numpy's
    linear method on the expanded multiset; returns the figures the summary printed."""
    k = steps["num_steps"]
    has = steps["decode_tokens"] > 0
    k, first, last = k[has], steps["first_step_duration_s"][has], steps["last_step_duration_s"][has]
    seqs = steps["decode_tokens"][has] // np.maximum(k, 1)
    row = np.repeat(np.arange(len(k)), k)
    offsets = np.cumsum(k) - k
    j = np.arange(int(k.sum())) - np.repeat(offsets, k)
    span = np.where(k > 1, (last - first) / np.maximum(k - 1, 1), 0.0)
    gaps = first[row] + span[row] * j
    counts = seqs[row]
    if resume_gaps_s:
        gaps = np.concatenate([gaps, np.asarray(resume_gaps_s)])
        counts = np.concatenate([counts, np.ones(len(resume_gaps_s), dtype=np.int64)])
    if len(adjust):
        old, new = np.asarray(adjust, dtype=np.float64).T
        new = new[~np.isnan(new)]
        gaps = np.concatenate([gaps, old, new])
        counts = np.concatenate([counts, -np.ones(len(old), np.int64), np.ones(len(new), np.int64)])
        gaps, inverse = np.unique(gaps, return_inverse=True)
        counts = np.bincount(inverse, weights=counts, minlength=len(gaps)).astype(np.int64)
    mask = counts > 0
    v0, w0 = gaps[mask], counts[mask].astype(np.int64)
    n = int(w0.sum())
    if n == 0:
        return None
    order = np.argsort(v0, kind="stable")
    v, w = v0[order], w0[order]
    cum = np.cumsum(w)

    def at(idx):
        return float(v[np.searchsorted(cum, idx + 1)])

    def pct(p):
        pos = p / 100.0 * (n - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, n - 1)
        frac = pos - lo
        a = at(lo)
        return a if frac == 0 else a + (at(hi) - a) * frac

    mean = float(np.dot(v, w) / n)
    out = {"n": n, "mean": mean, "std": float(np.sqrt(max(np.dot((v - mean) ** 2, w) / n, 0.0))),
           "median": pct(50), "p50": pct(50), "p90": pct(90), "p99": pct(99)}
    pos = 0.999 * (n - 1)
    lo = int(np.floor(pos))
    a = float(v[np.searchsorted(cum, lo + 1)])
    b = float(v[np.searchsorted(cum, min(lo + 2, int(cum[-1])))])
    out["p99.9"], out["max"] = a + (b - a) * (pos - lo), float(v[-1])
    return out


durations = st.floats(1e-4, 0.2, allow_nan=False)
rows_st = st.lists(st.tuples(st.integers(1, 60), durations, durations, st.integers(0, 4), st.booleans()),
                   min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(rows=rows_st, resume=st.lists(durations, max_size=5), data=st.data())
def test_percentiles_equal_the_expanded_ones_exactly(rows, resume, data):
    # rows: (steps, first, last, seqs, equal ends); some rows repeat another's durations (ties)
    k = np.array([r[0] for r in rows])
    first = np.array([r[1] for r in rows])
    last = np.array([r[1] if r[4] else r[2] for r in rows])
    if len(rows) > 2:
        first[1], last[1] = first[0], last[0]
    seqs = np.array([r[3] for r in rows])
    steps = {"num_steps": k, "decode_tokens": seqs * k, "first_step_duration_s": first,
             "last_step_duration_s": last}
    # adjustments replace the first step's sample of rows that decode (disaggregated/swap-in)
    decoding = [i for i in range(len(rows)) if seqs[i] > 0]
    picks = data.draw(st.lists(st.sampled_from(decoding), max_size=4, unique=True)) if decoding else []
    adjust = [(float(first[i]), float(first[i]) + data.draw(st.sampled_from([0.0, 0.003, math.nan])))
              for i in picks]
    ref = _expanded_reference(steps, resume, adjust)
    samples = itl_samples(steps, resume, adjust)
    saved = metrics._EXPAND_MAX
    try:  # small sets are sorted at once; with no allowance every piece is cut down first
        metrics._EXPAND_MAX = data.draw(st.sampled_from([saved, 0]))
        got = run_length_stats(samples, tail=True)
    finally:
        metrics._EXPAND_MAX = saved
    if ref is None:
        assert samples.num_samples == 0 and math.isnan(got["p50"])
        return
    assert samples.num_samples == ref["n"]
    for key in ("median", "p50", "p90", "p99", "p99.9", "max"):
        assert got[key] == ref[key], key  # bit for bit
    assert got["mean"] == pytest.approx(ref["mean"], rel=1e-12)
    assert got["std"] == pytest.approx(ref["std"], rel=1e-9, abs=1e-15)
    assert samples.sum_s() == pytest.approx(ref["mean"] * ref["n"], rel=1e-12)


def test_ties_across_many_rows_and_points():
    """Hundreds of rows crossing the same values, and long rows of equal steps: the window
    never narrows by value alone, yet the ranks come out exact."""
    rng = np.random.default_rng(3)
    n = 400
    k = rng.integers(1, 5000, n)
    first = np.round(rng.uniform(0.010, 0.012, n), 4)
    last = np.where(rng.random(n) < 0.3, first, np.round(rng.uniform(0.010, 0.012, n), 4))
    seqs = rng.integers(1, 9, n)
    steps = {"num_steps": k, "decode_tokens": seqs * k, "first_step_duration_s": first,
             "last_step_duration_s": last}
    ref = _expanded_reference(steps, [0.011, 0.5], [])
    got = run_length_stats(itl_samples(steps, [0.011, 0.5], []), tail=True)
    for key in ("median", "p50", "p90", "p99", "p99.9", "max"):
        assert got[key] == ref[key], key


def test_cost_is_flat_in_the_steps_of_a_row():
    """A fast-forwarded row of 10^9 steps (16 GB if expanded) is one piece: its percentiles
    are those of the arithmetic sequence, computed in well under a second."""
    first, last, k, seqs = 0.010, 0.020, 10**9, 2
    steps = {"num_steps": np.array([1, k]), "decode_tokens": np.array([3, seqs * k]),
             "first_step_duration_s": np.array([0.5, first]), "last_step_duration_s": np.array([0.5, last])}
    t0 = time.process_time()
    samples = itl_samples(steps, [], [])
    got = run_length_stats(samples, tail=True)
    assert time.process_time() - t0 < 1.0
    n = seqs * k + 3
    assert samples.num_samples == n
    span = (np.array([last]) - np.array([first])) / (k - 1)

    def value(rank):  # rank r < 2k is step r // 2 of the row; the 3 samples of 0.5 s come last
        return float((np.array([first]) + span * (rank // seqs))[0]) if rank < seqs * k else 0.5

    pos = 0.9 * (n - 1)
    lo = int(np.floor(pos))
    assert got["p90"] == value(lo) + (value(lo + 1) - value(lo)) * (pos - lo)
    assert got["max"] == 0.5
    assert got["mean"] == pytest.approx((seqs * k * (first + last) / 2 + 1.5) / n, rel=1e-12)


def test_points_match_numpy():
    v = np.array([3.0, 1.0, 2.0, 2.0])
    w = np.array([2, 1, 0, 3])
    got = run_length_stats(RunLengthSamples.points(v, w))
    expanded = np.repeat(v, w)
    for p in (50, 90, 99):
        assert got[f"p{p}"] == pytest.approx(np.percentile(expanded, p), rel=1e-15)


@settings(max_examples=200, deadline=None)
@given(rows=rows_st, resume=st.lists(durations, max_size=5), data=st.data())
def test_step_log_read_in_chunks_gives_the_same_bits(rows, resume, data):
    """The summary reads the step log from disk a block of rows at a time (``itl_pieces``,
    ``pieces_stats``): every figure is bit-identical to the whole log's, for any block size
    and any histogram resolution (2 bins: brackets as wide as the data)."""
    k = np.array([r[0] for r in rows])
    first = np.array([r[1] for r in rows])
    last = np.array([r[1] if r[4] else r[2] for r in rows])
    seqs = np.array([r[3] for r in rows])
    multi = np.array([data.draw(st.sampled_from([0, 0, 1])) for _ in rows])
    steps = {"num_steps": k, "decode_tokens": seqs * k, "multi_step": multi, "first_step_duration_s": first,
             "last_step_duration_s": last}
    decoding = [i for i in range(len(rows)) if seqs[i] > 0 and not multi[i]]
    picks = data.draw(st.lists(st.sampled_from(decoding), max_size=3, unique=True)) if decoding else []
    adjust = [(float(first[i]), float(first[i]) + 0.002) for i in picks]
    whole = run_length_stats(itl_samples(steps, resume, adjust), tail=True)
    chunk = data.draw(st.integers(1, 7))
    pieces = metrics.itl_pieces(lambda a, b: {c: v[a:b] for c, v in steps.items()}, len(k), resume, adjust,
                                chunk_rows=chunk)
    saved = metrics._BINS
    try:
        metrics._BINS = data.draw(st.sampled_from([saved, 2, 16]))
        got = metrics.pieces_stats(pieces, tail=True)
    finally:
        metrics._BINS = saved
    assert got["n"] == itl_samples(steps, resume, adjust).num_samples
    for key, v in whole.items():
        assert got[key] == v or (math.isnan(v) and math.isnan(got[key])), key


def test_the_bend_is_summed_on_the_first_read_only(monkeypatch):
    """``pieces_stats`` reads the piece sets three times; the fast-forwarded rows' bend (the
    mean's ``sum_extra_s``) is summed on the first, chunk by chunk, and the figures are those
    of the whole log read as one chunk (the mean to rounding: its bend summed chunk by chunk)."""
    n = 12
    rng = np.random.default_rng(5)
    first = rng.uniform(0.01, 0.02, n)
    steps = {"num_steps": rng.integers(1, 9, n), "multi_step": np.zeros(n, np.int64), "first_step_duration_s": first,
             "last_step_duration_s": first * rng.uniform(1.0, 1.1, n), "duration_s": first * 9}
    steps["decode_tokens"] = steps["num_steps"] * rng.integers(1, 5, n)
    whole = metrics.pieces_stats(metrics.itl_pieces(lambda a, b: {c: v[a:b] for c, v in steps.items()}, n, [0.5],
                                                    chunk_rows=n, with_bend=True))
    bends = []
    bend_s = metrics._bend_s
    monkeypatch.setattr(metrics, "_bend_s", lambda p, rows: bends.append(len(p.first_s)) or bend_s(p, rows))
    reads = []
    pieces = metrics.itl_pieces(lambda a, b: reads.append(a) or {c: v[a:b] for c, v in steps.items()}, n, [0.5],
                                chunk_rows=3, with_bend=True)
    got = metrics.pieces_stats(pieces)
    assert len(reads) == 3 * 4 and bends == [3, 3, 3, 3]  # 4 chunks of 3 rows, read thrice, bent once
    assert pieces.sum_extra_s != 0.0
    assert got["mean"] == pytest.approx(whole["mean"], rel=1e-12)  # (the bend summed by chunks)
    assert {k: v for k, v in got.items() if k != "mean"} == {k: v for k, v in whole.items() if k != "mean"}


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
def test_mean_itl_is_the_mean_of_the_gaps_the_requests_saw(policy):
    """A fast-forwarded row's steps follow the cost model's curve, which the step log's
    straight piece leaves out (``step_bend_s``); the mean ITL adds it back, so it equals the
    requests' pooled gaps: (last token - first token) summed over their gaps, to rounding.
    Before, it was off by up to ``RUN_REL_TOL`` (2e-6 on batching.yaml with static)."""
    from tests.conftest import small_scenario
    from sim.metrics.summary import summarize
    from sim.run import run_scenario
    from sim.scenario import scenario_from_dict

    raw = small_scenario(seed=3)
    raw["engine"] = {"policy": policy, "max_num_batched_tokens": 8192 if policy != "chunked" else 512}
    r = run_scenario(scenario_from_dict(raw))
    c = r.requests
    out = c["output_tokens"].to_numpy()
    m = (c["status"] == "completed").to_numpy() & (out > 1)
    assert m.sum() == len(out[out > 1])  # every request with gaps completed
    pooled = float((c["finish_s"].to_numpy()[m] - c["first_token_s"].to_numpy()[m]).sum() / (out[m] - 1).sum())
    steps = r.steps
    cols = {k: steps[k].to_numpy() for k in metrics.BEND_STEP_COLUMNS}
    assert metrics.step_bend_s(cols) != 0.0  # the runs do bend
    s = summarize(r)
    assert s["mean_itl_ms"] / 1e3 == pytest.approx(pooled, rel=1e-12, abs=0)
