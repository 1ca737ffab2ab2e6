"""``simsrv diagnose``: replay a production trace and explain its tail time to first token.

Why: users come with "p99 TTFT is 13x the median" and need the cause and the fix. The cause
is read from the exact TTFT decomposition of the slowest 1% (sim/core/ttft.py) and from the
signature the serving literature uses: a p99/p50 TTFT ratio far above what prompt-length
variance explains (each prompt's prefill alone) means queueing. Fixes are not guessed: the
trace's every request is re-run with each candidate change (sim/analysis/diagnose_fixes.py) and the
candidates are ranked by p99 TTFT gained per GPU added, then p99 TPOT paid.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from sim.core.batch import Batch
from sim.analysis.diagnose_checks import failure_sentence, grid_sentence, ratio_words, reuse_check, setup_sentence
from sim.analysis.diagnose_fixes import Candidate, evaluate
from sim.errors import UserError
from sim.run import RunResult, run_scenario
from sim.scenario import Scenario, parse_override, scenario_from_dict, set_dotted
from sim.analysis.summary import summarize
from sim.core.ttft import TTFT_PARTS
from sim.workload import RequestArrays, build_workload

CAUSES = {
    "queueing": ("ttft_wait_batch_s",),
    "memory pressure": ("ttft_wait_kv_s", "ttft_preempt_s"),
    "long prompts": ("ttft_prefill_s",),
    "interference": ("ttft_interference_s", "ttft_overhead_s"),
    "KV handoff": ("ttft_kv_transfer_s", "ttft_decode_s"),
}
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


DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "chat.yaml"


def trace_scenario(trace: Path, scenario_path: Path | None, sets: list[str]) -> Scenario:
    """The scenario diagnose replays: the scenario file (default scenarios/chat.yaml), its
    workload made the trace ``trace`` (a trace workload keeps its other keys: format, columns,
    time_unit, window...; a synthetic one becomes a trace with defaults), then every ``--set``
    applied last, so it wins. A bad key or value is one error line naming the flag."""
    from sim.yamlfile import read_yaml

    path = Path(scenario_path) if scenario_path is not None else DEFAULT_SCENARIO
    raw = read_yaml(path, "scenario file")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a scenario is a YAML mapping of keys, got {type(raw).__name__}")
    raw.pop("base_dir", None)
    workload = raw.get("workload")
    kept = workload.get("trace") if isinstance(workload, dict) else None
    # absolute, links not followed: /dev/fd/63 (a pipe: <(zcat t.gz)) resolves to "pipe:[...]"
    raw["workload"] = {"trace": {**(kept if isinstance(kept, dict) else {}), "path": os.path.abspath(trace)}}
    raw["name"] = f"diagnose-{trace.stem}"
    given: list[tuple[str, str]] = []
    for text in sets:
        key, value = parse_override(text)
        if (key + ".").startswith("workload.") and not key.startswith("workload.trace.") or key == "workload.trace.path":
            raise UserError(f"--set {key}: diagnose replays the trace given as its argument ({trace}); "
                            "set the trace's other keys one by one (workload.trace.KEY=value)")
        set_dotted(raw, key, value)
        given.append((key, text))
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
    if st.height == 0 or summary.get("median_tpot_ms") is None:
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
    tpot = summary["median_tpot_ms"]
    return {"batch": batch, "context_tokens": ctx, "bytes_per_step": bytes_per_step, "floor_ms": floor_ms,
            "tpot_ms": tpot, "bandwidth_fraction": floor_ms / tpot}


def diagnose(trace: Path, scenario_path: Path | None = None, sets: list[str] = ()) -> Diagnosis:
    s = trace_scenario(trace, scenario_path, list(sets))
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
                         "or admission control" + ("." if s.engine.policy == "chunked" else
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
    else:
        sentences.append("Tail requests share steps with other work: prefill-decode interference.")
    sentences.append(f"Chunked prefill is {'on' if s.engine.policy == 'chunked' else 'off'} "
                     f"(policy {s.engine.policy}, token budget {s.engine.max_num_batched_tokens}).")
    if summary.get("simsrv_peak_kv_usage", 0) > 0.95:
        sentences.append(f"KV cache use peaked at {summary['simsrv_peak_kv_usage']:.0%} with "
                         f"{summary['simsrv_num_preemptions']} preemptions.")

    if reuse_text:
        sentences.append(reuse_text)
    cands = evaluate(s, arrays, summary, router_hint)
    if cands and cands[0].ttft_gain_ms is not None and cands[0].ttft_gain_ms > 0:
        best = cands[0]
        gpus = ("no extra GPU" if best.gpus_added <= 0 else
                f"+{best.gpus_added} GPU{'s' if best.gpus_added > 1 else ''}, {best.gpus} in all, "
                f"{best.gain_per_gpu_ms:,.0f} ms per GPU added")
        sentences.append(f"Best fix per GPU added: {best.name} ({best.change}; {gpus}) takes p99 TTFT from "
                         f"{summary['p99_ttft_ms']:,.0f} to {best.p99_ttft_ms:,.0f} ms"
                         + (f", p99 TPOT {best.tpot_cost_ms:+.1f} ms." if best.tpot_cost_ms is not None else "."))
    elif cands:
        sentences.append("None of the candidate fixes lowers p99 TTFT by more than 2%.")

    floor = _decode_floor(result, summary)
    if floor:
        sentences.append(
            f"Check by hand: a decode step at batch {floor['batch']:.1f} and {floor['context_tokens']:,.0f} tokens of "
            f"context reads {floor['bytes_per_step'] / 1e9:.2f} GB per GPU; at {result.deployment.gpu.hbm_bw_bytes_per_s / 1e12:.2f} "
            f"TB/s that is {floor['floor_ms']:.1f} ms, against a simulated median TPOT of {floor['tpot_ms']:.1f} ms "
            f"({floor['bandwidth_fraction']:.0%} of peak bandwidth).")
    measured = _measured(result, arrays)
    if measured:
        sentences.append(f"Against the measured run: median TTFT {measured['measured_p50_ttft_ms']:,.0f} ms measured vs "
                         f"{summary['median_ttft_ms']:,.0f} simulated; per-request median absolute error "
                         f"{measured['ttft_median_abs_pct_error']:.0f}%.")
    return Diagnosis(s, result, summary, cause, tail_ms, med_ms, ttft_ratio, prompt_ratio, sentences, cands,
                     tail["arrival_s"].to_numpy(), floor, measured, reuse)


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
