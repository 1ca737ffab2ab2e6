"""``simsrv diagnose``: replay a production trace and explain its tail time to first token.

Why: users come with "p99 TTFT is 13x the median" and need the cause and the fix. The cause
is read from the exact TTFT decomposition of the slowest 1% (sim/core/ttft.py) and from the
signature the serving literature uses: a p99/p50 TTFT ratio far above what prompt-length
variance explains (each prompt's prefill alone) means queueing. It leads with the verdict
(sim/analysis/diagnose_verdict.py): saturation and the replicas that keep up, each SLO's floor
and whether replicas can meet it, bursts. Fixes are not guessed: the trace's every request is
re-run with each candidate change (sim/analysis/diagnose_fixes.py), in parallel on the sweep
executor, and the candidates are ranked as a planner would (those meeting every SLO first).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from sim.core.batch import Batch
from sim.analysis.diagnose_checks import failure_sentence, grid_sentence, ratio_words, reuse_check, setup_sentence
from sim.analysis.diagnose_fixes import CAUSES, Candidate, assemble, frame_saturation, identical_results, plan, run_jobs
from sim.analysis.diagnose_verdict import ReplicaSearch, bursts, burst_sentence, decode_step_ms, feasibility, slo_terms
from sim.errors import UserError
from sim.policies import get_policy
from sim.run import RunResult, run_scenario
from sim.scenario import Scenario, apply_overrides, read_scenario_raw, scenario_from_dict
from sim.metrics.summary import num_gpus
from sim.sweep.cheapest import MAX_REPLICAS
from sim.sweep.slo import parse_slo
from sim.metrics.summary import summarize
from sim.core.ttft import TTFT_PARTS
from sim.workload import RequestArrays, build_workload
from sim.metrics.keys import MEDIAN_TPOT, MEDIAN_TTFT, P99_TPOT, P99_TTFT
from sim.metrics.run_warnings import VALIDATED_REQUEST_ERR, close_call

QUEUEING_RATIO = 3.0  # p99/p50 TTFT this many times the prompt-length ratio: queueing dominates


@dataclass
class Diagnosis:
    scenario: Scenario
    result: RunResult
    summary: dict
    cause: str
    tail_parts_ms: dict[str, float]
    median_parts_ms: dict[str, float]
    ttft_ratio: float
    prompt_ratio: float
    sentences: list[str]
    candidates: list[Candidate]
    tail_arrivals_s: np.ndarray
    floor: dict[str, float]
    measured: dict[str, float] = field(default_factory=dict)
    prefix_reuse: float | None = None   # the trace's prefix-block reuse (an infinite cache's hit rate)
    verdict: list[str] = field(default_factory=list)   # said first: saturation, SLO feasibility, bursts
    payload: dict = field(default_factory=dict)        # ``diagnose --json``


DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "chat.yaml"


def trace_scenario(trace: Path, scenario_path: Path | None, sets: list[str]) -> Scenario:
    """The scenario diagnose replays: the scenario file (default scenarios/chat.yaml), its
    workload made the trace ``trace`` (a trace workload keeps its other keys: format, columns,
    time_unit, window...; a synthetic one becomes a trace with defaults), then every ``--set``
    applied last, so it wins. A bad key or value is one error line naming the flag."""
    path = Path(scenario_path) if scenario_path is not None else DEFAULT_SCENARIO
    raw = read_scenario_raw(path)
    workload = raw.get("workload")
    kept = workload.get("trace") if isinstance(workload, dict) else None
    # absolute, links not followed: /dev/fd/63 (a pipe: <(zcat t.gz)) resolves to "pipe:[...]"
    raw["workload"] = {"trace": {**(kept if isinstance(kept, dict) else {}), "path": os.path.abspath(trace)}}
    raw["name"] = f"diagnose-{trace.stem}"

    def trace_keys_only(key: str) -> None:
        if (key + ".").startswith("workload.") and not key.startswith("workload.trace.") or key == "workload.trace.path":
            raise UserError(f"--set {key}: diagnose replays the trace given as its argument ({trace}); "
                            "set the trace's other keys one by one (workload.trace.KEY=value)")

    given = apply_overrides(raw, sets, trace_keys_only)
    return scenario_from_dict(raw, f"{path} replaying {trace}", base_dir=str(path.parent), overrides=given)


def _parts_ms(frame: pl.DataFrame) -> dict[str, float]:
    return {p: float(frame[p].mean()) * 1e3 if frame.height else 0.0 for p in TTFT_PARTS}


def _solo_prefill_ratio(result: RunResult) -> float:
    """p99/p50 of each completed request's prefill alone (no queue, no sharing)."""
    cost = result.deployment.cost
    done = result.requests.filter(pl.col("status") == "completed")
    lengths = np.unique(done["input_tokens"].to_numpy())
    solo = {int(n): cost.run_durations_s(Batch(prefill_chunks=((int(n), 0),), num_logits=1))[0] for n in lengths}
    t = np.array([solo[int(n)] for n in done["input_tokens"].to_numpy()])
    return float(np.percentile(t, 99) / np.percentile(t, 50)) if len(t) else float("nan")


