"""``simsrv explain``: the roofline and memory arithmetic of a deployment, per GPU.

Why: users should be able to check the simulator's key figures by hand; these are the
numbers behind every step time (DESIGN.md section 4).
"""

from __future__ import annotations

from sim.deployment import Deployment
from sim.kv import blocks_for

EXPLAIN_KEYS = (
    "params", "weight_bytes_per_gpu", "kv_bytes_per_token", "kv_capacity_tokens",
    "max_seqs_at_context", "ridge_flops_per_byte", "prefill_intensity_flops_per_byte",
    "decode_intensity_flops_per_byte", "decode_step_floor_ms", "prefill_floor_ms",
) + (
    # issue 11: architecture, driver memory, pipeline and expert parallelism
    "active_params", "gpu_memory_bytes", "usable_memory_bytes", "kv_bytes_per_token_per_gpu",
    "kv_bytes_per_seq_at_context", "num_sliding_layers", "sliding_window_tokens", "pipeline_parallel_size",
    "max_layers_per_stage", "pp_send_bytes_per_token_per_gpu", "expert_parallel_size", "experts_per_gpu",
)


def explain(dep: Deployment, context_tokens: int, batch: int) -> dict[str, float | int]:
    m, g, tp = dep.model, dep.gpu, dep.tp
    n, b = context_tokens, batch
    weight_bytes = dep.memory.weight_bytes_per_gpu  # the most loaded pipeline stage's GPU
    kv_tok = m.kv_bytes_per_token(dep.kv_dtype_bytes)
    kv_tok_gpu = m.kv_bytes_per_token_per_gpu(tp, dep.kv_dtype_bytes)  # summed over stages
    # Forward-pass FLOPs per token: 2 per active weight (Kaplan et al. 2020, section 2.1), plus
    # attention QK^T and PV, 4 * L * H * d_head per (query, key) pair.
    attn_pair_flops = 4 * m.num_layers * m.num_heads * m.head_dim
    prefill_flops = 2 * m.num_active_params * n + attn_pair_flops * n * (n + 1) / 2  # causal
    prefill_bytes = m.num_params * m.dtype_bytes + n * kv_tok
    decode_flops = b * (2 * m.num_active_params + attn_pair_flops * n)
    # a decode step reads the weights its b tokens touch (all but the embedding table; for an
    # MoE only the experts routed to) plus every cached K and V of the batch
    read_bytes = m.params_read(b) * m.dtype_bytes
    decode_bytes = read_bytes + b * n * kv_tok
    decode_bytes_gpu = read_bytes / tp + b * n * kv_tok_gpu
    return {
        "params": m.num_params,
        "weight_bytes_per_gpu": weight_bytes,
        "kv_bytes_per_token": kv_tok,
        "kv_capacity_tokens": dep.memory.kv_capacity_tokens,
        "max_seqs_at_context": dep.memory.num_kv_blocks // blocks_for(n, dep.memory.block_size),
        "ridge_flops_per_byte": g.ridge_flops_per_byte,
        "prefill_intensity_flops_per_byte": prefill_flops / prefill_bytes,
        "decode_intensity_flops_per_byte": decode_flops / decode_bytes,
        "decode_step_floor_ms": decode_bytes_gpu / g.hbm_bw_bytes_per_s * 1e3,
        "prefill_floor_ms": prefill_flops / tp / g.bf16_flops_per_s * 1e3,
        **breadth_figures(dep, n),
    }


def breadth_figures(dep: Deployment, context_tokens: int) -> dict[str, float | int]:
    """Architecture, memory and parallelism figures (issue 11), each checkable by hand:
    one sequence's KV at the context (sliding-window layers hold at most the window), the
    driver memory and the part of it vLLM may use, the layers of the largest pipeline stage and
    the activations a stage sends per token (hidden states and residual, 1/tp per GPU), the
    experts each GPU holds under expert parallelism."""
    m, tp, pp = dep.model, dep.tp, dep.pp
    ep = getattr(dep.cost, "ep", 1)
    max_layers = max(dep.memory.stage_layers or (m.num_layers,))
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
    }
