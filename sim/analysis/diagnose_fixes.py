"""The fixes ``simsrv diagnose`` tries: each a full simulation of every request of the trace,
with the GPUs it needs, ranked by p99 TTFT gained per GPU added.

Why: a fix that drops the hardest requests, or that buys its gain with GPUs nobody counted,
looks better than it is. "Send long prompts elsewhere" is therefore simulated with the pool
that serves them (+1..3 replicas of the same kind) and both pools' requests are pooled into
one set of figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from sim.run import run_scenario
from sim.engine.topology import layout_for
from sim.policies import get_policy
from sim.scenario import Scenario, parse_override, scenario_from_dict, set_dotted
from sim.analysis.summary import num_gpus
from sim.workload import RequestArrays

LONG_PROMPT_QUANTILE = 95          # prompts above the 95th percentile go to the long-prompt pool
LONG_POOL_REPLICAS = (1, 2, 3)
MIN_GAIN_FRACTION = 0.02           # a p99 gain under 2% of the baseline ranks as no gain (within p99 noise)


@dataclass
class Candidate:
    name: str
    change: str
    gpus: int = 0
    gpus_added: int = 0
    p99_ttft_ms: float | None = None
    p99_tpot_ms: float | None = None
    p50_ttft_ms: float | None = None
    ttft_gain_ms: float | None = None
    tpot_cost_ms: float | None = None
    failed: int = 0
    num_requests: int = 0      # requests simulated (all of the trace's, across pools)
    note: str = ""

    @property
    def gain_per_gpu_ms(self) -> float | None:
        if self.ttft_gain_ms is None or self.gpus_added <= 0:
            return None
        return self.ttft_gain_ms / self.gpus_added


def figures(frames: list[pl.DataFrame]) -> dict:
    """p50/p99 TTFT and p99 TPOT (ms, numpy's linear percentiles as in sim/analysis/summary.py) and the
    failed count over the requests of one or more pools taken together."""
    rq = pl.concat([f.select("status", "ttft_s", "tpot_s") for f in frames])
    done = rq.filter(pl.col("status") == "completed")
    ttft = done["ttft_s"].to_numpy()
    tpot = done["tpot_s"].to_numpy()
    tpot = tpot[~np.isnan(tpot)]
    pct = (lambda v, p: float(np.percentile(v, p)) * 1e3 if len(v) else None)
    return {"p50_ttft_ms": pct(ttft, 50), "p99_ttft_ms": pct(ttft, 99), "p99_tpot_ms": pct(tpot, 99),
            "failed": rq.height - done.height, "num_requests": rq.height}


def with_sets(s: Scenario, sets: list[str], name: str = "candidate") -> Scenario:
    raw = s.resolved()
    for text in sets:
        set_dotted(raw, *parse_override(text))
    return scenario_from_dict(raw, name, s.base_dir)


def same_deployment(a: Scenario, b: Scenario) -> bool:
    """Whether two scenarios differ in nothing but their names (compared resolved: a default
    written out is the same as the default left implicit)."""
    def dump(s: Scenario) -> dict:
        return {k: v for k, v in s.resolved().items() if k != "name"}
    return dump(a) == dump(b)


def _pool_sets(s: Scenario, k: int) -> list[str]:
    """A pool of ``k`` replicas like the deployment's (disaggregated: k prefill + 1 decode)."""
    if get_policy(s.engine.policy).pools:
        return [f"disaggregation.prefill.replicas={k}", "disaggregation.decode.replicas=1"]
    return [f"cluster.replicas={k}"]


def whole_trace_candidates(s: Scenario, arrays: RequestArrays, router_hint: bool) -> list[tuple[Candidate, list[str]]]:
    """Candidates that change the deployment and replay the whole trace on it."""
    e = s.engine
    out = []
    if e.policy in ("static", "continuous"):
        budget = min(e.max_num_batched_tokens, 2048)
        out.append((Candidate("chunked prefill", f"engine.policy=chunked, max_num_batched_tokens={budget}"),
                    ["engine.policy=chunked", f"engine.max_num_batched_tokens={max(budget, e.max_num_seqs)}"]))
    change, sets = layout_for(s).add_capacity()
    out.append((Candidate("add capacity", change), sets))
    if arrays.hash_ids is not None and not e.enable_prefix_caching:
        out.append((Candidate("prefix caching", "engine.enable_prefix_caching=true"),
                    ["engine.enable_prefix_caching=true"]))
    if router_hint:
        sets = ["cluster.router=prefix_affinity"] + ([] if e.enable_prefix_caching else
                                                     ["engine.enable_prefix_caching=true"])
        out.append((Candidate("cache-aware router", ", ".join(sets)), sets))
    if e.kv_cache_dtype == "auto":
        out.append((Candidate("fp8 KV cache", "engine.kv_cache_dtype=fp8"), ["engine.kv_cache_dtype=fp8"]))
    return out


def evaluate(s: Scenario, arrays: RequestArrays, base: dict, router_hint: bool = False) -> list[Candidate]:
    """Simulate every candidate on all of the trace's requests; ranked best first."""
    base_gpus = num_gpus(s)
    cands = []
    for cand, sets in whole_trace_candidates(s, arrays, router_hint):
        c = with_sets(s, sets)
        if same_deployment(c, s):  # already in effect (the scenario's or a --set): nothing to advise
            continue
        result = run_scenario(c, workload=arrays)
        _fill(cand, figures([result.requests]), base, num_gpus(c), base_gpus)
        cands.append(cand)
    cands += long_prompt_pools(s, arrays, base, base_gpus)
    return rank(cands, base.get("p99_ttft_ms"))


def long_prompt_pools(s: Scenario, arrays: RequestArrays, base: dict, base_gpus: int) -> list[Candidate]:
    """Prompts above the 95th percentile served by a second pool of +1..3 replicas; the
    deployment as is serves the rest. NOTE: the two pools share nothing but the arrivals, so
    simulating each on its share of the trace is the same as simulating them together with a
    length-based router in front."""
    cap = int(np.percentile(arrays.input_tokens, LONG_PROMPT_QUANTILE))
    long_ = arrays.input_tokens > cap
    if not long_.any() or long_.all():
        return []
    short_frame = run_scenario(s, workload=arrays.take(~long_)).requests
    share = float(arrays.input_tokens[long_].sum() / arrays.input_tokens.sum())
    out = []
    for k in LONG_POOL_REPLICAS:
        pool = with_sets(s, _pool_sets(s, k), "long-prompt pool")
        long_frame = run_scenario(pool, workload=arrays.take(long_)).requests
        cand = Candidate(f"long-prompt pool +{k}", f"prompts > {cap:,} tokens ({long_.mean():.0%} of requests, "
                         f"{share:.0%} of prompt tokens) to a second pool: {', '.join(_pool_sets(s, k))}",
                         note="all requests, both pools")
        _fill(cand, figures([short_frame, long_frame]), base, base_gpus + num_gpus(pool), base_gpus)
        out.append(cand)
    return out


def _fill(cand: Candidate, r: dict, base: dict, gpus: int, base_gpus: int) -> None:
    cand.p99_ttft_ms, cand.p99_tpot_ms, cand.p50_ttft_ms, cand.failed, cand.num_requests = (
        r["p99_ttft_ms"], r["p99_tpot_ms"], r["p50_ttft_ms"], r["failed"], r["num_requests"])
    cand.gpus, cand.gpus_added = gpus, gpus - base_gpus
    if r["p99_ttft_ms"] is not None and base.get("p99_ttft_ms") is not None:
        cand.ttft_gain_ms = base["p99_ttft_ms"] - r["p99_ttft_ms"]
    if r["p99_tpot_ms"] is not None and base.get("p99_tpot_ms") is not None:
        cand.tpot_cost_ms = r["p99_tpot_ms"] - base["p99_tpot_ms"]
    if cand.failed > base.get("failed", 0):
        cand.note = (cand.note + "; " if cand.note else "") + f"{cand.failed - base['failed']:,} more requests fail"


def rank(cands: list[Candidate], base_p99_ms: float | None = None) -> list[Candidate]:
    """Best first: a gain that needs no GPU beats any that does; then p99 TTFT gained per GPU
    added; then the p99 TPOT paid. Gains under 2% of the baseline p99 and losses come last."""
    floor = MIN_GAIN_FRACTION * base_p99_ms if base_p99_ms else 0.0

    def key(c: Candidate):
        gain = c.ttft_gain_ms if c.ttft_gain_ms is not None else -math.inf
        if gain <= floor:
            return (2, -gain, c.gpus_added)
        if c.gpus_added <= 0:
            return (0, -gain, c.tpot_cost_ms or 0.0)
        return (1, -gain / c.gpus_added, c.tpot_cost_ms or 0.0)
    return sorted(cands, key=key)
