"""``simsrv explain``: the roofline and memory arithmetic of a deployment, per GPU.

Why: users should be able to check the simulator's key figures by hand; these are the
numbers behind every step time (ARCHITECTURE.md section 4). The floors are sim/cost/floor.py's
(the ones tests/test_physical_floors.py and tests/test_floors_pp.py hold every priced step to),
the intensities are read from the simulator's own cost model at 100% of peak
(``RooflineCostModel.ideal``) and the memory figures from its memory plan, so they cannot drift
from what a run costs.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from sim.core.batch import Batch
from sim.cost.floor import FloorParts, cost_floor_parts_s
from sim.cost.roofline import RooflineCostModel
from sim.engine.deployment import Deployment
from sim.spec.quantization import get_quantization
from sim.spec.nodes import boundary_crosses, describe, tp_nodes
from sim.engine.frontend import Frontend

EXPLAIN_KEYS = (
    "params", "weight_bytes_per_gpu", "kv_bytes_per_token", "kv_capacity_tokens",
    "max_seqs_at_context", "ridge_flops_per_byte", "prefill_intensity_flops_per_byte",
    "decode_intensity_flops_per_byte", "decode_step_floor_ms", "prefill_floor_ms",
) + (
    # issue 11: architecture, driver memory, pipeline and expert parallelism
    "active_params", "gpu_memory_bytes", "usable_memory_bytes", "kv_bytes_per_token_per_gpu",
    "kv_bytes_per_seq_at_context", "num_sliding_layers", "sliding_window_tokens", "pipeline_parallel_size",
    "max_layers_per_stage", "pp_send_bytes_per_token_per_gpu", "expert_parallel_size", "experts_per_gpu",
    "kv_full_groups", "kv_sliding_groups", "kv_layers_per_group", "kv_blocks_per_seq_at_context",
    "prefill_attn_flops_per_pair_per_layer", "decode_attn_flops_per_pair_per_layer",
    # data-parallel attention with expert parallelism (sim/cost/all2all.py), at --batch tokens per rank
    "data_parallel_size", "all2all_dispatch_bytes_per_layer_per_gpu", "all2all_combine_bytes_per_layer_per_gpu",
    "all2all_ms_per_layer",
    # issue 37: nodes (sim/spec/nodes.py): the replica's placement and the link of each collective
    "gpus_per_node", "nodes_per_replica", "inter_node_gb_per_s", "inter_node_latency_us", "tp_allreduce_nodes",
    "tp_allreduce_ms_per_layer", "pp_sends_between_nodes",
    # per-request host work and the serving front end (issue 37; sim/engine/frontend.py), for one
    # prompt of the context's length: 0 offline (engine.api_server: false); a front end in the
    # engine's thread (frontend_overlap false) shows in prompt_host_ms_at_context instead
    "frontend_overlap", "frontend_in_ms_at_context", "frontend_first_chunk_ms", "frontend_per_output_token_ms",
    "frontend_chunk_ms", "prompt_host_ms_at_context",
    # issue 40: the CPU offloading tier (engine.kv_offloading_size; sim/core/kv.py CPUTier): its
    # blocks and tokens, the host link's bandwidth per GPU, one block's load (each GPU its shard);
    # 0 when off
    "kv_offload_blocks", "kv_offload_tokens", "kv_offload_link_gb_per_s", "kv_offload_load_us_per_block",
    # issue 40: speculative decoding (engine.speculative_config; sim/cost/speculative.py), a decode
    # step of --batch sequences at --context each as the run costs it (off: 1 token, no draft)
    "spec_tokens_per_step", "spec_decode_step_ms", "spec_verify_step_ms", "spec_draft_ms", "spec_ms_per_token",
    # the drafter's weights per GPU (sim/cost/speculative.py draft_weight_bytes_per_gpu), taken out
    # of the KV cache before kv_capacity_tokens (0 when off or ngram)
    "spec_draft_weight_bytes_per_gpu",
    # issue 40: weight quantization (sim/spec/quantization.py): the weights stored quantized, their
    # bits per weight with the block scales (16 unquantized), and the tensor-core peak the
    # quantized GEMMs run at (the bf16 peak for weight-only kernels)
    "quantized_params", "quantized_bits_per_weight", "quantized_gemm_peak_flops_per_s",
    # issue 37 item 5: the engine generation's kernels and launches (engine profile; sim/cost/
    # attention_backend.py): how many times a decode step reads each cached K/V byte, in HBM
    # time, and the host's kernel launches of a decode step of --batch sequences (0 under a CUDA graph)
    "decode_kv_reads", "decode_launch_ms",
    # issue 37: the two floors above (sim/cost/floor.py, the one the floor tests hold every step
    # to) in their parts: operators bound by FLOPs over peak, by bytes over HBM bandwidth, and
    # the collectives and pipeline sends at link peak; each floor is the sum of its parts
    "decode_step_floor_compute_ms", "decode_step_floor_memory_ms", "decode_step_floor_communication_ms",
    "prefill_floor_compute_ms", "prefill_floor_memory_ms", "prefill_floor_communication_ms",
)
# Operators that are neither FLOPs nor HBM bytes: the all-reduce crosses the GPU link, the
# engine overhead is host time.
_NOT_ROOFLINE = ("allreduce", "overhead")


def _floor_s(cm: RooflineCostModel, batch: Batch) -> float:
    return sum(t for op, t in cm.step_time(batch).ops_s.items() if op not in _NOT_ROOFLINE)


def explain(dep: Deployment, context_tokens: int, batch: int) -> dict[str, float | int]:
    """Per GPU of the tensor-parallel group: a prefill of one ``context_tokens`` prompt (its
    LM head on the one sampled position, as the simulator runs it) and a decode step of
    ``batch`` sequences at ``context_tokens`` each."""
    m, g, tp = dep.model, dep.gpu, dep.tp
    n, b = context_tokens, batch
    kv_tok = m.kv_bytes_per_token(dep.kv_dtype_bytes)
    prefill = Batch(prefill_chunks=((n, 0),), num_logits=1)
    decode = Batch(num_decode_seqs=b, decode_context_tokens=b * n, num_logits=b)
    # data-parallel ranks: the routed experts of every rank's tokens (each carrying the batch)
    # over the whole group (sim/cost/dp_ep.py)
    ideal, kw = RooflineCostModel.ideal, {}
    if dep.dp > 1:
        ideal, kw = type(dep.cost).ideal, {"dp": dep.dp, "links": dep.cost.links}
    mem = ideal(m, g, tp, dep.kv_dtype_bytes, "memory", **kw)
    # FLOPs do not depend on how weights are stored: the intensities count them at the bf16
    # peak; the prefill floor runs at the quantized GEMM peak (fp8 / int8 W8A8).
    flops_cm = ideal(replace(m, quantization=None), g, tp, dep.kv_dtype_bytes, "compute", **kw)
    peak = g.bf16_flops_per_s
    # the floors: sim/cost/floor.py's, of the deployment's own cost model (a pipeline's rounds,
    # a data-parallel expert group's all-to-all), that no step the run prices goes below
    floors = {"decode_step": cost_floor_parts_s(dep.cost, decode), "prefill": cost_floor_parts_s(dep.cost, prefill)}

    def intensity(bt: Batch) -> float:
        return _floor_s(flops_cm, bt) * peak / (_floor_s(mem, bt) * g.hbm_bw_bytes_per_s)

    return {
        "params": m.num_params,
        "weight_bytes_per_gpu": dep.memory.weight_bytes_per_gpu,
        "kv_bytes_per_token": kv_tok,
        "kv_capacity_tokens": dep.memory.kv_capacity_tokens,
        "max_seqs_at_context": dep.memory.num_kv_blocks // dep.memory.kv_groups.blocks(n, dep.memory.block_size),
        "ridge_flops_per_byte": g.ridge_flops_per_byte,
        "prefill_intensity_flops_per_byte": intensity(prefill),
        "decode_intensity_flops_per_byte": intensity(decode),
        "decode_step_floor_ms": floors["decode_step"].total_s * 1e3,
        "prefill_floor_ms": floors["prefill"].total_s * 1e3,
        **breadth_figures(dep, n),
        # per GPU, per (query, key) pair and layer: 4 x heads x head_dim, MLA 2 x heads x (192 + 128)
        # in prefill and 2 x heads x (576 + 512) in absorbed decode (sim/cost/arch.py)
        "prefill_attn_flops_per_pair_per_layer": flops_cm._prefill_pair_flops,
        "decode_attn_flops_per_pair_per_layer": flops_cm._decode_pair_flops,
        **all2all_figures(dep, b),
        **node_figures(dep, b),
        **frontend_figures(dep, n),
        **offload_figures(dep),
        **speculative_figures(dep, n, b),
        **quantization_figures(dep),
        **kernel_figures(dep, b),
        **floor_part_figures(floors["decode_step"], floors["prefill"]),
    }


def floor_part_figures(decode: FloorParts, prefill: FloorParts) -> dict[str, float]:
    """The two floors' parts (sim/cost/floor.py ``FloorParts``), in ms."""
    return {
        "decode_step_floor_compute_ms": decode.compute_s * 1e3,
        "decode_step_floor_memory_ms": decode.memory_s * 1e3,
        "decode_step_floor_communication_ms": decode.communication_s * 1e3,
        "prefill_floor_compute_ms": prefill.compute_s * 1e3,
        "prefill_floor_memory_ms": prefill.memory_s * 1e3,
        "prefill_floor_communication_ms": prefill.communication_s * 1e3,
    }


