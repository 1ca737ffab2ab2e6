"""Cost-model shapes of architectures beyond the Llama layout, and expert parallelism.

Why: kept apart from ``roofline.py`` (which calls these on its own instance, ``cm`` here) so the
generic roofline stays one concept: each function reads and sets the attributes named in its
docstring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.spec.model_spec import ModelSpec

if TYPE_CHECKING:  # (a type only: compiled, the model's fields are read natively through it)
    from sim.cost.roofline import RooflineCostModel


def arch_shapes(cm, m: ModelSpec, h: int, tp: int) -> None:
    """Shapes of architectures beyond the Llama layout (sim/spec/hf_config.py), and expert
    parallelism. A non-gated MLP has one up matrix. MoE experts have their own width and
    shared experts run on every token (Dai et al. 2024, "DeepSeekMoE"). MLA (DeepSeek-V2
    paper, section 2.1.2) replaces q/k/v by down-projections q_a, kv_a (replicated on every
    TP rank in vLLM) and up-projections q_b, kv_b (split by heads); its cache is the
    (kv_lora_rank + rope) latent, whole on every rank: kv_dim is half of it (K and V slots).
    With ``enable_expert_parallel`` (vLLM FusedMoE, EP size = TP size at data_parallel_size
    1) each rank holds E/ep whole experts instead of 1/tp of every expert. Its communication
    is the TP all-reduce already costed (``_allreduce_s``): after attention every rank holds
    every token, runs its own experts on the tokens routed to them and the partial outputs are
    summed by the layer's all-reduce, as without EP. vLLM uses dispatch/combine all-to-all
    kernels (DeepEP, pplx, allgather/reduce-scatter) only when data_parallel_size > 1
    (``FusedMoEParallelConfig.use_all2all_kernels``: ``dp_size > 1 and use_ep``), i.e. with
    data-parallel attention (``cluster.data_parallel_size``: EP size = DP x TP, the all-to-all
    costed by sim/cost/dp_ep.py and sim/cost/all2all.py).
    """
    up = 2 if m.mlp_gated else 1
    cm._up = (h, up * cm.mlp_dim)
    ep = cm.ep
    e_dim = (m.moe_intermediate_size or m.intermediate_size) / (1 if ep > 1 else tp)
    cm._eup, cm._edown = (h, up * e_dim), (e_dim, h)
    s_dim = m.shared_expert_intermediate_size / tp
    cm._shared = ((h, up * s_dim), (s_dim, h)) if s_dim else None
    if m.is_mla:
        qh = m.num_heads * m.head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank * qh / tp) if m.q_lora_rank else h * qh / tp
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * m.num_heads * (
            m.head_dim - m.qk_rope_head_dim + m.v_head_dim) / tp
        cm._qkv = (h, (q + kv) / h)
        cm._o = (m.num_heads * m.v_head_dim / tp, h)
        cm.kv_dim = (m.kv_lora_rank + m.qk_rope_head_dim) / 2
        mla_attention(cm, m, tp)
    # fraction of layers whose attention reads at most the window (sliding-window layers)
    cm._slide = (m.num_sliding_layers / m.num_layers, m.sliding_window) if m.sliding_window else None


def mla_attention(cm, m: ModelSpec, tp: int) -> None:
    """MLA attention as vLLM runs it (vllm/v1/attention/backends/mla/common.py, after the
    DeepSeek-V2 paper, section 2.1.3 and appendix C):

    - prefill decompresses K and V with kv_b_proj and runs multi-head attention with q/k
      heads of qk_nope + qk_rope (192) and v heads of v_head_dim (128): 2 * heads * (192 + 128)
      FLOPs per (query, key) pair, reading the decompressed K and V of every key token;
      cached context (a later chunk, a prefix hit) is first read as latent and up-projected
      (``_compute_prefill_context``): 2 * kv_lora_rank * heads * (qk_nope + v) FLOPs per
      context token per layer;
    - decode runs the absorbed form (W_UK folded into the query, W_UV after attention, both
      already in the q/o GEMM widths): each head attends over the latent, QK^T over
      kv_lora_rank + qk_rope (576) and PV over kv_lora_rank (512): 2 * heads * (576 + 512)
      FLOPs per pair; the cache read is the latent itself.
    Sets ``_prefill_pair_flops``, ``_decode_pair_flops``, ``_ctx_upproj_flops`` and
    ``_prefill_kv_bytes`` (per layer per GPU, heads / tp of them)."""
    heads = m.num_heads / tp
    nope, rope, lora, v = m.head_dim - m.qk_rope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank, m.v_head_dim
    cm._prefill_pair_flops = 2.0 * heads * ((nope + rope) + v)
    cm._decode_pair_flops = 2.0 * heads * ((lora + rope) + lora)
    cm._ctx_upproj_flops = 2.0 * lora * heads * (nope + v)
    cm._prefill_kv_bytes = heads * ((nope + rope) + v) * cm.dtype_bytes


def windowed_pairs(cm: RooflineCostModel, c: int, x: int) -> float:
    """Causal (query, key) pairs of a chunk of ``c`` new tokens after ``x`` cached ones,
    averaged over layers: on a sliding-window layer the query at position p attends
    min(p + 1, window) keys (FlashAttention's ``window_size`` skips the rest), elsewhere p + 1
    (Dao 2023). Exact sum of min(t, W) for t = x + 1 .. x + c. NOTE: the chunk's K/V bytes
    are still counted over all cached tokens (prefill attention is compute bound)."""
    # prefill_pairs(c, x) for int c and x, written here typed (compiled, sim/compiled_core.py,
    # native arithmetic; prefill_pairs also takes numpy arrays): the same operations in the same order
    full = c * (x + (c + 1) / 2.0)
    if cm._slide is None:
        return full
    frac, w = cm._slide
    a, b = x + 1, x + c
    if b <= w:
        win = full
    elif a > w:
        win = float(w) * c
    else:
        win = (a + w) * (w - a + 1) / 2.0 + float(w) * (b - w)
    return full * (1.0 - frac) + frac * win


def windowed_context(cm, num_seqs: int, context: float) -> float:
    """Decode context summed over sequences, averaged over layers: sliding-window layers
    read at most ``window`` tokens per sequence. NOTE: per-sequence context taken as the
    batch mean."""
    frac, w = cm._slide
    if not num_seqs:
        return context
    return context * (1.0 - frac) + frac * num_seqs * min(context / num_seqs, w)


def moe_mlp_s(cm, tokens: int, routed_tokens: int | None = None) -> tuple[float, float]:
    """(up, down) seconds of one MoE layer: each token runs top-k experts (FLOPs); the
    weights read are those of the experts touched, E * (1 - (1 - k/E)^T) in expectation
    under uniform routing (Jiang et al. 2024, "Mixtral of Experts"). Under expert
    parallelism the slowest rank holds E/ep experts and gets ``expert_load_imbalance``
    times the mean share k*T/ep of the routed tokens (the knob is max/mean rank load).
    ``routed_tokens``: the tokens whose routed experts span the EP group (data-parallel
    attention: every rank's, sim/cost/dp_ep.py); shared experts run on ``tokens``."""
    m = cm.model
    k, E = m.num_experts_per_tok, m.num_experts
    rt = tokens if routed_tokens is None else routed_tokens
    touched = E * (1.0 - (1.0 - k / E) ** rt)
    flop_mult = float(k)  # (a float of its own: k is an int; mypyc)
    if cm.ep > 1:
        touched, flop_mult = touched / cm.ep, k * cm.expert_load_imbalance / cm.ep
    up = cm._linear_s(rt, cm._eup, touched, flop_mult, name="up", expert=True)
    down = cm._linear_s(rt, cm._edown, touched, flop_mult, name="down", expert=True)
    if cm._shared is not None:
        up += cm._linear_s(tokens, cm._shared[0], name="up")
        down += cm._linear_s(tokens, cm._shared[1], name="down")
    return up, down
