"""Routers: which replica gets an arriving request (``cluster.router``).

Why: with several replicas, routing decides queueing and prefix-cache reuse; each router uses
only what a real front-end sees at arrival time (its own outstanding requests per replica,
free KV blocks as last reported, and, for the cache-aware router, its own record of the
prompts it sent where). Plain functions and objects of the replicas' schedulers; no SimPy.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable

from sim.policies.base import Scheduler
from sim.core.request import Request
from sim.scenario import CacheAwareRouting

RouterFn = Callable[[Request, list[Scheduler]], int]


def least_outstanding(req: Request, replicas: list[Scheduler]) -> int:
    """Fewest waiting + running requests; ties go to the lowest index (the first replica with
    the fewest)."""
    # each replica's Scheduler.num_outstanding, its sum written out (the default router reads
    # every replica's at every arrival; a property call each was most of its cost), and the
    # first fewest found in one pass (compiled, sim/compiled_core.py, native arithmetic instead
    # of a list, min() and list.index)
    if not replicas:
        raise ValueError("no replica to route to")
    best, fewest = 0, 0
    for i, s in enumerate(replicas):
        load = len(s.waiting) + len(s.running) + s.incoming
        if i == 0 or load < fewest:
            best, fewest = i, load
    return best


def least_kv(req: Request, replicas: list[Scheduler]) -> int:
    """Most free KV blocks (NOTE: blocks reserved for a running fast-forwarded decode run count as
    used, as a router polling engine metrics mid-run would see them a few steps early)."""
    best = 0
    best_free: int | None = None
    for i, s in enumerate(replicas):
        free = s.kv.num_free
        if best_free is None or free > best_free:
            best, best_free = i, free
    return best


def prefix_affinity(req: Request, replicas: list[Scheduler]) -> int:
    """The replica whose prefix cache holds the longest prefix of the prompt, whatever its
    load; with no cached prefix anywhere, or a tie, fewest outstanding. NOTE: it reads the
    engines' true caches and ignores load: an upper bound on hit rate, not a real router
    (see ``CacheAware`` for one)."""
    best = 0
    best_key: tuple[int, int] | None = None
    for i, s in enumerate(replicas):
        key = (-s.kv.cached_prefix_blocks(req), s.num_outstanding)
        if best_key is None or key < best_key:
            best, best_key = i, key
    return best


class RandomRouter:
    """Uniformly random replica, from a generator seeded with the run's seed (deterministic)."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def __call__(self, req: Request, replicas: list[Scheduler]) -> int:
        return self._rng.randrange(len(replicas))


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def __call__(self, req: Request, replicas: list[Scheduler]) -> int:
        i = self._next % len(replicas)
        self._next += 1
        return i


# Defaults of SGLang's router (sgl-router ``router_args.py``: cache_threshold 0.3,
# balance_abs_threshold 64, balance_rel_threshold 1.5, max_tree_size 2**26 characters; we count
# tokens, at ~4 characters per token 2**24 tokens); the scenario's ``cluster.cache_aware``.
_DEFAULTS = CacheAwareRouting.model_validate({})  # (model_validate: mypy, for the compiled core, sees no defaults)


class PrefixTree:
    """The router's approximate prefix tree of one replica: which prompt prefixes it sent there.

    A node is a prefix ending at a hash block (the trace's ``hash_ids``, chained as in
    ``sim.core.kv.prefix_keys``), so a dict keyed by the chain hash is a radix tree at hash-block
    granularity; the tokens after the last full hash block and prompts without hash ids are
    unique leaves. Least recently matched or inserted prefixes are evicted when the tree holds
    more than ``max_tokens`` tokens (NOTE: SGLang evicts to ``max_tree_size`` every
    ``eviction_interval_secs``; here on insertion, so the size never exceeds the bound).
    """

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.num_tokens = 0
        self._nodes: OrderedDict = OrderedDict()  # key -> tokens, least recently used first

    def match_tokens(self, chain: list, block_tokens: int, prompt_tokens: int) -> int:
        """Tokens of the longest prefix of the prompt in the tree (touches the matched nodes)."""
        nodes, hit = self._nodes, 0
        while hit < len(chain) and chain[hit] in nodes:
            hit += 1
        self._touch(chain[:hit])
        return min(hit * block_tokens, prompt_tokens)

    def _touch(self, path: list) -> None:
        """Mark a root-to-leaf path used, the leaf least recent: eviction takes leaves before
        their ancestors (as SGLang's tree evicts leaves), so a kept node's prefix is kept."""
        for key in reversed(path):
            self._nodes.move_to_end(key)

    def insert(self, req: Request, chain: list, block_tokens: int) -> None:
        nodes = self._nodes
        covered, path = 0, []
        if req.prompt_tokens > min(len(chain) * block_tokens, req.prompt_tokens):
            # a leaf of tokens no other prompt shares (after the last full hash block)
            nodes[("req", req.request_id)] = req.prompt_tokens - len(chain) * block_tokens
            self.num_tokens += req.prompt_tokens - len(chain) * block_tokens
        for key in chain:
            n = min(block_tokens, req.prompt_tokens - covered)
            if n <= 0:
                break
            covered += n
            path.append(key)
            if key not in nodes:
                nodes[key] = n
                self.num_tokens += n
        self._touch(path)
        while self.num_tokens > self.max_tokens and nodes:
            _, n = nodes.popitem(last=False)
            self.num_tokens -= n


