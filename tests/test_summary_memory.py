"""The ITL summary's memory (issue 39): the exact rank search over the run-length pieces holds
no more pieces than it is given, and a long-answer run's summary nothing proportional to its
tokens or steps (bench/README.md, "Long answers: the summary's peak").

Before, each pass of the search cut every piece overlapping a rank's window into 8: with ten
times longer answers (1M requests, 2.3e9 inter-token samples) 276k pieces overlapped the
median's window and the first cut held 1.9M pieces, +160 MB, the run's peak."""

import tracemalloc

import numpy as np
import pytest

from sim.metrics import vllm_bench as metrics
from sim.metrics.vllm_bench import itl_samples, run_length_stats
from tests.test_itl_runs import _expanded_reference

# Bytes the rank search may hold per piece given: a piece is 5 numbers (40 bytes); a pass holds
# the pieces given, their clipped copy and a few per-piece temporaries. The 8-way cut held
# 660-1,950 bytes a piece; the clipping search 100-210.
_SEARCH_BYTES_PER_PIECE = 200
# ... and the summary's search of every rank (``_values_at``) per piece of the whole log: each
# group of ranks keeps the pieces reaching into its bracket (up to all of them), then searches
# them. The 8-way cut: 1,400 bytes a piece on the rows below; now ~350.
_RANKS_BYTES_PER_PIECE = 512
_FIXED_BYTES = 64 << 10   # (the few values sorted at the end, numpy's small arrays)


def _peaks(monkeypatch, name: str, pieces_given) -> list[tuple[int, int]]:
    """(pieces given, peak bytes allocated meanwhile) of each call of ``metrics.<name>`` from
    now on (``pieces_given(args)``: the pieces its arguments hold)."""
    calls = []
    f = getattr(metrics, name)

    def measured(*args):
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        out = f(*args)
        calls.append((pieces_given(args), tracemalloc.get_traced_memory()[1] - before))
        return out

    monkeypatch.setattr(metrics, name, measured)
    return calls


def _search_peaks(monkeypatch):
    """Of each ``_select`` (a rank search over a piece set in memory)."""
    return _peaks(monkeypatch, "_select", lambda args: len(args[0].first_s))


def _ranks_peaks(monkeypatch):
    """Of each ``_values_at`` (every rank the summary needs, over the whole step log)."""
    return _peaks(monkeypatch, "_values_at", lambda args: args[0].max_pieces)


