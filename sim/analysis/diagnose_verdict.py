"""The verdict ``simsrv diagnose`` leads with, before any candidate fix: does the deployment keep
up with the trace (and how many replicas of its shape would), can each SLO be met at all by
adding replicas of this shape, and how bursty the arrivals are.

Why: a planner who is short of capacity, or whose SLO no replica count can meet, must hear
that first; a list of fixes ranked by gain hides both. Every figure is simulated at the
calibrated cost: the replica count by replaying the trace, the floors by running the one
request alone on an idle replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sim.analysis.diagnose_fixes import Job, job_for, with_sets
from sim.core.batch import Batch
from sim.errors import UserError
from sim.policies import get_policy
from sim.scenario import Scenario
from sim.sweep.cheapest import MAX_REPLICAS, Shape
from sim.sweep.slo import SLOTerm, parse_slo
from sim.workload import RequestArrays
from sim.metrics.keys import key

SHORTER_PROMPT_STEPS = 8     # bisection steps of the longest prompt that meets a TTFT SLO alone
ONE_BURST_SHARE = 0.05       # the slowest 1% arrived within 5% of the trace's span: one burst
SOLO_OUTPUT_TOKENS = 16      # a solo request's output: enough decode steps for its TPOT


def slo_terms(s: Scenario, text: str | None) -> list[SLOTerm]:
    """``--slo`` terms (sim/sweep/slo.py) or, without it, the scenario's ``slo`` judging the p99."""
    if text:
        return parse_slo(text)
    return [SLOTerm(f"{m}_p99_ms", key("p99", m), m, float(v))
            for m, v in (("ttft", s.slo.ttft_ms), ("tpot", s.slo.tpot_ms), ("e2el", s.slo.e2el_ms)) if v is not None]


def bursts(arrival_s: np.ndarray, tail_arrival_s: np.ndarray) -> dict:
    """Peak arrival rates over any 1 s and 10 s window, the mean rate, and the span of the
    slowest 1%'s arrivals (seconds)."""
    a = np.sort(np.asarray(arrival_s, dtype=float))
    span = float(a[-1] - a[0]) if len(a) > 1 else 0.0

    def peak(w: float) -> float:
        return float((np.searchsorted(a, a + w, side="left") - np.arange(len(a))).max()) / w if len(a) else 0.0
    tail = np.asarray(tail_arrival_s, dtype=float)
    return {"peak_1s_rate": peak(1.0), "peak_10s_rate": peak(10.0),
            "mean_rate": (len(a) - 1) / span if span > 0 else float("inf"),
            "slowest_1pct_span_s": float(tail.max() - tail.min()) if len(tail) else 0.0,
            "slowest_1pct_count": len(tail), "trace_span_s": span,
            "slowest_1pct_first_s": float(tail.min()) if len(tail) else 0.0}


def burst_sentence(b: dict, saturated: bool = False) -> str:
    mean = b["mean_rate"]
    text = (f"Arrivals: {mean:.2f} req/s on average, peaks of {b['peak_1s_rate']:.0f} req/s over 1 s "
            f"({b['peak_1s_rate'] / mean:.0f}x the mean) and {b['peak_10s_rate']:.1f} req/s over 10 s "
            f"({b['peak_10s_rate'] / mean:.1f}x).")
    n, span = b["slowest_1pct_count"], b["slowest_1pct_span_s"]
    if n and saturated and span <= ONE_BURST_SHARE * b["trace_span_s"]:
        text += (f" All {n} of the slowest 1% arrived within {span:,.1f} s (from t = {b['slowest_1pct_first_s']:,.0f} s) "
                 "of a saturated run: the requests that found the queue longest, not a burst of their own.")
    elif n and span <= ONE_BURST_SHARE * b["trace_span_s"]:
        text += (f" All {n} of the slowest 1% arrived within {span:,.1f} s (from t = {b['slowest_1pct_first_s']:,.0f} s): "
                 "one burst, not a steady overload.")
    elif n:
        text += f" The slowest 1% arrived over {span:,.0f} s of the {b['trace_span_s']:,.0f} s trace."
    return text