def _decode_floor(result: RunResult, summary: dict) -> dict[str, float]:
    """Bytes one decode step must read at the typical batch and context, over HBM bandwidth."""
    dep = result.deployment
    st = result.steps.filter(pl.col("decode_tokens") > 0)
    if st.height == 0 or summary.get(MEDIAN_TPOT) is None:
        return {}
    batch = float(np.average((st["decode_tokens"] / st["num_steps"]).to_numpy(), weights=st["duration_s"].to_numpy()))
    done = result.requests.filter(pl.col("status") == "completed")
    ctx = float((done["input_tokens"] + done["output_tokens"] / 2).mean())
    m = dep.model
    # one sequence's KV on one GPU: the MLA latent whole on every TP rank, KV heads split;
    # sliding-window layers hold (and read) at most the window (ModelSpec.kv_bytes_for_context)
    kv_seq_gpu = m.kv_bytes_for_context(round(ctx), dep.kv_dtype_bytes) * m.kv_gpu_fraction(dep.tp)
    n = max(1, round(batch))
    weights = m.bytes_read(n) / dep.tp  # quantized linear layers at their width
    if dep.dp > 1:  # data-parallel ranks: the routed experts every rank's tokens touch, over DP x TP GPUs
        base = m.bytes_read(0)
        weights = base / dep.tp + (m.bytes_read(n * dep.dp) - base) / (dep.tp * dep.dp)
    bytes_per_step = weights + batch * kv_seq_gpu
    floor_ms = bytes_per_step / dep.gpu.hbm_bw_bytes_per_s * 1e3
    tpot = summary[MEDIAN_TPOT]
    return {"batch": batch, "context_tokens": ctx, "bytes_per_step": bytes_per_step, "floor_ms": floor_ms,
            "tpot_ms": tpot, "bandwidth_fraction": floor_ms / tpot}


