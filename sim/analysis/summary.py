"""``summarize``: a run's figures, keyed as vLLM bench's ``--save-result`` JSON.

Why: users diff simsrv results against their real ``vllm bench serve`` results key for key;
simulator-only figures carry the ``simsrv_`` prefix.
"""

from __future__ import annotations

import datetime as _dt
import math

import numpy as np

from sim.cost.calibration import describe as describe_cost_model
from sim.analysis.metrics import STAT_KEYS, goodput_mask, itl_samples, plain_stats, run_length_stats
from sim.analysis.run_warnings import failure_kinds, run_warnings


def _ms(stats: dict[str, float], metric: str) -> dict[str, float | None]:
    out = {}
    for k in ("mean", "median", "std", "p50", "p90", "p99"):
        v = stats[k] * 1e3
        out[f"{k}_{metric}_ms"] = None if math.isnan(v) else v
    return out


def _hit_rate(schedulers) -> float | None:
    """Prefix-cache hit rate as vLLM reports it: cached prompt tokens / prompt tokens looked up."""
    q = sum(s.kv.query_tokens for s in schedulers)
    return sum(s.kv.hit_tokens for s in schedulers) / q if q else None


def _mean_ms(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(values.mean() * 1e3) if len(values) else None


def _gpus(result) -> str:
    """The GPU type, or each pool's type when they differ."""
    pools = result.layout.pools
    if len({dep.gpu.key for _, dep in pools}) > 1:
        return " / ".join(f"{dep.gpu.key} ({name})" for name, dep in pools)
    return result.deployment.gpu.key


def _costs(result) -> list:
    return [dep.cost for _, dep in result.layout.pools]


def _cost_models(result) -> str:
    pools = result.layout.pools
    if len(pools) == 1:
        c = pools[0][1].cost
        return describe_cost_model(c.calibration, c.carried_from)
    return "; ".join(f"{name}: {describe_cost_model(dep.cost.calibration, dep.cost.carried_from)}"
                     for name, dep in pools)


def _outside(result) -> list | None:
    """[fewest, most] scheduled sequences of a step, on any replica, whose engine overhead was
    taken outside the profile's measured batch range (None: no step was)."""
    seen = result.overhead_outside_seqs.values()
    return [min(lo for lo, _ in seen), max(hi for _, hi in seen)] if seen else None


def num_gpus(s) -> int:
    """GPUs the deployment uses: replicas x TP, or both pools when disaggregated."""
    from sim.engine.topology import layout_for

    return layout_for(s).num_gpus


def summarize(result) -> dict:
    s = result.scenario
    rq = result.requests
    ok = (rq["status"] == "completed").to_numpy()
    cols = {c: rq[c].to_numpy() for c in ("ttft_s", "tpot_s", "e2el_s", "queue_s", "finish_s",
                                          "input_tokens", "output_tokens", "num_preemptions")}
    steps = {c: result.steps[c].to_numpy() for c in result.steps.columns}
    finish = cols["finish_s"][ok]
    duration = float(finish.max()) if ok.any() else 0.0
    completed = int(ok.sum())
    tin = int(cols["input_tokens"][ok].sum())
    tout = int(cols["output_tokens"][ok].sum())
    itl = itl_samples(steps, result.resume_gaps_s, result.itl_adjust)
    if s.workload.synthetic is not None and s.workload.synthetic.rate_profile is None:
        rate, burst = s.workload.synthetic.request_rate, s.workload.synthetic.burstiness
    elif s.workload.synthetic is not None:  # a rate that varies over time: its mean
        rate, burst = result.workload.mean_rate_per_s, s.workload.synthetic.burstiness
    else:
        rate, burst = result.workload.mean_rate_per_s, None
    has_slo = any(v is not None for v in (s.slo.ttft_ms, s.slo.tpot_ms, s.slo.e2el_ms))
    good = int(goodput_mask(cols, ok, s.slo).sum()) if has_slo else None
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    model_id = s.model if isinstance(s.model, str) else (s.model.name or s.model.hf_config)
    reasons = failure_kinds(rq.filter(~rq["status"].eq("completed"))["fail_reason"].to_list())
    dep = result.deployment
    out: dict = {
        "date": _dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "simsrv",
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": len(rq),
        "request_rate": "inf" if math.isinf(rate) else rate,
        "burstiness": burst,
        "max_concurrency": s.workload.synthetic.max_concurrency if s.workload.synthetic is not None else None,
        "duration": duration,
        "completed": completed,
        "failed": len(rq) - completed,
        "total_input_tokens": tin,
        "total_output_tokens": tout,
        "request_throughput": per_s(completed),
        "request_goodput": per_s(good) if good is not None else None,
        "output_throughput": per_s(tout),
        "total_token_throughput": per_s(tin + tout),
    }
    out.update(_ms(plain_stats(cols["ttft_s"][ok]), "ttft"))
    out.update(_ms(plain_stats(cols["tpot_s"][ok]), "tpot"))
    itl_stats = run_length_stats(itl, tail=True)
    out.update(_ms({k: itl_stats[k] for k in STAT_KEYS}, "itl"))
    # p99.9 and max: the rare long stalls (a long prefill sharing a step with decodes) that p99 hides
    out["p99.9_itl_ms"], out["simsrv_max_itl_ms"] = (
        (None, None) if math.isnan(itl_stats["max"]) else (itl_stats["p99.9"] * 1e3, itl_stats["max"] * 1e3))
    out["simsrv_num_itl_samples"] = itl.num_samples
    out.update(_ms(plain_stats(cols["e2el_s"][ok]), "e2el"))
    q = plain_stats(cols["queue_s"][ok])
    out.update({f"simsrv_{k}_queue_time_ms": (None if math.isnan(v) else v * 1e3) for k, v in q.items()})
    out.update({
        "simsrv_policy": s.engine.policy,
        "simsrv_gpu": _gpus(result),
        "simsrv_replicas": s.cluster.replicas,
        "simsrv_tensor_parallel_size": s.cluster.tensor_parallel_size,
        "simsrv_pipeline_parallel_size": s.cluster.pipeline_parallel_size,
        "simsrv_data_parallel_size": s.cluster.data_parallel_size,
        "simsrv_num_gpus": num_gpus(s),
        "simsrv_router": s.cluster.router,
        "simsrv_seed": s.seed,
        "simsrv_num_preemptions": int(cols["num_preemptions"].sum()),
        "simsrv_failed_reasons": reasons,
        "simsrv_kv_blocks_per_replica": dep.memory.num_kv_blocks,
        "simsrv_kv_capacity_tokens_per_replica": dep.memory.kv_capacity_tokens,
        "simsrv_peak_kv_usage": result.peak_kv_usage,
        "simsrv_num_swaps": sum(x.num_swaps for x in result.schedulers),
        "simsrv_prefix_cache_hit_rate": _hit_rate(result.schedulers),
        "simsrv_kv_transfers": result.transfers.get("count", 0),
        "simsrv_kv_transfer_bytes": result.transfers.get("bytes", 0.0),
        "simsrv_mean_kv_transfer_ms": _mean_ms(rq["kv_transfer_s"].to_numpy()),
        # backpressure: requests whose KV had arrived but waited for decode blocks, held meanwhile
        # by the prefill side
        "simsrv_kv_backpressure_requests": int((rq["decode_rounds_waited"] > 0).sum()),
        "simsrv_mean_decode_wait_ms": _mean_ms(rq["decode_wait_s"].to_numpy()),
        "simsrv_peak_prefill_held_blocks": max((x.kv.peak_held for x in result.schedulers), default=0),
        "simsrv_num_steps": int(steps["num_steps"].sum()) if len(steps["num_steps"]) else 0,
        "simsrv_num_step_rows": len(steps["num_steps"]),
        "simsrv_cost_model": _cost_models(result),
        # {operator: GPU} whose measured curve an operator borrows (scaled by the bandwidth ratio)
        "simsrv_calibration_carried_from": {k: v for c in _costs(result) for k, v in c.carried_from.items()},
        "simsrv_extrapolated_steps": sum(result.extrapolated_steps.values()),
        "simsrv_lm_head_extrapolated": result.lm_head_extrapolated,
        "simsrv_engine_profile": dep.cost.engine.describe(),
        # scheduled-sequence counts [min, max] whose engine overhead used the per-sequence term
        # outside the profile's measured batch range (null: none did)
        "simsrv_overhead_outside_batch_range": _outside(result),
        "simsrv_wall_s": result.wall_s,
        "simsrv_requests_per_wall_s": len(rq) / result.wall_s if result.wall_s > 0 else None,
    })
    out["simsrv_warnings"] = run_warnings(out, rq["arrival_s"].to_numpy()[ok], cols["queue_s"][ok],
                                          (cols["e2el_s"] - cols["queue_s"])[ok])
    g = dep.memory.kv_groups
    if s.engine.enable_prefix_caching and not g.caches_prefixes:
        out["simsrv_warnings"].append(
            f"engine.enable_prefix_caching: not modelled for {dep.model.name}, whose KV cache groups are "
            f"{g.full} full-attention and {g.sliding} sliding-window ({dep.model.sliding_window} tokens): "
            "no prefix-cache hits were counted")
    return out