def solo_run(s: Scenario, prompt_tokens: int, sets: list[str] = ()) -> tuple[float | None, float | None, str]:
    """(TTFT ms, TPOT ms, why not) of one request of ``prompt_tokens`` alone on an idle replica
    of ``s`` changed by ``sets``: the least any queue or neighbour can leave it."""
    from sim.run import run_scenario

    one = RequestArrays(np.zeros(1), np.array([int(prompt_tokens)], dtype=np.int64),
                        np.array([SOLO_OUTPUT_TOKENS], dtype=np.int64))
    try:
        c = with_sets(s, list(sets), "solo")
        rq = run_scenario(c, workload=one).requests
    except UserError as e:
        return None, None, str(e)
    if rq["status"][0] != "completed":
        return None, None, str(rq["fail_reason"][0])
    tpot = rq["tpot_s"][0]
    return float(rq["ttft_s"][0]) * 1e3, (None if tpot is None or math.isnan(tpot) else float(tpot) * 1e3), ""


def decode_step_ms(result, batch: float, context_tokens: float) -> float:
    """One decode step of ``batch`` sequences of ``context_tokens`` each at the run's calibrated cost."""
    n = max(1, round(batch))
    b = Batch(num_decode_seqs=n, decode_context_tokens=round(n * context_tokens), num_logits=n)
    return result.deployment.cost.run_durations_s(b)[0] * 1e3


def _prompt_at(term: SLOTerm, input_tokens: np.ndarray) -> int | None:
    """The prompt at the term's percentile (an actual prompt of the trace); None for a mean."""
    stat = term.key.split("_", 1)[0]
    if stat == "mean":
        return None
    q = 50 if stat in ("median", "p50") else int(stat[1:])
    return int(np.percentile(input_tokens, q, method="inverted_cdf"))