def diagnose(trace: Path, scenario_path: Path | None = None, sets: list[str] = (), slo: str | None = None,
             executor=None, progress=None, max_replicas: int = MAX_REPLICAS) -> Diagnosis:
    """``executor``: where the candidate fixes and replica probes run (sim/sweep/executors.py;
    default: this process); ``progress(done, total)`` as each ends."""
    terms = parse_slo(slo) if slo else None  # a bad --slo answers at once
    s = trace_scenario(trace, scenario_path, list(sets))
    terms = terms if terms is not None else slo_terms(s, None)
    arrays = build_workload(s)
    result = run_scenario(s, workload=arrays)
    summary = summarize(result)
    done = result.requests.filter(pl.col("status") == "completed")
    if done.height < 2:
        raise UserError(f"{trace}: fewer than 2 requests completed; nothing to diagnose")
    t = done["ttft_s"].to_numpy()
    p50, p99 = np.percentile(t, 50), np.percentile(t, 99)
    tail = done.filter(pl.col("ttft_s") >= p99)
    near = done.filter((pl.col("ttft_s") >= np.percentile(t, 45)) & (pl.col("ttft_s") <= np.percentile(t, 55)))
    tail_ms, med_ms = _parts_ms(tail), _parts_ms(near)
    shares = {c: sum(tail_ms[p] for p in parts) for c, parts in CAUSES.items()}
    cause = max(shares, key=shares.get)
    ttft_ratio = float(p99 / p50) if p50 > 0 else float("inf")
    prompt_ratio = _solo_prefill_ratio(result)
    total_tail = sum(tail_ms.values()) or 1.0

    reuse, router_hint, reuse_text = reuse_check(s, arrays, summary)
    chunks = get_policy(s.engine.policy).chunk_is_budget  # prompts chunked under the token budget
    sentences = [setup_sentence(s, summary)]
    sentences += [x for x in (failure_sentence(summary), grid_sentence(s, arrays)) if x]
    sentences += [
        f"p99 TTFT is {p99 * 1e3:,.0f} ms, {ttft_ratio:.1f}x the median ({p50 * 1e3:,.0f} ms). Prompt lengths alone "
        f"(each prompt's prefill with nothing else running) explain a p99/p50 of {prompt_ratio:.1f}x.",
        f"In the slowest 1% ({tail.height} requests), {shares[cause] / total_tail:.0%} of TTFT is {cause}: "
        + ", ".join(f"{c} {v / total_tail:.0%}" for c, v in sorted(shares.items(), key=lambda kv: -kv[1])) + ".",
    ]
    if cause == "queueing" and ttft_ratio > QUEUEING_RATIO * prompt_ratio:
        sentences.append("That is the queueing signature: the tail ratio is far above what prompt lengths explain, "
                         "and tail requests spend their time waiting for a batch slot or token budget. Add capacity "
                         "or admission control" + ("." if chunks else
                                                   "; chunked prefill helps only if long prefills hold the queue."))
    elif cause == "queueing":
        sentences.append(f"Tail requests mostly wait for admission, and the tail ratio ({ttft_ratio:.1f}x) is "
                         f"{ratio_words(ttft_ratio, prompt_ratio)} what prompt lengths explain ({prompt_ratio:.1f}x): "
                         "long prompts ahead of them hold the queue.")
    elif cause == "memory pressure":
        fp8 = "fp8 KV, " if s.engine.kv_cache_dtype == "auto" else ""  # advise only what is not in effect
        sentences.append("Tail requests wait for KV blocks or are preempted: KV capacity is the bottleneck "
                         f"({fp8}more memory per replica, or lower max_num_seqs).")
    elif cause == "long prompts":
        sentences.append("Tail requests are slow because their own prompts are long: their prefill alone dominates.")
    elif cause == "KV handoff":
        sentences.append("Tail requests wait for their KV to cross from the prefill to the decode pool or for "
                         "decode admission: more link bandwidth (disaggregation.kv_transfer), layer-wise "
                         "transfer, or more decode replicas.")
    elif cause == "the serving front end":
        sentences.append("Tail requests wait in the API server (HTTP handling and tokenisation, one request at "
                         "a time) or for their first chunk's way out: more API-server processes or a cheaper "
                         "front end (engine.overhead frontend_* terms).")
    else:
        sentences.append("Tail requests share steps with other work: prefill-decode interference.")
    sentences.append(f"Chunked prefill is {'on' if chunks else 'off'} "
                     f"(policy {s.engine.policy}, token budget {s.engine.max_num_batched_tokens}).")
    if summary.get("simsrv_peak_kv_usage", 0) > 0.95:
        sentences.append(f"KV cache use peaked at {summary['simsrv_peak_kv_usage']:.0%} with "
                         f"{summary['simsrv_num_preemptions']} preemptions.")

    if reuse_text:
        sentences.append(reuse_text)
    floor = _decode_floor(result, summary)
    if floor:
        floor["step_ms"] = decode_step_ms(result, floor["batch"], floor["context_tokens"])
        floor["step_one_ms"] = decode_step_ms(result, 1, floor["context_tokens"])

    # the verdict: saturation (and the replicas that keep up), SLO floors, bursts
    sat = frame_saturation(result.requests)
    burst = bursts(arrays.arrival_s, tail["arrival_s"].to_numpy())
    feas = feasibility(s, arrays, summary, terms, floor)
    ex = executor if executor is not None else _serial(s)
    p = plan(s, arrays, router_hint, terms)
    planned = any(c.name == "add capacity" for c, _ in p.candidates)
    search = ReplicaSearch(s, arrays, sat.saturated, sat.offered_per_s, sat.served_per_s, terms,
                           getattr(ex, "workers", 1), max_replicas, (s.cluster.replicas + 1,) if planned else ())
    jobs = p.jobs + search.jobs()
    count = {"done": 0, "total": len(jobs)}

    def tick(_key: str) -> None:
        count["done"] += 1
        if progress:
            progress(count["done"], count["total"])
    rows = run_jobs(ex, jobs, tick)
    if planned and not rows["add capacity"].get("error") and not search.disaggregated:
        search.known(s.cluster.replicas + 1, not rows["add capacity"]["saturated"])
    search.feed(rows)
    while more := search.jobs():
        count["total"] += len(more)
        rows.update(run_jobs(ex, more, tick))
        search.feed(rows)
    n = search.answer
    if n is not None and n not in (s.cluster.replicas, s.cluster.replicas + 1):
        key = ReplicaSearch.key(n)
        p.candidates.append((Candidate(f"{n} replicas", f"cluster.replicas={n}: the fewest that keep up"), [key]))
        p.pools[key] = f"{n} replicas"
    cands = assemble(p, rows, summary, num_gpus(s), terms)
    verdict = _verdict(s, summary, sat, search, feas, burst)
    sentences.extend(identical_results(cands))
    sentences.append(_best_fix(cands, summary, terms))
    if floor:
        sentences.append(
            f"Check by hand: a decode step at batch {floor['batch']:.1f} and {floor['context_tokens']:,.0f} tokens of "
            f"context reads {floor['bytes_per_step'] / 1e9:.2f} GB per GPU; at {result.deployment.gpu.hbm_bw_bytes_per_s / 1e12:.2f} "
            f"TB/s that is {floor['floor_ms']:.1f} ms, against a simulated median TPOT of {floor['tpot_ms']:.1f} ms "
            f"({floor['bandwidth_fraction']:.0%} of peak bandwidth).")
    measured = _measured(result, arrays)
    if measured:
        sentences.append(f"Against the measured run: median TTFT {measured['measured_p50_ttft_ms']:,.0f} ms measured vs "
                         f"{summary[MEDIAN_TTFT]:,.0f} simulated; per-request median absolute error "
                         f"{measured['ttft_median_abs_pct_error']:.0f}%.")
    payload = _payload(sat, search, terms, feas, floor, burst, cands)
    return Diagnosis(s, result, summary, cause, tail_ms, med_ms, ttft_ratio, prompt_ratio, sentences, cands,
                     tail["arrival_s"].to_numpy(), floor, measured, reuse, verdict, payload)