def _chain(req: Request) -> list:
    """Hash chain of the prompt's hash blocks: key j identifies the prompt up to block j."""
    if req.hash_ids is None:
        return []
    chain, c = [], 0
    for hid in req.hash_ids:
        c = hash((c, int(hid)))
        chain.append(c)
    return chain


class CacheAware:
    """Cache-aware routing weighing prefix hits against load, as SGLang's router
    ``cache_aware`` policy (sgl-router ``policies/cache_aware.rs``).

    Load is the requests outstanding at each replica. If the load is imbalanced
    (max - min > ``balance_abs_threshold`` and max > ``balance_rel_threshold`` x min), the least
    loaded replica gets the request (shortest queue). Otherwise the replica whose tree matches
    the longest prefix gets it if the match covers more than ``cache_threshold`` of the prompt;
    else the replica with the smallest tree (the most room for new prefixes). The prompt is
    then inserted into the chosen replica's tree. Ties go to the less loaded, then lower index.
    NOTE: the tree is the router's own approximation (it never reads the engines' caches), as
    in SGLang; vLLM production-stack's prefix-aware router and llm-d's weighted prefix/load
    scorers make the same trade with other formulas.
    """

    def __init__(self, num_replicas: int, cache_threshold: float = _DEFAULTS.cache_threshold,
                 balance_abs_threshold: float = _DEFAULTS.balance_abs_threshold,
                 balance_rel_threshold: float = _DEFAULTS.balance_rel_threshold,
                 max_tree_tokens: int = _DEFAULTS.max_tree_tokens):
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.trees = [PrefixTree(max_tree_tokens) for _ in range(num_replicas)]
        self.num_balanced = 0   # decisions taken by the load fallback
        self.num_cache_hits = 0  # decisions taken by the prefix match

    def __call__(self, req: Request, replicas: list[Scheduler]) -> int:
        loads = [s.num_outstanding for s in replicas]
        chain = _chain(req)
        h = req.hash_block_size
        lo, hi = min(loads), max(loads)
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            best = loads.index(lo)
            self.num_balanced += 1
        else:
            matched = [t.match_tokens(chain, h, req.prompt_tokens) for t in self.trees]
            top = max(matched)
            if req.prompt_tokens and top / req.prompt_tokens > self.cache_threshold:
                best = min((i for i in range(len(loads)) if matched[i] == top), key=lambda i: (loads[i], i))
                self.num_cache_hits += 1
            else:
                best = min(range(len(loads)), key=lambda i: (self.trees[i].num_tokens, loads[i], i))
        self.trees[best].insert(req, chain, h)
        return best


ROUTERS = ("round_robin", "random", "least_outstanding", "least_kv", "prefix_affinity", "cache_aware")


def make_router(name: str, num_replicas: int = 1, seed: int = 0, options=None) -> RouterFn:
    """A fresh router (routers with state keep it per run). ``options``: the scenario's
    ``cluster.cache_aware`` (thresholds), for ``cache_aware``."""
    if name == "round_robin":
        return RoundRobin()
    if name == "random":
        return RandomRouter(seed)
    if name == "cache_aware":
        o = options if options is not None else _DEFAULTS
        return CacheAware(num_replicas, o.cache_threshold, o.balance_abs_threshold, o.balance_rel_threshold,
                          o.max_tree_tokens)
    return {"least_outstanding": least_outstanding, "least_kv": least_kv, "prefix_affinity": prefix_affinity}[name]