def kernel_figures(dep: Deployment, batch: int) -> dict[str, float]:
    """The engine's attention kernels and launches: each cached K/V byte's reads per decode step
    in HBM time (1; a GQA group per query head under pre-XQA TensorRT-LLM or vLLM 0.2's kernels,
    a 16-bit cache's re-reads priced at the L2's bandwidth), and the host time launching a decode
    step's kernels when it is not a CUDA graph replay (overlapped with the GPU's work)."""
    cm = _tp_model(dep)
    launch_s = cm.engine.host_terms(batch, False, cm.tp, dep.model.num_layers)[1]
    return {"decode_kv_reads": float(cm.decode_kv_reads), "decode_launch_ms": launch_s * 1e3}


def quantization_figures(dep: Deployment) -> dict[str, float | int]:
    """The deployment's weight quantization: what it stores narrower and the GEMM peak it uses."""
    m, g = dep.model, dep.gpu
    q = get_quantization(m.quantization)
    return {
        "quantized_params": m.quantized_params,
        "quantized_bits_per_weight": 8.0 * m.linear_weight_bytes_per_param if q is not None else 8.0 * m.dtype_bytes,
        "quantized_gemm_peak_flops_per_s": g.bf16_flops_per_s if q is None else q.gemm_peak_flops_per_s(g),
    }