def _serial(s: Scenario):
    from sim.sweep.executors import SerialExecutor

    return SerialExecutor()


def _verdict(s: Scenario, summary: dict, sat, search: ReplicaSearch, feas: list, burst: dict) -> list[str]:
    share = sat.served_per_s / sat.offered_per_s if sat.offered_per_s > 0 else float("nan")
    queue = (f"median queue time {sat.mid_queue_s:,.1f} s mid-trace, {sat.last_queue_s:,.1f} s for the last 10% "
             "of arrivals")
    per_replica = summary["simsrv_num_gpus"] // max(1, s.cluster.replicas)
    if sat.saturated:
        head = (f"Saturated: while requests arrived the deployment served {sat.served_per_s:.2f} of the "
                f"{sat.offered_per_s:.2f} req/s offered ({share:.0%}) and its queue grew ({queue}): latencies "
                "grow with the trace's length, and no fix that leaves capacity as it is can hold them. "
                + search.sentence(per_replica))
    else:
        head = (f"Keeps up: while requests arrived the deployment served {sat.served_per_s:.2f} of the "
                f"{sat.offered_per_s:.2f} req/s offered ({share:.0%}); its queue did not grow for the whole "
                f"window ({queue}). " + search.sentence(per_replica))
    close = [f.term.name for f in feas if close_call(f.observed_ms, f.term.limit_ms)]
    caution = ([f"As is, {', '.join(close)} lies within {VALIDATED_REQUEST_ERR:.0%} of its limit, inside the "
                "model's validated request-level error: whether it passes is not decided by this simulation."]
               if close else [])
    # where the figures rest on costs outside the measured profiles (sim/metrics/run_warnings.py)
    uncertain = [f"Uncertainty: {n}." for n in summary.get("simsrv_uncertainty", [])]
    return [head, *(f.sentence() for f in feas), *caution, burst_sentence(burst, sat.saturated), *uncertain]


