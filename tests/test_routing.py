"""Routers (issue 12 item 6): SGLang-style cache-aware routing weighing prefix hits against
load, a seeded random router, and the measured claim on a shared-prefix workload."""

import numpy as np
import pytest

from sim.core.request import Request
from sim.core.kv import KVBlockManager
from sim.engine.router import CacheAware, PrefixTree, make_router
from sim.policies.base import EngineLimits
from sim.policies.chunked import ChunkedScheduler
from sim.run import run_scenario
from sim.scenario import load_scenario
from sim.metrics.summary import summarize


def Replica(outstanding: int = 0) -> ChunkedScheduler:
    """A scheduler with ``outstanding`` requests (as ``incoming``): what a router reads. A real
    one: the compiled core's routers (sim/compiled_core.py) take nothing else."""
    s = ChunkedScheduler(EngineLimits(), KVBlockManager(64, 16))
    s.incoming = outstanding
    return s


def _req(i: int, hash_ids, prompt_tokens: int | None = None) -> Request:
    r = Request(i, 0.0, prompt_tokens or 16 * len(hash_ids), 1)
    r.hash_ids, r.hash_block_size = np.asarray(hash_ids), 16
    return r


def test_random_router_is_seeded_by_the_run_seed():
    reps = [Replica() for _ in range(4)]
    routers = [make_router("random", 4, seed) for seed in (0, 0, 1)]
    picks = [[router(_req(i, [i]), reps) for i in range(200)] for router in routers]
    assert picks[0] == picks[1] and picks[0] != picks[2]
    assert sorted(set(picks[0])) == [0, 1, 2, 3]


def test_cache_aware_follows_the_longest_prefix_while_load_is_balanced():
    router = CacheAware(3, cache_threshold=0.3, balance_abs_threshold=4, balance_rel_threshold=1.5)
    reps = [Replica(), Replica(), Replica()]
    assert router(_req(0, [1, 2, 3, 4]), reps) == 0           # empty trees: smallest tree, lowest index
    assert router(_req(1, [9, 8]), reps) == 1                 # no match: the smallest tree (replica 1)
    reps[0].incoming = 4                                      # 4 - 0 = 4: not above the abs threshold
    assert router(_req(2, [1, 2, 3, 7]), reps) == 0           # 3/4 of the prompt cached at replica 0
    assert router(_req(3, [1, 5, 6, 7]), reps) == 2           # 1/4 <= 0.3: smallest tree (replica 2)


def test_cache_aware_falls_back_to_shortest_queue_when_imbalanced():
    router = CacheAware(2, cache_threshold=0.3, balance_abs_threshold=4, balance_rel_threshold=1.5)
    reps = [Replica(), Replica()]
    router(_req(0, [1, 2, 3, 4]), reps)                        # replica 0 caches the prefix
    reps[0].incoming, reps[1].incoming = 10, 5                # 10 - 5 > 4 and 10 > 1.5 x 5
    assert router(_req(1, [1, 2, 6, 6]), reps) == 1            # half of it cached at 0, yet
    assert router.num_balanced == 1
    reps[1].incoming = 7                                      # 10 <= 1.5 x 7: balanced again
    assert router(_req(2, [1, 2, 3, 4]), reps) == 0


def test_prefix_tree_evicts_least_recently_used_prefixes_beyond_its_size():
    tree = PrefixTree(max_tokens=64)
    a, b = _req(0, [1, 2]), _req(1, [3, 4])
    tree.insert(a, [11, 12], 16)
    tree.insert(b, [21, 22], 16)
    assert tree.match_tokens([11, 12], 16, 32) == 32           # touches a's prefix
    tree.insert(_req(2, [5, 6]), [31, 32], 16)                 # 96 tokens > 64: b's blocks go
    assert tree.num_tokens == 64 and tree.match_tokens([21, 22], 16, 32) == 0
    assert tree.match_tokens([11, 12], 16, 32) == 32


def _figures(*sets):
    s = load_scenario("scenarios/routing.yaml", ["workload.synthetic.prefix_groups.num_groups=32", *sets])
    return summarize(run_scenario(s))


def test_cache_aware_beats_load_balancing_with_shared_prefixes_and_holds_without():
    """4 replicas, 32 groups x 16 prompts sharing a 2,048-token system prompt (first 512 of
    scenarios/routing.yaml): cache-aware routing reuses more prefixes than least_outstanding
    and cuts mean and p99 TTFT; with no shared prefix it must not lose more than 10%."""
    lo, ca = (_figures(f"cluster.router={r}") for r in ("least_outstanding", "cache_aware"))
    assert ca["simsrv_prefix_cache_hit_rate"] > lo["simsrv_prefix_cache_hit_rate"] + 0.1
    assert ca["mean_ttft_ms"] < 0.8 * lo["mean_ttft_ms"] and ca["p99_ttft_ms"] < lo["p99_ttft_ms"]
    plain = ["workload.synthetic.prefix_groups=null", "workload.synthetic.num_requests=512"]
    lo, ca = (_figures(f"cluster.router={r}", *plain) for r in ("least_outstanding", "cache_aware"))
    assert ca["mean_ttft_ms"] < 1.1 * lo["mean_ttft_ms"]
    assert ca["p99_ttft_ms"] < 1.1 * lo["p99_ttft_ms"]


def test_cache_aware_thresholds_are_scenario_keys():
    s = load_scenario("scenarios/routing.yaml", ["cluster.cache_aware.balance_abs_threshold=8"])
    router = make_router("cache_aware", 4, s.seed, s.cluster.cache_aware)
    assert router.balance_abs_threshold == 8 and router.cache_threshold == pytest.approx(0.3)


def test_least_outstanding_is_the_first_replica_with_fewest_outstanding():
    """Its written-out sum is ``Scheduler.num_outstanding``; ties go to the lowest index."""
    from collections import deque

    from sim.engine.router import least_outstanding

    rng = np.random.default_rng(0)
    req = _req(0, [1])
    for _ in range(300):
        reps = []
        for _ in range(int(rng.integers(1, 6))):
            s = Replica(int(rng.integers(-1, 2)))  # (a negative load too: the first fewest, whatever it is)
            s.waiting = deque(_req(i, [i]) for i in range(rng.integers(0, 3)))
            s.running = {i: _req(i, [i]) for i in range(rng.integers(0, 3))}
            reps.append(s)
        loads = [s.num_outstanding for s in reps]
        assert least_outstanding(req, reps) == min(range(len(reps)), key=lambda i: (loads[i], i))