def offload_figures(dep: Deployment) -> dict[str, float | int]:
    """The CPU offloading tier's size and one block's load time (bytes per GPU / the host
    link, PCIe or NVLink-C2C: the GPU catalogue's ``pcie_bw_bytes_per_s``), as a run uses them."""
    n = dep.kv_offload_blocks
    if not n:
        return {"kv_offload_blocks": 0, "kv_offload_tokens": 0, "kv_offload_link_gb_per_s": 0.0,
                "kv_offload_load_us_per_block": 0.0}
    return {"kv_offload_blocks": n, "kv_offload_tokens": n * dep.memory.block_size,
            "kv_offload_link_gb_per_s": dep.gpu.pcie_bw_bytes_per_s / 1e9,
            "kv_offload_load_us_per_block": dep.swap_s_per_block * 1e6}


def offload_lines(dep: Deployment) -> list[str]:
    """The CPU offloading tier in words (``simsrv explain``): what it holds, what a load costs,
    and that its KV connector turns vLLM's hybrid KV cache manager off."""
    n = dep.kv_offload_blocks
    if not n:
        return []
    from sim.engine.deployment import OFFLOAD_LATENCY_S

    lines = [f"KV offloading: CPU tier of {n:,} blocks ({n * dep.memory.block_size:,} tokens), LRU; "
             f"a load takes {dep.swap_s_per_block * 1e6:.3g} us per block over the host link "
             f"({dep.gpu.pcie_bw_bytes_per_s / 1e9:.4g} GB/s per GPU) + {OFFLOAD_LATENCY_S * 1e6:.3g} us per load, "
             "before the request is scheduled; stores go the other way, beside the steps"]
    if dep.model.sliding_window and dep.model.num_sliding_layers:
        lines.append("KV offloading sets up a KV connector, which turns vLLM's hybrid KV cache manager off: "
                     f"the {dep.model.num_sliding_layers} sliding-window layers hold full-attention KV "
                     "(kv_sliding_groups 0)")
    return lines


