"""The fixes ``simsrv diagnose`` tries: each a full simulation of every request of the trace,
with the GPUs it needs, run in parallel on the sweep executor (sim/sweep/executors.py) and
ranked as a planner would: those that meet every SLO first (fewest GPUs added, then p99 TTFT),
then the rest by absolute p99 TTFT gained, GPUs added shown.

Why: a fix that drops the hardest requests, or that buys its gain with GPUs nobody counted,
looks better than it is. "Send long prompts elsewhere" is therefore simulated with the pool
that serves them (+1..3 replicas of the same kind) and both pools' requests are pooled into
one set of figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from sim.metrics.run_warnings import VALIDATED_REQUEST_ERR, close_call, saturation
from sim.core.ttft import TTFT_PARTS
from sim.engine.topology import layout_for
from sim.errors import UserError
from sim.run import run_scenario
from sim.policies import get_policy
from sim.policies.registry import chunk_policy
from sim.scenario import Scenario, parse_override, scenario_from_dict, set_dotted
from sim.metrics.summary import num_gpus
from sim.sweep.slo import SLOTerm
from sim.workload import RequestArrays
from sim.metrics.keys import P50_TTFT, P99_TPOT, P99_TTFT

LONG_PROMPT_QUANTILE = 95          # prompts above the 95th percentile go to the long-prompt pool
LONG_POOL_REPLICAS = (1, 2, 3)
MIN_GAIN_FRACTION = 0.02           # a p99 gain under 2% of the baseline ranks as no gain (within p99 noise)


CAUSES = {
    "queueing": ("ttft_wait_batch_s",),
    "memory pressure": ("ttft_wait_kv_s", "ttft_preempt_s"),
    "long prompts": ("ttft_prefill_s",),
    "interference": ("ttft_interference_s", "ttft_overhead_s"),
    "KV handoff": ("ttft_kv_transfer_s", "ttft_decode_s"),
    "the serving front end": ("ttft_frontend_s",),  # HTTP, tokenise, stream (sim/engine/frontend.py)
}
FRAME_COLUMNS = ("arrival_s", "finish_s", "queue_s", "input_tokens", "ttft_s", "tpot_s", "e2el_s", "status",
                 *TTFT_PARTS)


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
    figures: dict = field(default_factory=dict)   # SLO term name -> the candidate's figure (ms)
    meets: dict = field(default_factory=dict)     # SLO term name -> within its limit
    meets_slo: bool = False                       # every SLO met (false when none is set), no more failures
    tail: pl.DataFrame | None = None              # the slowest 1% (TTFT): pool, arrival and TTFT parts
    error: str | None = None

    @property
    def gain_per_gpu_ms(self) -> float | None:
        if self.ttft_gain_ms is None or self.gpus_added <= 0:
            return None
        return self.ttft_gain_ms / self.gpus_added


@dataclass(frozen=True)
class Job:
    """One simulation an executor runs: a scenario (as a dict) replaying ``arrays``."""

    key: str
    raw: dict
    base_dir: str
    arrays: RequestArrays
    summary_keys: tuple[str, ...] = ()     # figures read from the run's summary (ITL percentiles)


def run_job(job: Job) -> dict:
    """Top-level (picklable) worker: the run's requests (the columns figures need), GPUs,
    saturation, and the asked summary figures; a ``UserError`` comes back as ``error``."""
    from sim.metrics.summary import summarize

    try:
        s = scenario_from_dict(dict(job.raw), job.key, base_dir=job.base_dir)
        result = run_scenario(s, workload=job.arrays)
    except UserError as e:
        return {"error": str(e)}
    frame = result.requests.select(FRAME_COLUMNS)
    summary = summarize(result) if job.summary_keys else {}
    return {"error": None, "frame": frame, "gpus": num_gpus(s), "saturated": frame_saturation(frame).saturated,
            "summary": {k: summary.get(k) for k in job.summary_keys}}


def frame_saturation(frame: pl.DataFrame):
    """``run_warnings.saturation`` of a requests frame."""
    done = frame.filter(pl.col("status") == "completed")
    return saturation(frame["arrival_s"].to_numpy(), done["arrival_s"].to_numpy(), done["queue_s"].to_numpy())


def job_for(s: Scenario, key: str, sets: list[str], arrays: RequestArrays, terms: list[SLOTerm]) -> Job:
    c = with_sets(s, sets, key)
    keys = tuple(t.key for t in terms if t.metric == "itl")
    return Job(key, c.model_dump(mode="json", exclude_none=True, exclude={"base_dir"}), c.base_dir, arrays, keys)


def run_jobs(executor, jobs: list[Job], progress: Callable[[str], None] | None = None) -> dict[str, dict]:
    """Every job on ``executor`` (in parallel), results by key; ``progress(key)`` as each ends."""
    out = {}
    for job, row in executor.map_calls(run_job, jobs):
        out[job.key] = row
        if progress:
            progress(job.key)
    return out


def figures(frames: list[pl.DataFrame]) -> dict:
    """p50/p99 TTFT and p99 TPOT (ms, numpy's linear percentiles as in sim/metrics/summary.py) and the
    failed count over the requests of one or more pools taken together."""
    rq = pl.concat([f.select("status", "ttft_s", "tpot_s") for f in frames])
    done = rq.filter(pl.col("status") == "completed")
    ttft = done["ttft_s"].to_numpy()
    tpot = done["tpot_s"].to_numpy()
    tpot = tpot[~np.isnan(tpot)]
    pct = (lambda v, p: float(np.percentile(v, p)) * 1e3 if len(v) else None)
    return {P50_TTFT: pct(ttft, 50), P99_TTFT: pct(ttft, 99), P99_TPOT: pct(tpot, 99),
            "failed": rq.height - done.height, "num_requests": rq.height}


def term_figure(frames: list[pl.DataFrame], term: SLOTerm, summary: dict | None = None) -> float | None:
    """One SLO term's figure (ms) over the completed requests of the pools taken together (the
    statistics of sim/metrics/summary.py: numpy's linear percentiles); ITL terms are read from
    the run's summary (one pool only)."""
    if term.metric == "itl":
        return (summary or {}).get(term.key)
    col = f"{term.metric}_s"
    v = pl.concat([f.filter(pl.col("status") == "completed").select(col) for f in frames])[col].to_numpy()
    v = v[~np.isnan(v)]
    if not len(v):
        return None
    stat = term.key.split("_", 1)[0]
    x = float(np.mean(v)) if stat == "mean" else float(np.percentile(v, 50 if stat in ("median", "p50") else int(stat[1:])))
    return x * 1e3


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
    spec = get_policy(e.policy)
    if not spec.chunked_prefill and not spec.pools:  # a colocated policy with whole prompts
        budget, chunked = min(e.max_num_batched_tokens, 2048), chunk_policy()
        out.append((Candidate("chunked prefill", f"engine.policy={chunked}, max_num_batched_tokens={budget}"),
                    [f"engine.policy={chunked}", f"engine.max_num_batched_tokens={max(budget, e.max_num_seqs)}"]))
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
    if e.speculative_config is not None:
        # at a large batch the verification work (k + 1 tokens per decode through the GEMMs) and
        # the draft can cost more than the accepted tokens give (README, "Speculative decoding");
        # turning it on is no candidate: its acceptance is a measurement the scenario lacks
        out.append((Candidate("speculative decoding off", "engine.speculative_config=null"),
                    ["engine.speculative_config=null"]))
    return out


@dataclass
class Plan:
    """The candidate fixes' jobs, and how each candidate's figures are assembled from them."""

    candidates: list[tuple[Candidate, list[str]]]   # candidate, the job keys whose requests it pools
    pools: dict[str, str]                            # job key -> the pool its requests are in
    jobs: list[Job]


def plan(s: Scenario, arrays: RequestArrays, router_hint: bool, terms: list[SLOTerm]) -> Plan:
    """Every candidate's jobs: the whole-trace changes (one job each; a change already in
    effect, the scenario's or a --set's, is not advised) and the long-prompt pools."""
    cands, pools, jobs = [], {}, []
    for cand, sets in whole_trace_candidates(s, arrays, router_hint):
        if same_deployment(with_sets(s, sets), s):
            continue
        jobs.append(job_for(s, cand.name, sets, arrays, terms))
        cands.append((cand, [cand.name]))
        pools[cand.name] = f"the deployment with {cand.name}"
    cap = int(np.percentile(arrays.input_tokens, LONG_PROMPT_QUANTILE))
    long_ = arrays.input_tokens > cap
    if long_.any() and not long_.all():
        jobs.append(job_for(s, "short prompts, as is", [], arrays.take(~long_), terms))
        pools["short prompts, as is"] = f"the deployment as is (prompts <= {cap:,} tokens)"
        share = float(arrays.input_tokens[long_].sum() / arrays.input_tokens.sum())
        for k in LONG_POOL_REPLICAS:
            key = f"long-prompt pool +{k}"
            jobs.append(job_for(s, key, _pool_sets(s, k), arrays.take(long_), terms))
            pools[key] = f"the long-prompt pool (prompts > {cap:,} tokens)"
            cand = Candidate(key, f"prompts > {cap:,} tokens ({long_.mean():.0%} of requests, {share:.0%} of "
                             f"prompt tokens) to a second pool: {', '.join(_pool_sets(s, k))}",
                             note="all requests, both pools")
            cands.append((cand, ["short prompts, as is", key]))
    return Plan(cands, pools, jobs)


def assemble(p: Plan, rows: dict[str, dict], base: dict, base_gpus: int, terms: list[SLOTerm]) -> list[Candidate]:
    """Each candidate's figures from its jobs' requests (both pools' taken together), ranked."""
    out = []
    for cand, keys in p.candidates:
        got = [rows[k] for k in keys]
        err = next((r["error"] for r in got if r.get("error")), None)
        if err:
            cand.error, cand.note = err, err
            out.append(cand)
            continue
        frames = [r["frame"].with_columns(pl.lit(p.pools[k]).alias("pool")) for k, r in zip(keys, got)]
        extra = sum(r["gpus"] for r in got[1:])   # a second pool's GPUs on top of the first's
        _fill(cand, figures(frames), base, got[0]["gpus"] + extra, base_gpus)
        judge(cand, frames, terms, got[0]["summary"] if len(got) == 1 else None, base.get("failed", 0))
        out.append(cand)
    return rank(out, base.get(P99_TTFT))


def judge(cand: Candidate, frames: list[pl.DataFrame], terms: list[SLOTerm], summary: dict | None,
          base_failed: int) -> None:
    """The candidate's figure for each SLO term, whether it meets it, and its slowest 1%."""
    for t in terms:
        v = term_figure(frames, t, summary)
        cand.figures[t.name], cand.meets[t.name] = v, v is not None and v <= t.limit_ms
    cand.meets_slo = bool(terms) and all(cand.meets.values()) and cand.failed <= base_failed
    close = [t.name for t in terms if close_call(cand.figures[t.name], t.limit_ms)]
    if close:  # a pass or fail the model's own error could turn over
        cand.note = (cand.note + "; " if cand.note else "") + (
            f"{', '.join(close)} within {VALIDATED_REQUEST_ERR:.0%} of its limit, inside the model's validated error")
    done = pl.concat(frames).filter(pl.col("status") == "completed")
    if done.height:
        p99 = float(np.percentile(done["ttft_s"].to_numpy(), 99))
        cand.tail = done.filter(pl.col("ttft_s") >= p99).select("pool", "arrival_s", "input_tokens", *TTFT_PARTS)


def _fill(cand: Candidate, r: dict, base: dict, gpus: int, base_gpus: int) -> None:
    cand.p99_ttft_ms, cand.p99_tpot_ms, cand.p50_ttft_ms, cand.failed, cand.num_requests = (
        r[P99_TTFT], r[P99_TPOT], r[P50_TTFT], r["failed"], r["num_requests"])
    cand.gpus, cand.gpus_added = gpus, gpus - base_gpus
    if r[P99_TTFT] is not None and base.get(P99_TTFT) is not None:
        cand.ttft_gain_ms = base[P99_TTFT] - r[P99_TTFT]
    if r[P99_TPOT] is not None and base.get(P99_TPOT) is not None:
        cand.tpot_cost_ms = r[P99_TPOT] - base[P99_TPOT]
    if cand.failed > base.get("failed", 0):
        cand.note = (cand.note + "; " if cand.note else "") + f"{cand.failed - base['failed']:,} more requests fail"


def rank(cands: list[Candidate], base_p99_ms: float | None = None) -> list[Candidate]:
    """As a planner would: candidates that meet every SLO first, by fewest GPUs added, then
    p99 TTFT; then the rest by absolute p99 TTFT gained (an 83% gain above a 3.6% one,
    whatever each costs: the GPUs added are shown beside it), then fewer GPUs added; gains
    under 2% of the baseline p99 (within p99 noise) and losses last; candidates that could not
    run at the end."""
    floor = MIN_GAIN_FRACTION * base_p99_ms if base_p99_ms else 0.0

    def key(c: Candidate):
        if c.error:
            return (4, 0.0, 0.0)
        if c.meets_slo:
            return (0, c.gpus_added, c.p99_ttft_ms if c.p99_ttft_ms is not None else math.inf)
        gain = c.ttft_gain_ms if c.ttft_gain_ms is not None else -math.inf
        return (1 if gain > floor else 2, -gain, c.gpus_added)
    return sorted(cands, key=key)


def dominant_cause(tail: pl.DataFrame) -> tuple[str, float]:
    """The TTFT part (``CAUSES``) that takes the largest share of these requests' TTFT, and its share."""
    shares = {c: sum(float(tail[p].sum()) for p in parts) for c, parts in CAUSES.items()}
    total = sum(shares.values()) or 1.0
    cause = max(shares, key=shares.get)
    return cause, shares[cause] / total


def identical_results(cands: list[Candidate]) -> list[str]:
    """For candidates whose p99 TTFT and p99 TPOT come out the same (to 0.1 ms), the cause:
    which requests set the p99 and what holds them (the largest part of their TTFT), so the
    reader sees why the change between them reaches none of those requests."""
    groups: dict[tuple, list[Candidate]] = {}
    for c in cands:
        if c.p99_ttft_ms is not None and c.tail is not None and not c.error:
            groups.setdefault((round(c.p99_ttft_ms, 1), round(c.p99_tpot_ms or 0.0, 1)), []).append(c)
    out = []
    for (p99, _), group in groups.items():
        if len(group) < 2:
            continue
        tail = group[0].tail
        names = ", ".join(c.name for c in group[:-1]) + f" and {group[-1].name}"
        pools = tail["pool"].value_counts(sort=True)
        where, n = pools["pool"][0], int(pools["count"][0])
        cause, share = dominant_cause(tail)
        whom = (f"all {tail.height} of the slowest 1% are served by {where}" if n == tail.height else
                f"{n} of the slowest 1% ({tail.height}) are served by {where}")
        span = float(tail["arrival_s"].max() - tail["arrival_s"].min())
        out.append(f"{names} give identical results (p99 TTFT {p99:,.1f} ms): {whom}, arriving within "
                   f"{span:,.1f} s, and {share:.0%} of their TTFT is {cause}; what differs between these "
                   "candidates reaches none of those requests.")
    return out
