"""What ``simsrv diagnose`` checks besides the tail's cause: the deployment it replayed on,
the share of failed requests, a coarse timestamp grid in the trace, and prefix reuse the
cache did not turn into hits. Each check returns a sentence for the user, or nothing.

Why: a diagnosis over half of the requests, over bursts the trace's rounding created, or
that misses a cache left unused, sends users to the wrong fix.
"""

from __future__ import annotations

import numpy as np

from sim.policies import get_policy
from sim.scenario import Scenario
from sim.workload import RequestArrays

FAILED_SHARE = 0.05      # say so when 5% or more of the requests failed
GRID_ZERO_GAPS = 0.5     # half the inter-arrival gaps exactly zero: timestamps lie on a coarse grid
REUSE_MIN = 0.2          # prefix reuse worth chasing ...
HIT_FRACTION = 0.5       # ... when the run hit under half of it


def setup_sentence(s: Scenario, summary: dict) -> str:
    """The model, GPUs and policy the trace was replayed on."""
    if get_policy(s.engine.policy).pools:
        shape = f"a disaggregated deployment on {summary['simsrv_gpu']}"
    else:
        shape = (f"{s.cluster.replicas} x {summary['simsrv_gpu']} replica{'s' if s.cluster.replicas > 1 else ''} "
                 f"(TP {s.cluster.tensor_parallel_size}"
                 f"{f', DP {s.cluster.data_parallel_size} + EP' if s.cluster.data_parallel_size > 1 else ''})")
    return (f"Replayed {summary['num_prompts']:,} requests with {summary['model_id']} on {shape}: "
            f"{summary['simsrv_num_gpus']} GPU{'s' if summary['simsrv_num_gpus'] != 1 else ''}, policy "
            f"{s.engine.policy}, router {s.cluster.router}.")


def failure_sentence(summary: dict) -> str | None:
    n, failed = summary["num_prompts"], summary["failed"]
    if not n or failed / n < FAILED_SHARE:
        return None
    kinds = summary.get("simsrv_failed_reasons") or {}
    top = "; ".join(f"{c:,} x {k}" for k, c in list(kinds.items())[:3])
    return (f"{failed / n:.0%} of the requests ({failed:,} of {n:,}) failed and are in no latency figure below "
            f"({top}). Fix that first: the figures describe only the requests this deployment could serve.")


def timestamp_grid(arrival_s: np.ndarray) -> tuple[float, float | None]:
    """(share of zero inter-arrival gaps, grid step in seconds or None): the step is the smallest
    non-zero gap when nearly all non-zero gaps are multiples of it."""
    gaps = np.diff(np.sort(arrival_s))
    if len(gaps) == 0:
        return 0.0, None
    zero = float(np.mean(gaps == 0))
    nonzero = gaps[gaps > 0]
    if not len(nonzero):
        return zero, None
    step = float(nonzero.min())
    ratio = nonzero / step
    on_grid = np.abs(ratio - np.rint(ratio)) < 0.01
    return zero, step if on_grid.mean() >= 0.9 else None


def grid_sentence(s: Scenario, arrays: RequestArrays) -> str | None:
    trace = s.workload.trace
    if trace is None or trace.spread_grid_s:
        return None
    zero, step = timestamp_grid(arrays.arrival_s)
    if zero < GRID_ZERO_GAPS:
        return None
    grid = f"a {step:g} s grid" if step else "a coarse grid"
    return (f"{zero:.0%} of the inter-arrival gaps are exactly zero: the trace's timestamps lie on {grid}, so "
            "each grid step's requests arrive at the same instant, a burst the real traffic did not have. "
            f"Replay with --set workload.trace.spread_grid_s={step or 1:g} to spread them over their step (seeded).")


def prefix_reuse(arrays: RequestArrays) -> float | None:
    """Share of prompt blocks already seen earlier in the trace: an unbounded cache's hit rate."""
    if arrays.hash_ids is None:
        return None
    total = sum(len(h) for h in arrays.hash_ids)
    if total == 0:
        return None
    distinct = len(np.unique(np.concatenate(arrays.hash_ids)))
    return 1.0 - distinct / total


def reuse_check(s: Scenario, arrays: RequestArrays, summary: dict) -> tuple[float | None, bool, str]:
    """(trace's prefix reuse, whether to try the cache-aware router, a sentence or '')."""
    reuse = prefix_reuse(arrays)
    hit = summary.get("simsrv_prefix_cache_hit_rate")
    if reuse is None or reuse < REUSE_MIN or (hit is not None and hit >= HIT_FRACTION * reuse):
        return reuse, False, ""
    replicas = (s.disaggregation.prefill.replicas if get_policy(s.engine.policy).pools and s.disaggregation
                else s.cluster.replicas * s.cluster.data_parallel_size)  # each DP engine core has its own cache
    head = f"The trace reuses {reuse:.0%} of its prompt blocks (an unbounded cache's hit rate)"
    if not s.engine.enable_prefix_caching:
        text = f"{head}, but prefix caching is off."
    else:
        text = f"{head}, but the run's prefix cache hit only {hit:.0%} of prompt tokens."
    router_hint = replicas > 1 and s.cluster.router != "prefix_affinity"
    if router_hint:
        text += (f" The {s.cluster.router} router spreads requests that share a prefix over {replicas} replicas; "
                 "a cache-aware router (cluster.router=prefix_affinity) sends them where the prefix is cached.")
    elif s.engine.enable_prefix_caching:
        text += " The cache is too small to keep the reused prefixes: more KV memory per replica would."
    return reuse, router_hint, text


def ratio_words(ratio: float, reference: float) -> str:
    """How ``ratio`` compares with ``reference``, in words that match the numbers: "close to"
    only within 25% either way."""
    r = ratio / reference if reference > 0 else float("inf")
    if 0.8 <= r <= 1.25:
        return "close to"
    if r < 1:
        return "below"
    return f"{r:.1f} times"