def speculative_figures(dep: Deployment, context_tokens: int, batch: int) -> dict[str, float]:
    """A decode step of ``batch`` sequences at ``context_tokens`` each, as the run costs it: the
    tokens a step emits per sequence (E), the step without speculative decoding, the target's
    step verifying k + 1 tokens per sequence, the draft's seconds (GPU passes; ngram: the host
    scan, ``SpeculativeCost.host_s``), and (verify + draft) / E:
    the time per output token it comes to; and the drafter's weights per GPU (out of the KV cache)."""
    spec = getattr(dep.cost, "spec_run", None)
    values = (batch, batch * context_tokens, (), batch, 1, 0, batch)
    if spec is None:
        off = dep.cost.run_cost(Batch(batch, batch * context_tokens, (), batch)).first_s
        return {"spec_tokens_per_step": 1.0, "spec_decode_step_ms": off * 1e3, "spec_verify_step_ms": off * 1e3,
                "spec_draft_ms": 0.0, "spec_ms_per_token": off * 1e3,
                "spec_draft_weight_bytes_per_gpu": dep.memory.draft_weight_bytes_per_gpu}
    e = dep.limits.spec_tokens_per_step_milli / 1000
    off = spec.target.run_cost_values(values)[0]
    verify = spec.verify_values(values)[0]
    # the proposer: its GPU passes, or (ngram) its host scan of the contexts
    draft = spec.draft_s(batch, batch * context_tokens, ()) + spec.host_s(batch * context_tokens)
    return {"spec_tokens_per_step": e, "spec_decode_step_ms": off * 1e3, "spec_verify_step_ms": verify * 1e3,
            "spec_draft_ms": draft * 1e3, "spec_ms_per_token": (verify + draft) / e * 1e3,
            "spec_draft_weight_bytes_per_gpu": dep.memory.draft_weight_bytes_per_gpu}


def frontend_figures(dep: Deployment, context_tokens: int) -> dict[str, float | int]:
    """The per-request costs of a prompt of ``context_tokens`` (one chunk): the front end's
    seconds before the engine sees it (HTTP, tokenise; without queueing behind others) and
    after its first token (one chunk of one token), its per-token and per-chunk terms, and the
    engine's host work for scheduling it (``EngineProfile.prompt_cpu_s``), in ms."""
    eng = dep.cost.engine
    fe = Frontend.of(eng)
    tokens = np.array([context_tokens])
    return {
        "frontend_overlap": int(eng.frontend_overlap),
        "frontend_in_ms_at_context": float(fe.input_s(tokens)[0]) * 1e3 if fe else 0.0,
        "frontend_first_chunk_ms": float(fe.first_out_s(np.array([1]))[0]) * 1e3 if fe else 0.0,
        "frontend_per_output_token_ms": eng.frontend_per_output_token_s * 1e3,
        "frontend_chunk_ms": eng.frontend_chunk_s * 1e3,
        "prompt_host_ms_at_context": eng.prompt_cpu_s(1, context_tokens) * 1e3,
    }


def _tp_model(dep: Deployment) -> RooflineCostModel:
    """The cost model of one TP group: the replica's, or its first pipeline stage's."""
    stages = getattr(dep.cost, "stages", None)
    return stages[0] if stages else dep.cost


def node_figures(dep: Deployment, tokens: int) -> dict[str, float | int]:
    """The replica's placement on nodes (TP innermost, then PP, then DP: sim/spec/nodes.py),
    the inter-node link, and the two TP all-reduces of one layer for a step of ``tokens``
    tokens as the run charges them (custom kernel, NCCL or, across nodes, NCCL's multi-node ring or tree)."""
    links = dep.nodes
    if links is None:
        return {k: 0 for k in EXPLAIN_KEYS[EXPLAIN_KEYS.index("gpus_per_node"):]}
    cm = _tp_model(dep)
    ar = RooflineCostModel._per_tokens(cm, tokens)[1]
    return {
        "gpus_per_node": links.gpus_per_node,
        "nodes_per_replica": links.nodes(dep.tp * dep.pp * dep.dp),
        "inter_node_gb_per_s": links.inter_bytes_per_s / 1e9,
        "inter_node_latency_us": links.inter_latency_s * 1e6,
        "tp_allreduce_nodes": tp_nodes(links, dep.tp),
        "tp_allreduce_ms_per_layer": ar / cm.model.num_layers * 1e3,
        "pp_sends_between_nodes": sum(boundary_crosses(links, dep.tp, dep.pp)),
    }


def placement_lines(dep: Deployment) -> list[str]:
    """The placement and the link each collective uses, in words (``simsrv explain``)."""
    if dep.nodes is None:
        return []
    lines = describe(dep.nodes, dep.tp, dep.pp, dep.dp)
    for s, (bw, latency) in enumerate(getattr(dep.cost, "boundaries", ())):
        i = next(i for i, line in enumerate(lines) if line.startswith(f"PP send stage {s} -> "))
        lines[i] += f": {bw / 1e9:.4g} GB/s per GPU achieved, {latency * 1e6:.3g} us per send"
    return lines


