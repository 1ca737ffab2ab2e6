"""Routers: which replica gets an arriving request (``cluster.router``).

Why: with several replicas, routing decides queueing; each router uses only what a real
front-end sees at arrival time (outstanding requests, free KV blocks as last reported).
Plain functions of the replicas' schedulers; no SimPy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.policies.base import Scheduler
from sim.request import Request

RouterFn = Callable[[Request, Sequence[Scheduler]], int]


def least_outstanding(req: Request, replicas: Sequence[Scheduler]) -> int:
    """Fewest waiting + running requests; ties go to the lowest index."""
    best, best_n = 0, None
    for i, s in enumerate(replicas):
        n = s.num_outstanding
        if best_n is None or n < best_n:
            best, best_n = i, n
    return best


def least_kv(req: Request, replicas: Sequence[Scheduler]) -> int:
    """Most free KV blocks (NOTE: blocks reserved for a running fast-forwarded decode run count as
    used, as a router polling engine metrics mid-run would see them a few steps early)."""
    best, best_free = 0, None
    for i, s in enumerate(replicas):
        free = s.kv.num_free
        if best_free is None or free > best_free:
            best, best_free = i, free
    return best


def prefix_affinity(req: Request, replicas: Sequence[Scheduler]) -> int:
    """The replica whose prefix cache holds the longest prefix of the prompt (SGLang's
    cache-aware routing); with no cached prefix anywhere, or a tie, fewest outstanding."""
    best, best_key = 0, None
    for i, s in enumerate(replicas):
        key = (-s.kv.cached_prefix_blocks(req), s.num_outstanding)
        if best_key is None or key < best_key:
            best, best_key = i, key
    return best


def make_router(name: str) -> RouterFn:
    if name == "round_robin":
        counter = [0]

        def round_robin(req: Request, replicas: Sequence[Scheduler]) -> int:
            i = counter[0] % len(replicas)
            counter[0] += 1
            return i

        return round_robin
    return {"least_outstanding": least_outstanding, "least_kv": least_kv, "prefix_affinity": prefix_affinity}[name]
