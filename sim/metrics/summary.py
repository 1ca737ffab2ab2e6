"""``summarize``: a run's figures, keyed as vLLM bench's ``--save-result`` JSON.

Why: users diff simsrv results against their real ``vllm bench serve`` results key for key;
simulator-only figures carry the ``simsrv_`` prefix.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping

import numpy as np

from sim.cost.calibration import describe as describe_cost_model
from sim.metrics.vllm_bench import (BEND_STEP_COLUMNS, REQUEST_METRICS, STAT_KEYS, goodput_mask, itl_pieces,
                                  pieces_stats, plain_stats)
from sim.metrics.run_warnings import failure_kinds, run_warnings, uncertainty_notes
from sim.run import frontend_status
from sim.metrics.chunk_itl import CHUNK_STEP_COLUMNS, chunk_gaps_s, chunk_itl_pieces
from sim.metrics.keys import MAX_ITL, P999_ITL, STATS, key, queue_key
from sim.policies.base import FINISH_LENGTH
from sim.core.request import ABORTED
from sim.engine.admission_control import REJECTED


def _ms(stats: dict[str, float], metric: str) -> dict[str, float | None]:
    out = {}
    for k in STATS:
        v = stats[k] * 1e3
        out[key(k, metric)] = None if math.isnan(v) else v
    return out


def _hit_rate(schedulers) -> float | None:
    """Prefix-cache hit rate as vLLM reports it: cached prompt tokens / prompt tokens looked up."""
    q = sum(s.kv.query_tokens for s in schedulers)
    return sum(s.kv.hit_tokens for s in schedulers) / q if q else None


def _offload_keys(tiers: list, dep) -> dict:
    """The CPU offloading tiers' figures (sim/core/kv.py ``CPUTier``), summed over replicas:
    prompt tokens found there, loads, blocks and bytes moved each way (a block's bytes on every
    GPU of the replica), and the seconds the links spent (loads: on the request's path;
    stores: asynchronous, beside the steps)."""
    block_bytes = dep.memory.kv_block_bytes_per_gpu * dep.tp * dep.pp
    load_blocks = sum(t.load_blocks for t in tiers)
    store_blocks = sum(t.store_blocks for t in tiers)
    return {
        "simsrv_kv_offload_capacity_blocks": tiers[0].capacity_blocks,
        "simsrv_kv_offload_hit_tokens": sum(t.hit_tokens for t in tiers),
        # CPU-tier hits / prompt tokens looked up (the GPU's are simsrv_prefix_cache_hit_rate)
        "simsrv_kv_offload_hit_rate": (sum(t.hit_tokens for t in tiers) / q) if (q := sum(t.query_tokens for t in tiers))
        else None,
        "simsrv_kv_offload_loads": sum(t.loads for t in tiers),
        "simsrv_kv_offload_load_blocks": load_blocks,
        "simsrv_kv_offload_load_bytes": load_blocks * block_bytes,
        "simsrv_kv_offload_load_s": sum(t.load_s for t in tiers),
        "simsrv_kv_offload_store_blocks": store_blocks,
        "simsrv_kv_offload_store_bytes": store_blocks * block_bytes,
        "simsrv_kv_offload_store_s": store_blocks * tiers[0].load_s_per_block,
        "simsrv_kv_offload_evicted_blocks": sum(t.evicted_blocks for t in tiers),
    }


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


class _Columns(Mapping):
    """Columns read on access (from the run's column stores), one at a time."""

    def __init__(self, names, read):
        self._names, self._read = tuple(names), read

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        return self._read(name)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def admission_limits(s) -> list | None:
    """The scenario's admission_control limits as plain data (None: none): runs are compared
    only between equal limits (sim/analysis/compare.py), as their rejections differ otherwise."""
    ac = s.admission_control
    return None if ac is None else [c.model_dump() for c in ac.limits]


def class_figures(col, ok: np.ndarray, rejected: np.ndarray, good: np.ndarray | None, per_s,
                  aborted: np.ndarray | None = None, measured: np.ndarray | None = None) -> dict:
    """Per request priority (result.json ``simsrv_classes``, keyed by the priority as text): its
    requests, completed, failed (not counting those ``aborted`` by their clients) and rejected, TTFT and TPOT p50 / p99 of its completed requests,
    and its goodput (requests per second meeting every SLO; null without an SLO). ``measured``:
    the requests the latencies are of (``measured_rows``: the warm-up left out), None: all."""
    priority = col("priority")
    ttft, tpot = col("ttft_s"), col("tpot_s")
    out: dict = {}
    for p in sorted(set(priority.tolist())):
        mine = priority == p
        done = mine & ok
        timed = done if measured is None else done & measured
        t, d = plain_stats(ttft[timed]), plain_stats(tpot[timed])
        n_rejected = int((mine & rejected).sum())
        n_aborted = int((mine & aborted).sum()) if aborted is not None else 0
        figures: dict = {"requests": int(mine.sum()), "completed": int(done.sum()),
                         "failed": int(mine.sum()) - int(done.sum()) - n_rejected - n_aborted, "rejected": n_rejected}
        figures.update(_class_ms(t, "ttft"))
        figures.update(_class_ms(d, "tpot"))
        figures["request_goodput"] = per_s(int((good & mine).sum())) if good is not None else None
        out[str(p)] = figures
    return out


def _class_ms(stats: dict[str, float], metric: str) -> dict[str, float | None]:
    """p50 and p99 of ``metric`` in ms (None where no request completed)."""
    out = {}
    for stat in ("p50", "p99"):
        v = stats[stat] * 1e3
        out[key(stat, metric)] = None if math.isnan(v) else v
    return out


def _chunk_gaps_s(result, read_rows, ok: np.ndarray) -> np.ndarray:
    """The run's gaps between streamed chunks (``engine.stream_interval`` > 1): its completed
    requests' engine-side token times (the step log's, and the schedulers' breaks), as their
    clients receive the chunks (``chunk_gaps_s``)."""
    raw = result.results.read
    fe = result.frontend
    breaks = [b for sched in result.schedulers for b in sched.itl_breaks]
    return chunk_gaps_s(read_rows(0, result.num_step_rows), raw("replica")[ok], raw("first_token_s")[ok],
                        raw("finish_s")[ok], raw("output_tokens")[ok], result.request_column("request_id")[ok],
                        breaks, result.scenario.engine.stream_interval,
                        fe.per_output_token_s if fe is not None else 0.0)


def warmup_requests(s) -> int:
    """The workload's warm-up requests (``workload.synthetic.warmup_requests``; 0 for a trace)."""
    return s.workload.synthetic.warmup_requests if s.workload.synthetic is not None else 0


def measured_rows(s, n: int) -> np.ndarray:
    """Per request (id order, the order they are sent in): whether the benchmark measures it.

    Why: a benchmark client leaves its start-up out of what it reports. GenAI-Perf and AIPerf
    send ``--warmup-request-count`` requests first and discard their metrics (AIPerf docs,
    "Warmup Phase Configuration": "Warmup metrics are discarded"); perf_analyzer, under
    GenAI-Perf, reports the last three measurement windows that agree within
    ``--stability-percentage`` (Triton docs, perf_analyzer "Measurement Modes"), so not the
    start-up. Under a closed loop the start-up is the first wave: every client sends at once
    and the engine serves those prompts one after another, a transient no later request sees.
    The first ``warmup_requests`` requests are simulated like any other (they load the engine;
    the load goes on through the measurement, as perf_analyzer's windows do) and left out of the
    per-request latency figures of the summary (TTFT, TPOT, E2EL, queue time, and each priority
    class's). NOTE: ITL (pooled over the step log), the throughputs, goodput, the request counts,
    the requests frame and the pages' charts cover the whole run. AIPerf waits for its
    warm-up responses before its profiling phase (the same docs, "Grace Period"): its clients
    then start together again, which this does not model."""
    return measured_ids(np.arange(n), warmup_requests(s))


def measured_ids(request_ids: np.ndarray, warmup: int) -> np.ndarray:
    """Whether each request of ``request_ids`` is measured: ids are in the order requests are
    sent, and the first ``warmup`` are the benchmark's warm-up (``measured_rows``)."""
    return request_ids >= warmup


def summarize(result) -> dict:
    """Read column by column from the run's stores (``RunResult.request_column``): memory
    holds a few request-sized columns at a time, never the whole requests frame."""
    s = result.scenario
    n = result.num_requests
    ok = result.completed()
    col = result.request_column
    finish = col("finish_s")[ok]
    duration = float(finish.max()) if ok.any() else 0.0
    del finish
    completed = int(ok.sum())
    tin = int(col("input_tokens")[ok].sum())
    tout = int(col("output_tokens")[ok].sum())
    # the step log read 2^18 rows at a time (sim/metrics/vllm_bench.py pieces_stats)
    def reader(columns):
        names = [c for c in columns if c in result.step_store.names]
        return lambda a, b: {c: result.step_column(c, a, b) for c in names}
    if s.engine.stream_interval > 1:  # one gap per streamed chunk (sim/metrics/chunk_itl.py)
        itl = chunk_itl_pieces(_chunk_gaps_s(result, reader(CHUNK_STEP_COLUMNS), ok))
    else:
        itl = itl_pieces(reader(BEND_STEP_COLUMNS), result.num_step_rows, result.resume_gaps_s, result.itl_adjust,
                         with_bend=True)
    if s.workload.synthetic is not None and s.workload.synthetic.rate_profile is None:
        rate, burst = s.workload.synthetic.request_rate, s.workload.synthetic.burstiness
    elif s.workload.synthetic is not None:  # a rate that varies over time: its mean
        rate, burst = result.mean_rate_per_s, s.workload.synthetic.burstiness
    else:
        rate, burst = result.mean_rate_per_s, None
    has_slo = any(v is not None for v in (s.slo.ttft_ms, s.slo.tpot_ms, s.slo.e2el_ms))
    good_mask = goodput_mask(_Columns(REQUEST_METRICS, col), ok, s.slo) if has_slo else None
    good = int(good_mask.sum()) if good_mask is not None else None
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    model_id = s.model if isinstance(s.model, str) else (s.model.name or s.model.hf_config)
    labels = result.results.labels()
    label_col = result.request_column("label")
    # rejected by admission control (sim/engine/admission_control.py): counted apart from failures
    rejected_codes = [c for c, (status, _) in enumerate(labels) if status == REJECTED]
    rejected = np.isin(label_col, rejected_codes) if rejected_codes else np.zeros(len(label_col), dtype=bool)
    # aborted by their clients (sim/engine/cluster.py ``Replica.abort``): counted apart from failures too
    aborted_codes = [c for c, (status, _) in enumerate(labels) if status == ABORTED]
    aborted = np.isin(label_col, aborted_codes) if aborted_codes else np.zeros(len(label_col), dtype=bool)
    n_aborted = int(aborted.sum())
    reasons = failure_kinds([labels[c][1] for c in label_col[~ok & ~rejected & ~aborted].tolist()])
    rejected_reasons = failure_kinds([labels[c][1] for c in label_col[rejected].tolist()])
    # completed at their max_tokens before their end of sequence (sim/policies/base.py settle_max_tokens)
    stopped = [c for c, (status, reason) in enumerate(labels) if status == "completed" and reason == FINISH_LENGTH]
    truncated = int(np.isin(result.request_column("label"), stopped).sum()) if stopped else 0
    dep = result.deployment
    out: dict = {
        "date": _dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "simsrv",
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": n,
        "request_rate": "inf" if math.isinf(rate) else rate,
        "burstiness": burst,
        "max_concurrency": s.workload.synthetic.max_concurrency if s.workload.synthetic is not None else None,
        "duration": duration,
        "completed": completed,
        "failed": n - completed - int(rejected.sum()) - n_aborted,
        "total_input_tokens": tin,
        "total_output_tokens": tout,
        "request_throughput": per_s(completed),
        "request_goodput": per_s(good) if good is not None else None,
        "output_throughput": per_s(tout),
        "total_token_throughput": per_s(tin + tout),
    }
    measured = ok & measured_rows(s, n)  # the benchmark's warm-up left out (``measured_rows``)
    out.update(_ms(plain_stats(col("ttft_s")[measured]), "ttft"))
    out.update(_ms(plain_stats(col("tpot_s")[measured]), "tpot"))
    itl_stats = pieces_stats(itl, tail=True)  # (its sum_extra_s: the fast-forwarded rows' bend)
    out.update(_ms({k: itl_stats[k] for k in STAT_KEYS}, "itl"))
    # p99.9 and max: the rare long stalls (a long prefill sharing a step with decodes) that p99 hides
    out[P999_ITL], out[MAX_ITL] = (
        (None, None) if math.isnan(itl_stats["max"]) else (itl_stats["p99.9"] * 1e3, itl_stats["max"] * 1e3))
    out["simsrv_num_itl_samples"] = itl_stats["n"]
    out.update(_ms(plain_stats(col("e2el_s")[measured]), "e2el"))
    q = plain_stats(col("queue_s")[measured])
    out.update({queue_key(k): (None if math.isnan(v) else v * 1e3) for k, v in q.items()})
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
        "simsrv_num_preemptions": int(col("num_preemptions").sum()),
        "simsrv_failed_reasons": reasons,
        # rejected by admission_control, never served: in no latency figure, not failed
        "simsrv_rejected": int(rejected.sum()),
        "simsrv_rejected_reasons": rejected_reasons,
        # aborted by their clients (a disconnect in simsrv serve, a trace's abort_s): not failed
        "simsrv_aborted": n_aborted,
        "simsrv_admission_control": admission_limits(s),
        "simsrv_truncated_requests": truncated,
        # the benchmark's warm-up: in no per-request latency figure (``measured_rows``)
        "simsrv_warmup_requests": warmup_requests(s),
        "simsrv_kv_blocks_per_replica": dep.memory.num_kv_blocks,
        "simsrv_kv_capacity_tokens_per_replica": dep.memory.kv_capacity_tokens,
        "simsrv_peak_kv_usage": result.peak_kv_usage,
        "simsrv_num_swaps": sum(x.num_swaps for x in result.schedulers),
        "simsrv_prefix_cache_hit_rate": _hit_rate(result.schedulers),
        "simsrv_kv_transfers": result.transfers.get("count", 0),
        "simsrv_kv_transfer_bytes": result.transfers.get("bytes", 0.0),
        "simsrv_mean_kv_transfer_ms": _mean_ms(col("kv_transfer_s")),
        # backpressure: requests whose KV had arrived but waited for decode blocks, held meanwhile
        # by the prefill side
        "simsrv_kv_backpressure_requests": int((col("decode_rounds_waited") > 0).sum()),
        "simsrv_mean_decode_wait_ms": _mean_ms(col("decode_wait_s")),
        "simsrv_peak_prefill_held_blocks": max((x.kv.peak_held for x in result.schedulers), default=0),
        "simsrv_num_steps": int(result.step_column("num_steps").sum()) if result.num_step_rows else 0,
        "simsrv_num_step_rows": result.num_step_rows,
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
        "simsrv_requests_per_wall_s": n / result.wall_s if result.wall_s > 0 else None,
    })
    tiers = [x.kv.offload for x in result.schedulers if x.kv.offload is not None]
    if tiers:  # engine.kv_offloading_size: the CPU tier's figures (keys only then: off is unchanged)
        out.update(_offload_keys(tiers, dep))
    out["simsrv_classes"] = class_figures(col, ok, rejected, good_mask, per_s, aborted, measured)
    steps = out["simsrv_num_steps"]
    out["simsrv_extrapolated_step_share"] = out["simsrv_extrapolated_steps"] / steps if steps else 0.0
    queue = col("queue_s")
    out["simsrv_warnings"] = run_warnings(out, col("arrival_s")[ok], queue[ok], all_arrival_s=col("arrival_s"))
    # where the figures rest on extrapolated costs (sim/metrics/run_warnings.py): shown beside them
    out["simsrv_frontend"] = frontend_status(s)  # the serving front end (sim/engine/frontend.py)
    out["simsrv_uncertainty"] = uncertainty_notes(out)
    g = dep.memory.kv_groups
    if s.engine.enable_prefix_caching and not g.caches_prefixes:
        out["simsrv_warnings"].append(
            f"engine.enable_prefix_caching: not modelled for {dep.model.name}, whose KV cache groups are "
            f"{g.full} full-attention and {g.sliding} sliding-window ({dep.model.sliding_window} tokens): "
            "no prefix-cache hits were counted")
    return out