def _overlapping_rows(n: int, k: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` fast-forwarded rows of ``k`` steps whose durations all cross the same range (as a
    long-answer run's do: every row's window overlaps the median's)."""
    rng = np.random.default_rng(seed)
    first = rng.uniform(0.010, 0.011, n)
    last = np.where(rng.random(n) < 0.2, rng.uniform(0.009, 0.010, n), rng.uniform(0.011, 0.012, n))
    seqs = rng.integers(1, 64, n)
    return {"num_steps": np.full(n, k), "decode_tokens": seqs * k, "first_step_duration_s": first,
            "last_step_duration_s": last}


def _within_bound(calls, bytes_per_piece: int) -> None:
    assert calls
    for pieces, peak in calls:
        assert peak <= bytes_per_piece * pieces + _FIXED_BYTES, (pieces, peak)


def test_rank_search_holds_no_more_than_the_pieces_given(monkeypatch):
    """20,000 rows of 1,000 steps (2e7 steps), all overlapping the median's window."""
    samples = itl_samples(_overlapping_rows(20_000, 1_000, seed=1), [], [])
    n = samples.num_samples
    calls = _search_peaks(monkeypatch)
    tracemalloc.start()
    try:
        samples.values_at([n // 2, n // 2 + 1, int(0.9 * n), int(0.99 * n), n - 1])
    finally:
        tracemalloc.stop()
    _within_bound(calls, _SEARCH_BYTES_PER_PIECE)
    assert max(given for given, _ in calls) == 20_000


def test_the_summarys_ranks_hold_a_few_numbers_a_piece(monkeypatch):
    """The same rows through ``pieces_stats`` (the summary's path: the pieces read in chunks,
    those reaching into each rank's bracket kept, then searched)."""
    samples = itl_samples(_overlapping_rows(20_000, 1_000, seed=1), [], [])
    calls = _ranks_peaks(monkeypatch)
    tracemalloc.start()
    try:
        got = run_length_stats(samples, tail=True)
    finally:
        tracemalloc.stop()
    _within_bound(calls, _RANKS_BYTES_PER_PIECE)
    assert got["n"] == samples.num_samples


@pytest.mark.parametrize("expand_max", [metrics._EXPAND_MAX, 0])
def test_the_clipping_search_is_exact_on_overlapping_rows(monkeypatch, expand_max):
    """The same overlapping rows, fewer, against the expanded multiset: bit for bit (with no
    allowance for sorting, the window is halved down to one value a piece)."""
    steps = _overlapping_rows(600, 300, seed=2)
    ref = _expanded_reference(steps, [0.0105, 0.5], [(float(steps["first_step_duration_s"][3]), 0.02)])
    monkeypatch.setattr(metrics, "_EXPAND_MAX", expand_max)
    got = run_length_stats(itl_samples(steps, [0.0105, 0.5], [(float(steps["first_step_duration_s"][3]), 0.02)]),
                           tail=True)
    for key in ("median", "p50", "p90", "p99", "p99.9", "max"):
        assert got[key] == ref[key], key


def _long_answer_run():
    from sim.run import run_scenario
    from sim.scenario import scenario_from_dict
    from tests.conftest import small_scenario

    raw = small_scenario(seed=2)
    raw["cluster"] = {"replicas": 8}
    raw["engine"] = {"policy": "continuous", "max_num_batched_tokens": 8192}
    raw["workload"]["synthetic"].update(num_requests=2000, request_rate=4.0, output_tokens={
        "dist": "lognormal", "mean": 3000, "sigma": 0.8, "max": 10000})
    return run_scenario(scenario_from_dict(raw))


def test_summary_of_a_long_answer_run_is_bounded_by_its_step_rows(monkeypatch):
    """A long-answer run (2,000 requests, ~4.8M inter-token samples, ~6,500 step rows): the
    summary allocates at most ~1 KB per step row and request (no array per token or per
    step), also with its rank search made to cut the pieces down to one value each (no
    sorting allowance); the figures are the same either way."""
    from sim.metrics.summary import summarize

    r = _long_answer_run()
    tracemalloc.start()
    try:
        plain = summarize(r)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plain["simsrv_num_itl_samples"] > 500 * r.num_step_rows  # long answers: many samples a row
    assert peak <= 1024 * (r.num_step_rows + r.num_requests) + (1 << 20), peak
    monkeypatch.setattr(metrics, "_EXPAND_MAX", 0)
    calls = _ranks_peaks(monkeypatch)
    tracemalloc.start()
    try:
        searched = summarize(r)
    finally:
        tracemalloc.stop()
    _within_bound(calls, _RANKS_BYTES_PER_PIECE)
    skip = ("date", "simsrv_wall_s", "simsrv_requests_per_wall_s")
    assert {k: v for k, v in searched.items() if k not in skip} == {k: v for k, v in plain.items() if k not in skip}


def test_count_le_from_its_bracket_counts_as_the_expansion():
    """``_count_le`` starts from a few steps around where a piece's line meets the value: on
    rising, falling, flat and nearly flat pieces (steps below the value's ulp: long plateaus,
    where the line's guess is far off) it counts what the expanded values give."""
    rng = np.random.default_rng(7)
    n = 400
    first = rng.uniform(0.01, 0.02, n)
    span = rng.choice([0.0, 1e-6, -1e-6, 1e-19, -1e-19, 3e-5], n) * rng.uniform(0.5, 1.5, n)
    j0 = rng.integers(0, 50, n)
    j1 = j0 + rng.integers(1, 400, n)
    p = metrics.RunLengthSamples(first, span, j0, j1, np.ones(n, np.int64))
    values = [first[i] + span[i] * np.arange(j0[i], j1[i]) for i in range(n)]
    probes = [float(v) for i in range(0, n, 7) for v in (values[i][0], values[i][-1], values[i][len(values[i]) // 2])]
    for x in [*probes, 0.0, 1.0, 0.015]:
        for strict in (False, True):
            want = [int((v < x).sum() if strict else (v <= x).sum()) for v in values]
            assert metrics._count_le(p, x, strict).tolist() == want, (x, strict)