def _alternatives(s: Scenario, prompt: int, limit_ms: float) -> list[str]:
    """What else could meet a TTFT limit the shape cannot, each simulated alone: twice the TP,
    the fastest catalogue GPU, one chunk for the whole prompt, and the longest prompt that meets
    it on this shape."""
    from sim.spec.hardware import catalogue, get_gpu

    tries = []
    disagg = get_policy(s.engine.policy).pools
    tp = s.cluster.tensor_parallel_size
    if not disagg and tp * 2 <= 8:
        tries.append((f"TP {tp * 2} ({tp * 2} GPUs a replica)", [f"cluster.tensor_parallel_size={tp * 2}"]))
    if s.hardware.custom is None:
        fastest = max(catalogue(), key=lambda k: get_gpu(k).bf16_flops_per_s)
        if fastest != s.hardware.gpu and get_gpu(fastest).bf16_flops_per_s > get_gpu(s.hardware.gpu).bf16_flops_per_s:
            tries.append((fastest, [f"hardware.gpu={fastest}"]))
    if get_policy(s.engine.policy).chunk_is_budget and s.engine.max_num_batched_tokens < prompt:
        tries.append((f"one {prompt:,}-token chunk", [f"engine.max_num_batched_tokens={prompt}"]))
    out = []
    for label, sets in tries:
        ttft, _, why = solo_run(s, prompt, sets)
        out.append(f"{label}: {ttft:,.0f} ms" if ttft is not None else f"{label}: cannot run ({why})")
    lo, hi = 0, prompt   # lo meets the limit alone (0: none known), hi does not
    for _ in range(SHORTER_PROMPT_STEPS):
        if hi - lo <= max(1, hi // 100):
            break
        mid = (lo + hi) // 2
        ttft, _, _ = solo_run(s, max(mid, 1))
        if ttft is not None and ttft <= limit_ms:
            lo = mid
        else:
            hi = mid
    out.append(f"prompts up to {lo:,} tokens meet it on this shape" if lo else "no prompt length meets it on this shape")
    return out


@dataclass
class Feasibility:
    term: SLOTerm
    observed_ms: float | None
    floor_ms: float | None
    floor_what: str
    infeasible: bool
    alternatives: list[str] = field(default_factory=list)

    def sentence(self) -> str:
        t = self.term
        label = f"{t.key.split('_', 1)[0]} {t.metric.upper()}"
        seen = "-" if self.observed_ms is None else f"{self.observed_ms:,.1f} ms"
        verb = "meets" if self.observed_ms is not None and self.observed_ms <= t.limit_ms else "misses"
        text = f"SLO {t.name}: {label} {seen} {verb} the {t.limit_ms:g} ms limit."
        if self.floor_ms is None:
            return text + (f" {self.floor_what}" if self.floor_what else "")
        text += f" Floor: {self.floor_what} takes {self.floor_ms:,.1f} ms"
        if self.infeasible:
            text += (", above the limit: no number of replicas of this shape meets it. What could: "
                     + "; ".join(self.alternatives) + ".")
        elif t.metric == "ttft":
            text += ", within the limit: the rest is waiting and sharing, which capacity or a fix below can remove."
        else:
            text += (", within the limit: the rest is the work each step shares (the batch, prefills beside it), "
                     "which more replicas, a lower max_num_seqs or chunked prefill reduce.")
        return text


def uncached_tokens(arrays: RequestArrays) -> np.ndarray:
    """Per request, the fewest prompt tokens it must prefill with any prefix cache: its prompt
    less the leading run of blocks some earlier request's prompt already held (an unbounded
    cache's hit; vLLM matches whole leading blocks and recomputes at least one token,
    vllm/v1/core/kv_cache_manager.py ``get_computed_blocks``)."""
    seen: set[int] = set()
    out = np.empty(len(arrays), dtype=np.int64)
    bs = arrays.hash_block_size
    for i in np.argsort(arrays.arrival_s, kind="stable"):
        ids = arrays.hash_ids[i].tolist()
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        out[i] = max(1, int(arrays.input_tokens[i]) - k * bs)
        seen.update(ids)
    return out


def feasibility(s: Scenario, arrays: RequestArrays, summary: dict, terms: list[SLOTerm], decode: dict) -> list[Feasibility]:
    """Each SLO term's floor at the calibrated cost and whether adding replicas of this shape can
    meet it. TTFT: the term's percentile prompt (p99: the p99 prompt) alone on an idle replica;
    every request's TTFT is at least its own prompt's solo prefill, which grows with the prompt,
    so the p-th percentile TTFT is at least the p-th percentile prompt's solo prefill. With
    prefix caching on a trace with prefix hashes, the prompt is the part no cache can spare
    (``uncached_tokens``), prefilled with no context: still a floor. TPOT and ITL: one sequence
    decoding alone (more replicas cannot make the batch smaller)."""
    out = []
    cached = s.engine.enable_prefix_caching and arrays.hash_ids is not None
    lengths = uncached_tokens(arrays) if cached else arrays.input_tokens
    for t in terms:
        seen = summary.get(t.key)
        if t.metric == "ttft":
            prompt = _prompt_at(t, lengths)
            if prompt is None:
                out.append(Feasibility(t, seen, None, "", False))
                continue
            ttft, _, why = solo_run(s, prompt)
            stat = t.key.split("_", 1)[0]
            what = (f"the {stat} prompt's uncached part ({prompt:,} tokens: a prompt less the longest prefix an "
                    "earlier request could have cached) alone on an idle replica" if cached else
                    f"the {stat} prompt ({prompt:,} tokens) alone on an idle replica")
            if ttft is None:
                out.append(Feasibility(t, seen, None, f"No floor: {what} cannot run ({why}).", False))
                continue
            bad = ttft > t.limit_ms
            out.append(Feasibility(t, seen, ttft, what, bad, _alternatives(s, prompt, t.limit_ms) if bad else []))
        elif t.metric in ("tpot", "itl") and decode:
            ctx = decode["context_tokens"]
            _, tpot, _ = solo_run(s, max(1, round(ctx)))
            one = tpot if tpot is not None else decode["step_one_ms"]
            what = (f"one sequence decoding alone ({ctx:,.0f} tokens of context; at the run's observed batch of "
                    f"{decode['batch']:.1f} a step takes {decode['step_ms']:,.1f} ms)")
            bad = one > t.limit_ms
            alts = [] if not bad else ["a faster GPU or more tensor parallelism (more HBM bandwidth per sequence)",
                                       "fp8 weights or KV (fewer bytes read per step)"]
            out.append(Feasibility(t, seen, one, what, bad, alts))
        else:
            out.append(Feasibility(t, seen, None, "", False))
    return out


class ReplicaSearch:
    """The fewest replicas of the deployment's shape whose replay of the trace keeps up (not
    saturated: sim/metrics/run_warnings.py ``saturation``), by simulation, reusing ``capacity
    --rate``'s replica search (sim/sweep/cheapest.py ``Shape``: doubling until one passes, then
    bisection). A saturated run starts from the fluid estimate (replicas x offered / served);
    with two or more workers the estimate and one fewer are tried together. A run that keeps
    up bisects downwards (fewer replicas may keep up too)."""

    def __init__(self, s: Scenario, arrays: RequestArrays, saturated: bool, offered: float, served: float,
                 terms: list[SLOTerm], workers: int = 1, cap: int = MAX_REPLICAS, covered: tuple[int, ...] = ()):
        """``covered``: replica counts another job replays anyway (fed with ``known``)."""
        self.s, self.arrays, self.terms, self.cap = s, arrays, terms, cap
        self.covered = set(covered)
        self.shape = Shape({}, {})
        self.disaggregated = bool(get_policy(s.engine.policy).pools)
        self.n0 = s.cluster.replicas
        self.first: list[int] = []
        if self.disaggregated:
            return
        if saturated:
            self.shape.fail_n = self.n0
            est = math.ceil(self.n0 * offered / served) if served > 0 else cap
            est = min(cap, max(self.n0 + 1, est))
            self.first = [est] + ([est - 1] if workers > 1 and est - 1 > self.n0 + 1 else [])
        else:
            self.shape.pass_n = self.n0
        self.tried: dict[int, bool] = {self.n0: not saturated}

    @staticmethod
    def key(n: int) -> str:
        return f"replicas {n}"

    def known(self, n: int, keeps_up: bool) -> None:
        """A replay at ``n`` replicas run elsewhere (the add-capacity candidate)."""
        if not self.disaggregated:
            self._record(n, keeps_up)

    def _record(self, n: int, keeps_up: bool) -> None:
        self.tried[n] = keeps_up
        if keeps_up:
            self.shape.pass_n = n if self.shape.pass_n is None else min(self.shape.pass_n, n)
        else:
            self.shape.fail_n = max(self.shape.fail_n, n)

    def jobs(self) -> list[Job]:
        if self.disaggregated:
            return []
        if self.first:
            ns, self.first = [n for n in self.first if n not in self.tried and n not in self.covered], []
            if ns:
                return [self._job(n) for n in ns]
        n = self.shape.next_replicas(self.cap)
        while n is not None and n in self.tried:   # already known: record and move on
            self._record(n, self.tried[n])
            n = self.shape.next_replicas(self.cap)
        return [] if n is None else [self._job(n)]

    def _job(self, n: int) -> Job:
        return job_for(self.s, self.key(n), [f"cluster.replicas={n}"], self.arrays, self.terms)

    def feed(self, rows: dict[str, dict]) -> None:
        for key, row in rows.items():
            if key.startswith("replicas ") and int(key.split()[1]) not in self.tried:
                self._record(int(key.split()[1]), not row.get("error") and not row["saturated"])

    @property
    def answer(self) -> int | None:
        return None if self.disaggregated else self.shape.pass_n

    def sentence(self, gpus_per_replica: int = 0) -> str:
        if self.disaggregated:
            return "(The replica search covers one pool; this deployment is disaggregated: search its pools with capacity --grid.)"
        n = self.answer
        if n is None:
            return f"No replica count up to {self.cap} of this shape keeps up (simulated)."
        below = self.tried.get(n - 1)
        tail = f"; {n - 1} do not" if below is False else ("" if n > 1 else "")
        k = n * gpus_per_replica
        gpus = f" ({k} GPU{'s' if k != 1 else ''})" if gpus_per_replica else ""
        return (f"{n} replica{'s' if n > 1 else ''} of this shape{gpus} keep{'s' if n == 1 else ''} up with the offered "
                f"rate (each count simulated on the whole trace{tail}).")
