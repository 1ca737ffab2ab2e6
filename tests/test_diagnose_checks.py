"""diagnose's checks and ranking: words that match the ratios, failures said, a coarse
timestamp grid detected, prefix reuse the cache missed, fixes ranked per GPU added."""

import numpy as np

from sim.analysis.diagnose_checks import failure_sentence, grid_sentence, ratio_words, reuse_check, timestamp_grid
from sim.analysis.diagnose_fixes import Candidate, rank
from sim.scenario import scenario_from_dict
from sim.workload import RequestArrays
from tests.conftest import small_scenario


def test_ratio_words_match_the_numbers():
    assert ratio_words(10.0, 18.0) == "below"
    assert ratio_words(18.0, 10.0) == "1.8 times"
    assert ratio_words(10.0, 9.0) == "close to"


def test_a_large_share_of_failures_is_said():
    summary = {"num_prompts": 1000, "failed": 460,
               "simsrv_failed_reasons": {"prompt+output 8200-90000 tokens > max_model_len 8192": 460}}
    text = failure_sentence(summary)
    assert text.startswith("46% of the requests (460 of 1,000) failed") and "max_model_len 8192" in text
    assert failure_sentence({**summary, "failed": 10}) is None


def _trace_scenario(**over):
    raw = small_scenario(workload={"trace": {"path": "x.parquet"}}, **over)
    return scenario_from_dict(raw, "t")


def test_coarse_timestamp_grid_is_detected_and_spread_grid_s_suggested():
    """Mooncake's timestamps: 3 s steps, ~10 requests per step, so 90% of the gaps are zero."""
    rng = np.random.default_rng(0)
    t = np.sort(np.repeat(np.arange(100) * 3.0, 10) + 0.0)
    zero, step = timestamp_grid(t)
    assert step == 3.0 and abs(zero - 0.9) < 0.01
    arrays = RequestArrays(t, np.full(len(t), 100), np.full(len(t), 10))
    text = grid_sentence(_trace_scenario(), arrays)
    assert "90% of the inter-arrival gaps are exactly zero" in text and "a 3 s grid" in text
    assert "workload.trace.spread_grid_s=3" in text
    poisson = RequestArrays(np.cumsum(rng.exponential(1.0, 1000)), np.full(1000, 100), np.full(1000, 10))
    assert grid_sentence(_trace_scenario(), poisson) is None


def test_prefix_reuse_far_above_the_hit_rate_proposes_the_cache_aware_router():
    """Ten system prompts of 64 blocks each shared by 1000 requests: 90%+ of blocks reused."""
    hashes = [np.concatenate([np.arange(64) + 1000 * (i % 10), [10**6 + i]]) for i in range(1000)]
    arrays = RequestArrays(np.arange(1000.0), np.full(1000, 65 * 16), np.full(1000, 10), hash_ids=hashes)
    s = _trace_scenario(cluster={"replicas": 4}, engine={"policy": "chunked", "enable_prefix_caching": True})
    reuse, hint, text = reuse_check(s, arrays, {"simsrv_prefix_cache_hit_rate": 0.2})
    assert reuse > 0.9 and hint and "cluster.router=prefix_affinity" in text and "hit only 20%" in text
    assert reuse_check(s, arrays, {"simsrv_prefix_cache_hit_rate": 0.85})[1] is False
    one = _trace_scenario(engine={"policy": "chunked", "enable_prefix_caching": True})
    assert reuse_check(one, arrays, {"simsrv_prefix_cache_hit_rate": 0.2})[1] is False  # one replica: no router


def test_fixes_without_an_slo_rank_by_absolute_gain():
    """No candidate meets an SLO here: the largest p99 gain first, whatever its GPUs (issue 36:
    a 3.6% gain for no GPU used to rank above an 83% one for one GPU)."""
    free = Candidate("free", "", gpus_added=0, ttft_gain_ms=500.0)
    noise = Candidate("noise", "", gpus_added=0, ttft_gain_ms=10.0)       # under 2% of a 2,000 ms p99
    one = Candidate("one GPU", "", gpus_added=1, ttft_gain_ms=900.0)
    three = Candidate("three GPUs", "", gpus_added=3, ttft_gain_ms=1500.0)  # more gain, less per GPU
    worse = Candidate("worse", "", gpus_added=0, ttft_gain_ms=-300.0)
    assert [c.name for c in rank([three, worse, noise, one, free], 2000.0)] == [
        "three GPUs", "one GPU", "free", "noise", "worse"]