def _best_fix(cands: list[Candidate], summary: dict, terms) -> str:
    if not cands:
        return "No candidate fix applies."
    if terms and all(summary.get(t.key) is not None and summary[t.key] <= t.limit_ms for t in terms):
        return ("As is, the deployment meets every SLO (" + ", ".join(t.name for t in terms) + "): the candidates "
                "below only lower latency further.")
    best = cands[0]
    gpus = "no extra GPU" if best.gpus_added <= 0 else f"+{best.gpus_added} GPU{'s' if best.gpus_added > 1 else ''}, {best.gpus} in all"
    if best.meets_slo:
        return (f"Fewest GPUs that meet every SLO: {best.name} ({best.change}; {gpus}): p99 TTFT "
                f"{summary[P99_TTFT]:,.0f} -> {best.p99_ttft_ms:,.0f} ms.")
    if best.ttft_gain_ms is not None and best.ttft_gain_ms > 0 and best.p99_ttft_ms is not None:
        gain = best.ttft_gain_ms / summary[P99_TTFT] if summary.get(P99_TTFT) else 0.0
        return (f"No candidate meets every SLO. Largest p99 TTFT gain: {best.name} ({best.change}; {gpus}): "
                f"{summary[P99_TTFT]:,.0f} -> {best.p99_ttft_ms:,.0f} ms (-{gain:.0%}).")
    return "None of the candidate fixes lowers p99 TTFT by more than 2%, and none meets every SLO."


def _payload(sat, search: ReplicaSearch, terms, feas: list, floor: dict, burst: dict, cands: list[Candidate]) -> dict:
    """``diagnose --json``: exactly these keys (README's diagnose row)."""
    prefill = next((f.floor_ms for f in feas if f.term.metric == "ttft" and f.term.key.startswith("p99_")), None)
    nan_none = (lambda x: None if x is None or not math.isfinite(x) else x)
    return {
        "offered_rate": nan_none(sat.offered_per_s), "served_rate": nan_none(sat.served_per_s),
        "saturated": sat.saturated, "replicas_needed": search.answer,
        "slo": {t.name: t.limit_ms for t in terms},
        "floors_ms": {"prefill_p99_prompt": prefill, "decode_step": floor.get("step_ms") if floor else None},
        "infeasible": [f.term.name for f in feas if f.infeasible],
        "bursts": {k: burst[k] for k in ("peak_1s_rate", "peak_10s_rate", "slowest_1pct_span_s")},
        "fixes": [{"name": c.name, "gpus": c.gpus, P99_TTFT: c.p99_ttft_ms, P99_TPOT: c.p99_tpot_ms,
                   "meets_slo": c.meets_slo, "meets": dict(c.meets)} for c in cands],
    }


def _measured(result: RunResult, arrays: RequestArrays) -> dict[str, float]:
    """Per-request comparison with measured TTFTs (vLLM bench detailed JSON and the like)."""
    m = arrays.measured or {}
    if "measured_ttft_s" not in m:
        return {}
    sim = result.requests["ttft_s"].to_numpy()
    meas = np.asarray(m["measured_ttft_s"], dtype=np.float64)
    ok = ~np.isnan(sim) & ~np.isnan(meas) & (meas > 0)
    if not ok.any():
        return {}
    err = np.abs(sim[ok] - meas[ok]) / meas[ok] * 100
    return {"measured_p50_ttft_ms": float(np.median(meas[ok]) * 1e3),
            "measured_p99_ttft_ms": float(np.percentile(meas[ok], 99) * 1e3),
            "ttft_median_abs_pct_error": float(np.median(err)), "ttft_p90_abs_pct_error": float(np.percentile(err, 90)),
            "compared_requests": int(ok.sum())}