def all2all_figures(dep: Deployment, tokens: int) -> dict[str, float | int]:
    """One MoE layer's all-to-all on one GPU for ``tokens`` tokens on its rank (ceil(tokens /
    tp) per GPU): dispatch and combine bytes it sends (sim/cost/all2all.py) and the seconds the
    run charges for both (0 without data-parallel ranks: no all-to-all)."""
    if dep.dp <= 1:
        return {"data_parallel_size": 1, "all2all_dispatch_bytes_per_layer_per_gpu": 0,
                "all2all_combine_bytes_per_layer_per_gpu": 0, "all2all_ms_per_layer": 0.0}
    cm = dep.cost
    di, dx, ci, cx = cm.all2all_layer_bytes(tokens)
    return {"data_parallel_size": dep.dp, "all2all_dispatch_bytes_per_layer_per_gpu": di + dx,
            "all2all_combine_bytes_per_layer_per_gpu": ci + cx, "all2all_ms_per_layer": cm.all2all_layer_s(tokens) * 1e3}


def breadth_figures(dep: Deployment, context_tokens: int) -> dict[str, float | int]:
    """Architecture, memory and parallelism figures (issue 11), each checkable by hand:
    one sequence's KV at the context (sliding-window layers hold at most the window), the
    driver memory and the part of it vLLM may use, the layers of the largest pipeline stage and
    the activations a stage sends per token (hidden states and residual, 1/tp per GPU), the
    experts each GPU holds under expert parallelism, vLLM's KV cache groups (sliding-window layers
    in their own) and the block ids one sequence holds at the context."""
    m, tp, pp = dep.model, dep.tp, dep.pp
    ep = getattr(dep.cost, "ep", 1)
    max_layers = max(dep.memory.stage_layers or (m.num_layers,))
    g = dep.memory.kv_groups
    return {
        "active_params": m.num_active_params,
        "gpu_memory_bytes": dep.gpu.cuda_total_bytes,
        "usable_memory_bytes": dep.memory.usable_bytes,
        # this GPU's heads of the largest stage's layers
        "kv_bytes_per_token_per_gpu": m.kv_bytes_per_token_per_gpu(tp, dep.kv_dtype_bytes) / m.num_layers * max_layers,
        "kv_bytes_per_seq_at_context": m.kv_bytes_for_context(context_tokens, dep.kv_dtype_bytes),
        "num_sliding_layers": m.num_sliding_layers if m.sliding_window else 0,
        "sliding_window_tokens": m.sliding_window or 0,
        "pipeline_parallel_size": pp,
        "max_layers_per_stage": max_layers,
        "pp_send_bytes_per_token_per_gpu": 2 * m.hidden_size * m.dtype_bytes / tp if pp > 1 else 0,
        "expert_parallel_size": ep,
        "experts_per_gpu": m.num_experts / ep if m.num_experts > 1 else 0,
        # vLLM's KV cache groups: a block id is one page of kv_layers_per_group layers
        "kv_full_groups": g.full,
        "kv_sliding_groups": g.sliding,
        "kv_layers_per_group": dep.memory.layers_per_group,
        "kv_blocks_per_seq_at_context": g.blocks(context_tokens, dep.memory.block_size),
    }


def scheduling_lines(s) -> list[str]:
    """How requests are ordered and admitted (``explain``'s text): the engine's scheduling policy
    (vLLM's --scheduling-policy) and the scenario's admission_control limits, if any."""
    if s.engine.scheduling_policy == "priority":
        lines = ["scheduling: priority (vLLM V1 --scheduling-policy priority): the waiting queue in (priority, "
                 "arrival) order, a lower value first; when KV blocks run out the running request with the "
                 "largest (priority, arrival) is preempted"]
    else:
        lines = ["scheduling: fcfs (vLLM's default): the waiting queue in arrival order; when KV blocks run out "
                 "the last admitted running request is preempted"]
    ac = s.admission_control
    if ac is None:
        lines.append("admission control: none (every request reaches the engines)")
        return lines
    for c in ac.limits:
        parts = []
        if c.token_bucket is not None:
            parts.append(f"token bucket {c.token_bucket.rate_per_s:g} req/s, burst {c.token_bucket.burst:,}")
        if c.max_concurrency is not None:
            parts.append(f"at most {c.max_concurrency:,} in the system")
        who = "all requests" if c.priority is None else f"priority {c.priority}"
        lines.append(f"admission control, {who}: " + "; ".join(parts) + " (over it: rejected, HTTP 429 in serve)")
    return lines
